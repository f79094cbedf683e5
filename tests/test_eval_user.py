"""The simulated user of conversational tasks: a turn where the user answered the assistant's question is an
evaluation item too, and the model that asks gets the user's answer (what synth recorded), once, in order.

The run is synthesized with `ambiguity: 1.0`, so requests leave out what tells look-alike records apart and
the recorded conversation holds the assistant's question and the user's answer mid-turn. Played back as the
model (calls, the question, then — after the simulated user's answer — the rest), every such turn is solved;
a model that does not ask (its reply holds no question) gets no answer and leaves the turn unfinished.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.eval.agent import AgentLimits, SimulatedUser, run_agent
from envfactory.eval.items import EvalItem, items_from_conversations, load_conversations
from envfactory.eval.score import score_attempt
from envfactory.export.options import ExportOptions
from envfactory.export.rl import convert_to_rl_data
from envfactory.export.tools_schema import catalog_for
from envfactory.llm.scripted import ScriptedChatModel
from envfactory.records.models import Conversation
from envfactory.reward import CompositeReward
from envfactory.tasks.plan import SynthConfig
from envfactory.tasks.run import run_batch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pool() -> EnvPool:
    return EnvPool(Settings(root=ROOT, bfcl=False))


@pytest.fixture(scope="module")
def conversations(tmp_path_factory: pytest.TempPathFactory) -> list[Conversation]:
    out = tmp_path_factory.mktemp("eval-user") / "run"
    settings = Settings(root=ROOT, bfcl=False, data_dir=tmp_path_factory.mktemp("data"))
    config = {
        "envs": ["hotels", "banking", "shop", "restaurants"],
        "T": 3, "S": 1, "D": 2, "seed": 5, "ambiguity": 1.0, "out": out, "plot": False,
    }  # fmt: skip
    run_batch(SynthConfig.model_validate(config), settings, console=None)
    return load_conversations(out)


def recorded_play(conversation: Conversation, item: EvalItem, *, ask: bool = True) -> list[Any]:
    """The recorded turns as scripted replies: the calls made before each question, the question, then after
    the user's answer the rest of the calls and the closing answer (calls named as the item shows them)."""
    names = iter(item.ground_truth)
    script: list[Any] = []
    for turn in range(item.turn, item.turn + 1 + len(item.followups)):
        node = next(n for n in conversation.nodes if n.index == turn)
        pending: list[dict[str, Any]] = []
        said = [s for s in node.steps[1:] if s.role in ("tool_call", "assistant")]
        for step in said:
            if step.role == "tool_call":
                pending += [{"name": (c := next(names)).name, "args": dict(c.arguments)} for _ in step.calls()]
                continue
            if pending:
                script.append({"tool_calls": pending})
                pending = []
            text = str(step.content)
            script.append(text if ask or step is said[-1] else text.replace("?", "."))
    return script


def asking(items: list[EvalItem]) -> list[EvalItem]:
    return [i for i in items if any(i.user_knows)]


def test_clarifying_turns_are_items_with_what_the_user_knows(conversations: list[Conversation], pool: EnvPool) -> None:
    items = items_from_conversations(conversations, pool)
    catalog = catalog_for(pool, conversations)
    plain = sum(len(convert_to_rl_data(c, catalog, ExportOptions())) for c in conversations)
    clarifying = asking(items)
    assert clarifying and len(items) == plain + len(clarifying)  # RL data leaves them out; evaluation keeps them
    for item in clarifying:
        conversation = next(c for c in conversations if c.id == item.conversation_id)
        node = next(n for n in conversation.nodes if n.index == item.turn)
        assert item.user_knows == [[str(s.content) for s in node.steps if s.role == "user"][1:]]


def test_the_model_that_asks_gets_the_users_answer_and_solves_the_turn(
    conversations: list[Conversation], pool: EnvPool
) -> None:
    reward = CompositeReward(pool)
    by_id = {c.id: c for c in conversations}
    for item in asking(items_from_conversations(conversations, pool)):
        model = ScriptedChatModel(script=recorded_play(by_id[item.conversation_id], item))
        run = run_agent(model, pool, item, AgentLimits())
        score = score_attempt(pool, item, run, reward)
        assert score.success and score.reward is not None and score.reward.reward == pytest.approx(1.0), score.reasons
        said = [m["content"] for m in run.messages if m["role"] == "user"]
        assert said == item.user_knows[0]  # each piece once, after the question
        silent = run_agent(
            ScriptedChatModel(script=recorded_play(by_id[item.conversation_id], item, ask=False)),
            pool,
            item,
            AgentLimits(),
        )
        assert not [m for m in silent.messages if m["role"] == "user"]
        assert not score_attempt(pool, item, silent, reward).success  # no question, no answer: the turn stops short


def test_whole_conversations_with_questions_are_solved_by_asking(
    conversations: list[Conversation], pool: EnvPool
) -> None:
    reward = CompositeReward(pool)
    by_id = {c.id: c for c in conversations}
    whole = items_from_conversations(conversations, pool, "conversation")
    clarifying = asking(whole)
    assert clarifying
    for item in clarifying:
        assert len(item.user_knows) == 1 + len(item.followups)
        run = run_agent(ScriptedChatModel(script=recorded_play(by_id[item.id], item)), pool, item, AgentLimits())
        score = score_attempt(pool, item, run, reward)
        assert score.success, score.reasons
        said = [m["content"] for m in run.messages if m["role"] == "user"]
        assert [s for s in said if s not in item.followups] == [k for turn in item.user_knows for k in turn]


@given(
    knows=st.lists(st.lists(st.text(min_size=1, max_size=5), max_size=3), max_size=4),
    replies=st.lists(st.tuples(st.integers(0, 4), st.sampled_from(["Which one?", "Done.", "ok", "? "])), max_size=12),
)
def test_the_simulated_user_answers_only_questions_with_each_piece_once_in_order(
    knows: list[list[str]], replies: list[tuple[int, str]]
) -> None:
    user = SimulatedUser(knows)
    given_per_turn: dict[int, list[str]] = {}
    for turn, text in replies:
        answer = user.answer(turn, text)
        if "?" not in text:
            assert answer is None
        if answer is not None:
            given_per_turn.setdefault(turn, []).append(answer)
    for turn, answers in given_per_turn.items():
        assert answers == knows[turn][: len(answers)]  # a prefix: in order, none repeated or made up
    asked = {t: sum(1 for tt, x in replies if tt == t and "?" in x) for t in range(len(knows))}
    for turn, pieces in enumerate(knows):
        assert len(given_per_turn.get(turn, [])) == min(asked[turn], len(pieces))
