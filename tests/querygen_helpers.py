"""Shared set-up for QueryGen tests: a hotels chain, an LLM-written initial state, scripted answers, runs."""

from __future__ import annotations

import copy
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver

from envfactory.config import get_settings
from envfactory.env.pool import EnvPool
from envfactory.llm.scripted import ScriptedCall
from envfactory.records.models import PlannedCall
from envfactory.tasks.pi_star import solve_chain
from envfactory.toolgraph.sampler import ChainStep, InputSource, ToolChain
from graphs.querygen import QueryGenContext, QueryGenOutcome, run_querygen
from tests.envgen_helpers import setup_project

SEARCH, BOOK, CANCEL = "hotels.search_hotels", "hotels.book_room", "hotels.cancel_booking"


def hotels_chain() -> ToolChain:
    """search_hotels → book_room | cancel_booking, with input sources as the sampler writes them."""
    return ToolChain(
        tools=[SEARCH, BOOK, CANCEL],
        servers=["hotels"],
        turns=[[SEARCH, BOOK], [CANCEL]],
        seed=7,
        target_length=3,
        steps=[
            ChainStep(tool=SEARCH, inputs=[InputSource(parameter="city", required=True, source="user")]),
            ChainStep(
                tool=BOOK,
                inputs=[
                    InputSource(parameter="hotel_id", required=True, source="tool", tool=SEARCH, output="id", index=0),
                    InputSource(parameter="guest_name", required=True, source="user"),
                    InputSource(parameter="check_in", required=True, source="user"),
                    InputSource(parameter="nights", required=True, source="user"),
                ],
            ),
            ChainStep(
                tool=CANCEL,
                inputs=[
                    InputSource(parameter="booking_id", required=True, source="tool", tool=BOOK, output="id", index=1)
                ],
            ),
        ],
    )


def hotel(hid: str, name: str, city: str, stars: int, price: float, rooms: int) -> dict[str, Any]:
    return {"id": hid, "name": name, "city": city, "stars": stars, "price_per_night": price, "rooms_total": rooms}


# What schema_generate's model writes: Ana's Lisbon trip. The core records steer π*: it searches
# Lisbon and books Casa do Rio (HT-LIS-01); the guest, dates and nights are whatever π* binds (see
# `Plan`), and the turn 2 cancels the new booking BK-0002.
LLM_STATE: dict[str, Any] = {
    "clock": "2026-01-05T09:00:00",
    "counters": {"BK": 1},
    "hotels": {
        "HT-LIS-01": {**hotel("HT-LIS-01", "Casa do Rio", "Lisbon", 4, 120.0, 2), "amenities": ["wifi"]},
        "HT-LIS-02": hotel("HT-LIS-02", "Alfama Lodge", "Lisbon", 3, 85.0, 1),
        "HT-POR-01": hotel("HT-POR-01", "Ribeira Inn", "Porto", 3, 70.0, 3),
    },
    "bookings": {
        "BK-0001": {
            "id": "BK-0001",
            "hotel_id": "HT-POR-01",
            "guest_name": "Ana Costa",
            "check_in": "2026-02-10",
            "nights": 2,
            "total_price": 140.0,
            "status": "confirmed",
        }
    },
}
CORE = {"hotels": {"hotels": ["HT-LIS-01"], "bookings": ["BK-0001"]}}
SEED = 0


@dataclass
class Plan:
    """π*'s calls on LLM_STATE (seed 0): what the turns' raw tool calls are and the solver scripts use."""

    calls: list[PlannedCall]

    @property
    def search(self) -> dict[str, Any]:
        return self.calls[0].call.arguments

    @property
    def book(self) -> dict[str, Any]:
        return self.calls[1].call.arguments

    @property
    def wrong_book(self) -> dict[str, Any]:
        return {**self.book, "hotel_id": "HT-LIS-02"}

    @property
    def cancel(self) -> dict[str, Any]:
        return self.calls[2].call.arguments


def pi_star(pool: EnvPool) -> Plan:
    env = pool.get("hotels")
    loaded = {"hotels": env.dump_state(env.new_state(LLM_STATE))}
    outcome = solve_chain(pool, hotels_chain(), loaded, CORE, seed=SEED)
    assert outcome.ok, outcome.failure
    plan = Plan(outcome.planned)
    assert plan.search == {"city": "Lisbon"} and plan.book["hotel_id"] == "HT-LIS-01"
    assert plan.cancel == {"booking_id": "BK-0002"}
    return plan


def schema_answer(state: dict[str, Any] | None = None) -> str:
    return json.dumps({"states": {"hotels": state or LLM_STATE}, "core_ids": CORE})


def bad_state() -> dict[str, Any]:
    """A state that does not load: a hotel record with a field the model does not have."""
    state = copy.deepcopy(LLM_STATE)
    hotel_rec = state["hotels"]["HT-LIS-02"]
    hotel_rec["stars_count"] = hotel_rec.pop("stars")
    return state


PREPARE = json.dumps(
    {
        "profile": {
            "name": "Ana Costa",
            "background": "A designer from Porto planning a short work trip to Lisbon.",
            "preferences": ["central hotels", "4 stars"],
            "style": "brief and friendly",
        },
        "scenario": "Ana needs a hotel in Lisbon from 10 February for two nights, then her meeting is cancelled.",
        "turn_sizes": None,
        "user_tools": [],
    }
)


def prepare_answer(user_tools: list[str]) -> str:
    data = json.loads(PREPARE)
    data["user_tools"] = user_tools
    return json.dumps(data)


def generate_answers(p: Plan) -> list[str]:
    b = p.book
    return [
        json.dumps(
            {
                "subgoals": ["find hotels in Lisbon", f"book Casa do Rio for {b['guest_name']}"],
                "query": f"Hi! Please book {b['guest_name']} into Casa do Rio in Lisbon for {b['nights']} nights "
                f"from {b['check_in']}.",
                "user_intent": f"Book Casa do Rio for {b['guest_name']}, {b['nights']} nights from {b['check_in']}.",
            }
        ),
        json.dumps(
            {
                "subgoals": ["cancel the booking just made"],
                "query": "My meeting was cancelled, please cancel that booking.",
                "user_intent": "Cancel the Casa do Rio booking made in the previous turn.",
            }
        ),
    ]


def refine_answers(p: Plan) -> list[str]:
    b = p.book
    return [
        json.dumps(
            {
                "transformations": ["action_compression"],
                "query": f"Can you get {b['guest_name']} {b['nights']} nights at Casa do Rio from {b['check_in']}?",
                "user_intent": f"Book Casa do Rio for {b['guest_name']}, {b['nights']} nights from {b['check_in']}.",
            }
        ),
        json.dumps(
            {
                "transformations": ["implicit_reference"],
                "query": "Ugh, plans changed - scrap that reservation please.",
                "user_intent": "Cancel the Casa do Rio booking made in the previous turn.",
            }
        ),
    ]


def call(name: str, args: dict[str, Any], text: str = "") -> dict[str, Any]:
    """A scripted solver answer that calls one tool (with optional words before it)."""
    return {"content": text, "tool_calls": [{"name": name, "args": args}]}


def turn1_ok(p: Plan) -> list[Any]:
    return [call("search_hotels", p.search), call("book_room", p.book), "Booked Casa do Rio: BK-0002."]


def turn2_ok(p: Plan) -> list[Any]:
    return [call("cancel_booking", p.cancel), "Done: booking BK-0002 is cancelled."]


def base_script(p: Plan, extra: dict[str, list[Any]] | None = None) -> dict[str, list[Any]]:
    """Answers for every prompt of a 2-turn run; `extra` replaces or adds prompts' answers."""
    script: dict[str, list[Any]] = {
        "querygen/prepare": [PREPARE],
        "querygen/schema": [schema_answer()],
        "querygen/generate": generate_answers(p),
        "querygen/refine": refine_answers(p),
        "solver/solve": [*turn1_ok(p), *turn2_ok(p)],
    }
    script.update(extra or {})
    return script


def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: dict[str, list[Any]]) -> EnvPool:
    """A temporary project (the hotels env, the repo's prompts) whose models replay `script`."""
    setup_project(tmp_path, monkeypatch, script)
    return EnvPool(get_settings())


@contextmanager
def sqlite_saver(path: Path) -> Iterator[SqliteSaver]:
    """A real SQLite checkpointer on disk; a new connection (and saver) each time it is opened."""
    conn = sqlite3.connect(str(path), check_same_thread=False)
    try:
        yield SqliteSaver(conn)
    finally:
        conn.close()


def run(
    pool: EnvPool,
    db: Path,
    *,
    preset: str = "SFT_NON_CONV",
    thread: str = "conv-1",
    max_concurrency: int | None = 1,
    interrupt_before: list[str] | None = None,
    **overrides: Any,
) -> QueryGenOutcome:
    ctx = QueryGenContext(preset=preset, overrides={"pass_k": 1, **overrides})
    with sqlite_saver(db) as saver:
        return run_querygen(
            hotels_chain(),
            seed=SEED,
            conversation_id=thread,
            pool=pool,
            checkpointer=saver,
            thread_id=thread,
            context=ctx,
            max_concurrency=max_concurrency,
            interrupt_before=interrupt_before,
        )


def state_of(db: Path, thread: str = "conv-1") -> tuple[dict[str, Any], tuple[str, ...]]:
    """The thread's checkpointed values and next nodes, read through a fresh graph and connection."""
    from graphs.querygen import build

    with sqlite_saver(db) as saver:
        snap = build(saver).get_state({"configurable": {"thread_id": thread}})
        return dict(snap.values), tuple(snap.next)


def model_calls(prompt: str) -> list[ScriptedCall]:
    """Every call the scripted models received for `prompt`, in order (all roles share one replay)."""
    from envfactory_agents.common import _MODELS

    seen: dict[int, ScriptedCall] = {}
    for model in _MODELS.values():
        for c in getattr(model, "calls", []):
            if c.prompt == prompt:
                seen[c.index] = c
    return [seen[i] for i in sorted(seen)]


def text_of(c: ScriptedCall) -> str:
    return "\n".join(str(m.content) for m in c.messages)
