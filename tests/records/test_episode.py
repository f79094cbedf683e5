"""`replay` runs its sessions untraced (no write's diff is worked out): on every bundled native environment, random
calls (most of them failing, so undone) give the results and final states of a traced episode running them."""

from __future__ import annotations

import random

from envfactory.env.environment import Environment
from envfactory.env.pool import EnvPool
from envfactory.records.episode import Episode, replay, result_of
from envfactory.records.models import ToolCall
from envfactory.tasks.offline import initial_states


def test_a_replay_gives_what_a_traced_episode_gives(pool: EnvPool) -> None:
    rng = random.Random(5)
    writes = 0
    for name in sorted(n for n in pool.names() if type(pool.get(n)) is Environment):
        env = pool.get(name)
        initial, _ = initial_states(pool, [name], rng.randrange(1000), 2)
        ids = [rid for v in initial[name].values() if isinstance(v, dict) for rid in v]
        for _ in range(8):
            calls = []
            for _ in range(rng.randint(1, 6)):
                tool = rng.choice(env.metadata.tools)
                args = {p: rng.choice([*ids, "x", 1, 2.5, True, "2026-03-01"]) for p in tool.parameters}
                calls.append(ToolCall(server=name, name=tool.name, arguments=args))
            traced = Episode(pool, initial)
            assert all(s.traced for s in traced.sessions.values())
            results = [result_of(c, traced.call(c.server, c.name, c.arguments)) for c in calls]
            writes += sum(not r.diff.empty for s in traced.sessions.values() for r in s.history)
            got = replay(pool, calls, initial)
            assert (got.results, got.final) == (results, traced.dumps()), name
    assert writes, "no call changed a state: the untraced path is not exercised"
