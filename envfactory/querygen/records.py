"""QueryGen's configuration (presets) and the records its agents pass around.

Presets follow the EnvFactory reference (section 3.4, the released `preset_config.py`):
`SFT_NON_CONV` refines queries and filters trajectories without a simulated user, `SFT_CONV` adds the
simulated user (clarifications, user-side tools), `RL_NON_CONV` filters but does not refine.
`QueryGenConfig` defaults: pass_k 4, max_solve_iterations 8.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envfactory.config import QUERYGEN_ROLES, Settings
from envfactory.errors import EnvFactoryError, first_error
from envfactory.records.models import PlannedCall, States, Step, ToolCall, ToolResult


class QueryGenError(EnvFactoryError):
    """A QueryGen run cannot start: an unknown preset, a bad override, a malformed chain."""


class QueryGenConfig(BaseModel):
    """How one chain becomes a conversation. `enable_user_tool_use` only acts with `enable_user_interaction`."""

    model_config = ConfigDict(extra="forbid")

    preset: str = "custom"
    pass_k: int = Field(default=4, ge=1, le=32, description="solver branches per turn (Send fan-out)")
    max_solve_iterations: int = Field(default=8, ge=1, description="model steps per branch and turn")
    enable_query_refinement: bool = False
    enable_user_interaction: bool = False
    enable_user_tool_use: bool = False
    enable_filtering: bool = True
    llm_turn_split: bool = Field(default=False, description="let prepare re-split the chain into turns")
    max_turn_tools: int = Field(default=5, ge=1, description="most tools in one turn of an LLM split")
    max_user_replies: int = Field(default=3, ge=0, description="simulated-user answers per branch and turn")
    max_user_tool_rounds: int = Field(default=3, ge=1, description="tool rounds of the simulated user per answer")
    schema_retries: int | None = Field(
        default=None, ge=0, description="re-asks of schema_generate; None: settings.structured_retries"
    )

    @property
    def user_tools_on(self) -> bool:
        return self.enable_user_interaction and self.enable_user_tool_use


PRESETS: dict[str, QueryGenConfig] = {
    "SFT_NON_CONV": QueryGenConfig(preset="SFT_NON_CONV", enable_query_refinement=True, enable_filtering=True),
    "SFT_CONV": QueryGenConfig(
        preset="SFT_CONV",
        enable_query_refinement=True,
        enable_user_interaction=True,
        enable_user_tool_use=True,
        enable_filtering=True,
    ),
    "RL_NON_CONV": QueryGenConfig(preset="RL_NON_CONV", enable_query_refinement=False, enable_filtering=True),
}


def preset_config(preset: str, overrides: dict[str, Any] | None = None) -> QueryGenConfig:
    """A preset with `overrides` laid over it (validated); QueryGenError names what is wrong."""
    if preset not in PRESETS:
        raise QueryGenError(f"unknown QueryGen preset '{preset}' (known: {', '.join(PRESETS)})")
    data = {**PRESETS[preset].model_dump(), **(overrides or {})}
    data["preset"] = preset
    try:
        return QueryGenConfig.model_validate(data)
    except ValidationError as e:
        loc, msg = first_error(e, "(config)")
        raise QueryGenError(f"QueryGen override '{loc}': {msg}") from None


QUERY_ROLE, SOLVER_ROLE, USER_ROLE = QUERYGEN_ROLES  # the roles' names live once, in config


def model_names(settings: Settings) -> dict[str, str]:
    """role → the model that played it, for a conversation's provenance."""
    out: dict[str, str] = {}
    for role in QUERYGEN_ROLES:
        cfg = settings.llm_for(role)
        if cfg.provider == "scripted":
            out[role] = f"scripted:{cfg.script.name if cfg.script else '?'}"
        elif cfg.provider == "local":
            out[role] = f"local:{cfg.gguf_path.name if cfg.gguf_path else '?'}"
        else:
            out[role] = cfg.model
    return out


# ---- records ------------------------------------------------------------------------------------


class UserProfile(BaseModel):
    name: str = Field(min_length=1)
    background: str = ""
    preferences: list[str] = Field(default_factory=list)
    style: str = Field(default="", description="how this user writes: terse, chatty, formal, ...")


class Preparation(BaseModel):
    """prepare's answer: who the user is, what they are doing, and (optionally) how to split and who acts."""

    profile: UserProfile
    scenario: str = Field(min_length=1)
    turn_sizes: list[int] | None = Field(default=None, description="consecutive turn lengths, summing to the chain")
    user_tools: list[str] = Field(default_factory=list, description="chain tools only the user can perform")


class TurnDraft(BaseModel):
    """One turn's request before solving: the query (refined or not), its original, the goal to reach."""

    turn: int
    subgoals: list[str] = Field(default_factory=list)
    query: str
    user_intent: str
    original_query: str
    original_intent: str
    refined: bool = False
    transformations: list[str] = Field(default_factory=list)
    expected: States  # the state the turn must reach, from the turn's initial state
    read_only: bool
    fact: tuple[str, Any] | None = None  # what π*'s last read returned, for a read-only turn
    answer_required: bool = False  # the last turn of a chain of reads: the answer must report `fact`


class UserCall(BaseModel):
    """A call the simulated user performed (a user-side tool), after step `step` of the branch."""

    step: int
    call: ToolCall
    result: ToolResult


class SolveTask(BaseModel):
    """Everything one solver branch needs (the Send payload): it sees nothing else of the graph state."""

    turn: int
    branch: int
    seed: int
    config: QueryGenConfig
    query: str
    user_intent: str
    profile: dict[str, Any] = Field(default_factory=dict)
    scenario: str = ""
    servers: list[str]
    initial: States
    expected: States
    read_only: bool
    raw_calls: list[PlannedCall]
    history: list[dict[str, Any]] = Field(default_factory=list)  # earlier Node dumps
    user_tools: list[str] = Field(default_factory=list)


class Branch(BaseModel):
    """What one solver branch did: its steps (the user's query first), final states and answer."""

    turn: int
    branch: int
    steps: list[Step]
    final: States
    answer: str = ""
    user_calls: list[UserCall] = Field(default_factory=list)
    iterations: int = 0
    questions: int = 0
    error: str | None = None

    def calls(self) -> list[tuple[ToolCall, ToolResult]]:
        """The assistant's calls with their results, in order."""
        return step_calls(self.steps)


def step_calls(steps: list[Step]) -> list[tuple[ToolCall, ToolResult]]:
    """Each call of the tool_call steps with its result from the tool_result step after it."""
    out: list[tuple[ToolCall, ToolResult]] = []
    pending: list[ToolCall] = []
    for step in steps:
        if step.role == "tool_call":
            pending = step.calls()
        elif step.role == "tool_result":
            out.extend(zip(pending, step.results(), strict=False))
            pending = []
    return out
