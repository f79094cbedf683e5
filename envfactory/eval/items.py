"""What an evaluation runs on: one item per verified turn, in the per-turn mode (as BFCL does).

An item is a turn of a verified conversation as its RL record has it: the prompt (the ground-truth
conversation so far, then the turn's request), the tools shown, the state before the turn, the state
the ground truth reaches, and the ground truth's calls. Items come from a synth run's folder, or any
JSONL file of conversations (`conversations.jsonl`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.export import files as export_files
from envfactory.export.errors import ExportError
from envfactory.export.files import Split
from envfactory.export.options import ExportOptions
from envfactory.export.rl import GroundTruthCall, RLSample, convert_to_rl_data
from envfactory.export.tools_schema import Catalog, catalog_from_pool, conversation_servers
from envfactory.records.models import Conversation, Node, States

Kind = Literal["read", "write", "mixed", "none"]


class EvalSourceError(EnvFactoryError):
    """The evaluation's input cannot be read (the message names the file and the line)."""


class EvalItem(BaseModel):
    """One turn to solve: its prompt and tools, the state before it, and the ground truth's outcome."""

    id: str  # "<conversation id>/t<turn>"
    conversation_id: str
    turn: int
    prompt: list[dict[str, Any]]  # OpenAI-style messages
    tools: list[dict[str, Any]]  # OpenAI-style function specs
    servers: list[str]
    initial: States
    expected: States
    ground_truth: list[GroundTruthCall]
    kind: Kind
    followups: list[str] = Field(
        default_factory=list, description="whole-conversation mode: the later turns' requests, in order"
    )
    user_knows: list[list[str]] = Field(
        default_factory=list,
        description="per turn of the item (the request's, then each follow-up's): what the simulated user "
        "answers, in order, when the model stops to ask (the recorded clarifications)",
    )

    @property
    def env(self) -> str:
        """The environment the turn is about (its first), for the per-environment breakdown."""
        return self.servers[0] if self.servers else "none"


def _kind(calls: list[GroundTruthCall], writes: set[tuple[str, str]]) -> Kind:
    if not calls:
        return "none"
    w = sum((c.server, c.tool) in writes for c in calls)
    return "write" if w == len(calls) else "read" if w == 0 else "mixed"


def item_of(sample: RLSample, writes: set[tuple[str, str]], user_knows: list[str] | None = None) -> EvalItem:
    kwargs = sample.extra_info.mcp_factory_kwargs
    calls = [GroundTruthCall.model_validate(c) for c in json.loads(sample.reward_model.ground_truth)]
    return EvalItem(
        id=f"{sample.extra_info.conversation_id}/t{sample.extra_info.turn}",
        conversation_id=sample.extra_info.conversation_id,
        turn=sample.extra_info.turn,
        prompt=[m.wire() for m in sample.prompt],
        tools=json.loads(sample.extra_info.tools),
        servers=json.loads(kwargs.mcp_servers),
        initial=json.loads(kwargs.initial_config),
        expected=json.loads(kwargs.final_config),
        ground_truth=calls,
        kind=_kind(calls, writes),
        user_knows=[list(user_knows or [])],
    )


def clarifications(node: Node) -> list[str] | None:
    """What the user said in a turn after its request (the answers to the assistant's questions), or None
    when the user acted in the environment mid-turn (a simulated user only talks, so that turn is left out)."""
    if node.user_calls:
        return None
    said = [s.content for s in node.steps if s.role == "user" and isinstance(s.content, str)]
    return said[1:]


def items_from_conversations(
    conversations: list[Conversation], pool: EnvPool, mode: Literal["turn", "conversation"] = "turn"
) -> list[EvalItem]:
    """The items to evaluate. `turn`: every valid turn of every conversation — a turn where the user answered
    a question of the assistant's is kept, with what the user said as the simulated user's knowledge; a turn
    where the user acted in an environment is left out (a simulated user only talks). `conversation`: one
    item per conversation — its first request, then each later request after the model's own answer, judged
    on the state after the last turn; a conversation is kept up to its first turn that is not a valid item."""
    servers = list(dict.fromkeys(s for c in conversations for s in conversation_servers(c)))
    catalog = catalog_from_pool(pool, servers)
    writes = {(s, t.name) for s in servers for t in catalog[s].tools if t.kind == "write"}
    per_conversation = [_items(c, catalog, writes) for c in conversations]
    if mode == "turn":
        return [item for items in per_conversation for item in items]
    return [whole for items in per_conversation if (whole := _whole(items, writes)) is not None]


def _items(conversation: Conversation, catalog: Catalog, writes: set[tuple[str, str]]) -> list[EvalItem]:
    """A conversation's turns as items, clarifying turns too (the simulated user answers the model's question)."""
    nodes = {n.index: n for n in conversation.nodes}
    out = []
    for sample in convert_to_rl_data(conversation, catalog, ExportOptions(include_interactive=True)):
        knows = clarifications(nodes[sample.extra_info.turn])
        if knows is not None:
            out.append(item_of(sample, writes, knows))
    return out


def _whole(turns: list[EvalItem], writes: set[tuple[str, str]]) -> EvalItem | None:
    """A conversation's turns 0, 1, ... (up to the first missing one) as one item."""
    consecutive = turns[: next((n for n, t in enumerate(turns) if t.turn != n), len(turns))]
    if not consecutive:
        return None
    initial: States = {}
    expected: States = {}
    for t in consecutive:  # an environment starts as the first turn touching it found it, ends as the last left it
        for server, state in t.initial.items():
            initial.setdefault(server, state)
        expected.update(t.expected)
    calls = [c for t in consecutive for c in t.ground_truth]
    return consecutive[0].model_copy(
        update={
            "id": consecutive[0].conversation_id,
            "initial": initial,
            "expected": expected,
            "servers": list(dict.fromkeys(s for t in consecutive for s in t.servers)),
            "ground_truth": calls,
            "kind": _kind(calls, writes),
            "followups": [str(t.prompt[-1].get("content", "")) for t in consecutive[1:]],
            "user_knows": [knows for t in consecutive for knows in t.user_knows],
        }
    )


def load_conversations(source: Path, split: Split = "train") -> list[Conversation]:
    """Conversations of one split of a synth run's folder (`conversations.jsonl` for "train",
    `heldout.jsonl` for "heldout"), or of a JSONL file of them."""
    try:
        return export_files.load_conversations(source, split)
    except ExportError as e:
        raise EvalSourceError(str(e)) from None
