"""The round-trip invariant of the environment contract: `fork(dump(s))` behaves exactly like `s`.

BFCL: every ground-truth turn of every multi_turn_base entry, with a round trip at each turn
boundary: the forked session must give the same dump, and the same results and states for every
later call as the session that was never dumped. Native environments: seeded random call
sequences, with arguments drawn as an agent would (ids from the state and from earlier results,
other values from the schema), and round trips inserted at random points.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from envfactory.env.pool import EnvPool
from envfactory.env.session import CallRecord, Session
from envfactory.envgen.checks import schema_checks
from envfactory.suites import bfcl

ENTRIES = bfcl.load_entries("multi_turn_base") if bfcl.available() else []


def _same(a: CallRecord, b: CallRecord) -> tuple[Any, ...]:
    return (a.ok, a.result, a.error.type if a.error else None, a.diff.sorted()), (
        b.ok,
        b.result,
        b.error.type if b.error else None,
        b.diff.sorted(),
    )


@pytest.mark.skipif(not ENTRIES, reason="bfcl-eval is not installed")
def test_every_bfcl_turn_boundary_survives_a_round_trip() -> None:
    boundaries = 0
    for entry in ENTRIES:
        classes = [c for c in entry.involved_classes if bfcl.class_importable(c)]
        live = {c: Session.fork(bfcl.environment(c), entry.config_for(c)) for c in classes}
        for turn_no, _turn in enumerate(entry.ground_truth):
            # a round trip here: every later call must not tell the forked sessions from the live ones
            forked = {c: Session.fork(s.env, s.dump()) for c, s in live.items()}
            for c in classes:
                assert forked[c].dump() == live[c].dump(), f"{entry.id} turn {turn_no}: {c} dump changed"
                boundaries += 1
            for later in entry.ground_truth[turn_no:]:
                for text in later:
                    call = bfcl.parse_call(text)
                    owner = bfcl.route(call.name, entry.involved_classes)
                    if owner not in live:
                        continue
                    args = live[owner].env.call_arguments(call)
                    a, b = _same(live[owner].call(call.name, args), forked[owner].call(call.name, args))
                    assert a == b, f"{entry.id} turn {turn_no}: {text} differs after a round trip: {a} vs {b}"
                for c in classes:
                    assert forked[c].dump() == live[c].dump(), f"{entry.id} turn {turn_no}: {c} state diverged"
            # the live sessions ran the rest of the entry: start the next boundary from a fresh replay
            live = {c: Session.fork(bfcl.environment(c), entry.config_for(c)) for c in classes}
            for earlier in entry.ground_truth[: turn_no + 1]:
                for text in earlier:
                    call = bfcl.parse_call(text)
                    owner = bfcl.route(call.name, entry.involved_classes)
                    if owner in live:
                        live[owner].call(call.name, live[owner].env.call_arguments(call))
    assert boundaries > 1000


def _agent_calls(env: Any, session: Session, rng: random.Random, n: int) -> list[tuple[str, dict[str, Any]]]:
    """Calls an agent might make: the schema's own checks (valid and invalid arguments) on ids of the
    current state, shuffled and sampled."""
    calls = [(step.tool, step.args) for s in schema_checks(env.metadata, session.dump()) for step in s.steps]
    rng.shuffle(calls)
    return calls[:n]


@pytest.mark.parametrize("seed", range(3))
def test_native_environments_survive_round_trips_at_random_points(pool: EnvPool, seed: int) -> None:
    for name in pool.native_names():
        env = pool.get(name)
        for scenario in env.scenario_names():
            rng = random.Random(f"{name}/{scenario}/{seed}")
            plain = Session.fork(env, scenario)
            tripped = Session.fork(env, scenario)
            for i, (tool, args) in enumerate(_agent_calls(env, plain, rng, 40)):
                if rng.random() < 0.3:  # a round trip at a random point: dump, fork a new session from it
                    tripped = Session.fork(env, tripped.dump())
                a, b = _same(plain.call(tool, args), tripped.call(tool, args))
                assert a == b, f"{name}/{scenario} seed {seed} call {i} {tool}({args}): {a} vs {b}"
                assert plain.dump() == tripped.dump(), f"{name}/{scenario} seed {seed} after call {i} ({tool})"
