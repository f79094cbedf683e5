"""Trajectory and task models: what a synthesized conversation is, at every boundary (JSONL, export).

A conversation is a list of nodes (turns). Each node holds the user's `query`, the `steps` of the
turn (user / assistant messages, tool calls, tool results), the environments it touches
(`mcp_servers`), the state before and after it (`initial_scenario`, `final_scenario`: environment →
state dump) and the chain's calls for that turn with their bound arguments (`raw_tool_call`), which
the query was written from. Field names follow the EnvFactory reference (section 3.5), so its RL
record (`reward_model.ground_truth`, `extra_info.mcp_factory_kwargs`) is a projection of a node.

A task T = (x, v, Db⁰, π*) — SynthAPI's definition — is kept beside the conversation: instruction,
state verifier, initial database, privileged solver plan.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Generator = Literal["template", "llm"]
StepRole = Literal["user", "assistant", "tool_call", "tool_result"]
States = dict[str, dict[str, Any]]  # environment name → state dump


class ToolCall(BaseModel):
    """One tool call: which environment, which tool, which arguments.

    `masked_arguments` names arguments whose exact value does not matter for matching (a free-text
    message, a generated name): a reward compares every other argument.
    """

    model_config = ConfigDict(extra="forbid")

    server: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    masked_arguments: list[str] = Field(default_factory=list)
    id: str | None = None

    @property
    def qualified(self) -> str:
        return f"{self.server}.{self.name}"


class ToolResult(BaseModel):
    """What a tool call returned: the payload an agent saw (a result, or `{"error": {...}}`)."""

    model_config = ConfigDict(extra="forbid")

    server: str
    name: str
    ok: bool
    result: Any = None
    call_id: str | None = None


class Step(BaseModel):
    """One step of a turn. `content`: text for user/assistant, calls for tool_call, results for tool_result."""

    model_config = ConfigDict(extra="forbid")

    role: StepRole
    content: str | list[ToolCall] | list[ToolResult]
    thinking: str | None = Field(default=None, description="a <think> trace, when the model gave one")

    def calls(self) -> list[ToolCall]:
        return [c for c in self.content if isinstance(c, ToolCall)] if isinstance(self.content, list) else []

    def results(self) -> list[ToolResult]:
        return [r for r in self.content if isinstance(r, ToolResult)] if isinstance(self.content, list) else []


class UserToolCall(BaseModel):
    """A tool the *user* performed (a user-side action, conversational variant), after step `after_step`.

    Not the assistant's to learn, but part of the turn's dynamics: replaying the assistant's calls
    alone does not reach `final_scenario` when a turn has these; replay them in order too."""

    model_config = ConfigDict(extra="forbid")

    after_step: int
    call: ToolCall
    result: ToolResult


class Node(BaseModel):
    """One turn of a conversation."""

    model_config = ConfigDict(extra="forbid")

    index: int
    query: str
    user_intent: str = ""
    steps: list[Step] = Field(default_factory=list)
    mcp_servers: list[str]
    initial_scenario: States
    final_scenario: States
    raw_tool_call: list[ToolCall] = Field(default_factory=list, description="the chain's calls for this turn")
    generator: Generator = "template"
    refined: bool = False
    original_query: str | None = Field(default=None, description="the query before refinement")
    user_calls: list[UserToolCall] = Field(default_factory=list)

    def tool_calls(self) -> list[ToolCall]:
        return [c for s in self.steps if s.role == "tool_call" for c in s.calls()]


# ---- the task T = (x, v, Db⁰, π*) -------------------------------------------------------------


class Binding(BaseModel):
    """How the privileged solver chose one argument value.

    `state`: read from a record of the initial state (`path`, e.g. `hotels.HT-01.city`);
    `output`: taken from an earlier call's result (`call`, `path` inside its result, e.g. `[0].id`);
    `generated`: made up from the parameter's schema (a new guest's name, a future date);
    `repeated`: a value the user already gave earlier in the chain (`call` says where).
    """

    model_config = ConfigDict(extra="forbid")

    parameter: str
    source: Literal["state", "output", "generated", "repeated"]
    value: Any = None
    path: str | None = None
    call: int | None = None


class PlannedCall(BaseModel):
    """One call of π*: the concrete call and how each argument was bound."""

    model_config = ConfigDict(extra="forbid")

    call: ToolCall
    bindings: list[Binding] = Field(default_factory=list)
    kind: Literal["read", "write"] = "read"


class Assertion(BaseModel):
    """A per-task check beside state equivalence.

    `state_equals`: the value at `path` of environment `server`'s final state equals `value`;
    `state_absent`: nothing is at `path`; `answer_contains`: the final answer states `value` (as a whole word or
    number; numbers also match with the usual roundings), in at most `max_chars` characters when set.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["state_equals", "state_absent", "answer_contains"]
    server: str | None = None
    path: str | None = None
    value: Any = None
    max_chars: int | None = Field(default=None, ge=1)


class MaskSpec(BaseModel):
    """Volatile parts of a state that equivalence ignores.

    `generated_ids`: records created during the episode are compared without their ids (as a multiset
    per collection), and references to those ids anywhere in the state are masked too.
    `paths`: glob patterns over dotted paths (`*.created_at`, `clock`).
    """

    model_config = ConfigDict(extra="forbid")

    generated_ids: bool = True
    paths: list[str] = Field(default_factory=list)


class StateVerifier(BaseModel):
    """v: the goal states (one per environment), what to mask, and extra assertions."""

    model_config = ConfigDict(extra="forbid")

    goal: States
    mask: MaskSpec = Field(default_factory=MaskSpec)
    assertions: list[Assertion] = Field(default_factory=list)
    check_state: bool = Field(default=True, description="compare final states with the goal")


class Task(BaseModel):
    """T = (x, v, Db⁰, π*): instruction, verifier, initial databases, privileged solver plan."""

    model_config = ConfigDict(extra="forbid")

    id: str
    instruction: str
    servers: list[str]
    initial_state: States
    verifier: StateVerifier
    solver: list[PlannedCall]


class Verdict(BaseModel):
    """The outcome of running a verifier: ok, and in words what differs — `reasons` for logs and trainers,
    `public` the same without an expected value (what an agent may be told: `complete_task`'s answer)."""

    ok: bool
    reasons: list[str] = Field(default_factory=list)
    public: list[str] = Field(default_factory=list)


# ---- a finished conversation ---------------------------------------------------------------------


class Provenance(BaseModel):
    """Where a record came from, so a dataset can be filtered and reproduced."""

    model_config = ConfigDict(extra="forbid")

    generator: Generator
    preset: str | None = None
    seed: int
    chain_seed: int | None = None
    state_variant: int = 0  # s in 0..S-1
    depth: int = 1  # D: 1 core batch + D-1 distractor batches
    models: dict[str, str] = Field(default_factory=dict)  # role → model name (LLM path)
    envfactory_version: str = "0.1.0"


class Conversation(BaseModel):
    """A synthesized multi-turn conversation with its verified task."""

    model_config = ConfigDict(extra="forbid")

    id: str
    servers: list[str]
    tools: list[str]  # the sampled chain, "env.tool"
    profile: dict[str, Any] = Field(default_factory=dict)
    nodes: list[Node]
    task: Task
    provenance: Provenance

    @model_validator(mode="after")
    def _one_node_an_index(self) -> Conversation:
        indices = [n.index for n in self.nodes]
        if len(set(indices)) != len(indices):  # turns are named by their index (an evaluation's items, a replay)
            twice = sorted({i for i in indices if indices.count(i) > 1})
            raise ValueError(f"conversation {self.id}: turn index {twice[0]} is given to two turns")
        return self

    @property
    def generator(self) -> Generator:
        return self.provenance.generator
