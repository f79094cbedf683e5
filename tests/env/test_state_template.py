"""`StateTemplate`: on every bundled native environment a session forked from a template is a session forked from
the dump's JSON; an episode forks from one only for the very config it was validated from; a tool that changes a
shared record in place shows as a template no longer intact."""

from __future__ import annotations

import copy
import random

from pydantic_core import to_json

from envfactory.env.environment import Environment
from envfactory.env.pool import EnvPool
from envfactory.env.session import Session
from envfactory.env.state_template import StateTemplate, templates_of
from envfactory.records.episode import Episode, replay
from envfactory.records.models import ToolCall
from envfactory.tasks.offline import initial_states


def _native(pool: EnvPool) -> list[str]:
    return sorted(n for n in pool.names() if type(pool.get(n)) is Environment)


def test_a_template_forks_what_the_dumps_json_validates_to(pool: EnvPool) -> None:
    for name in _native(pool):
        initial, _ = initial_states(pool, [name], 3, 2)
        env, config = pool.get(name), initial[name]
        template = StateTemplate.of(env, config)
        assert template is not None, name
        fresh = env.new_state(config)
        assert template.dump == env.dump_state(fresh) and template.text == to_json(env.dump_state(fresh))
        fork = template.fork()
        assert fork is not template.state and env.dump_state(fork) == template.dump
        assert template.intact()


def test_an_episode_forks_from_a_template_only_for_its_very_config(pool: EnvPool) -> None:
    names = _native(pool)[:3]
    initial, _ = initial_states(pool, names, 5, 2)
    templates = templates_of(pool, initial)
    assert set(templates) == set(names)
    same = Episode(pool, initial, templates=templates)
    assert same.forked == templates
    equal = Episode(pool, copy.deepcopy(initial), templates=templates)  # equal, not the same: from JSON
    assert equal.forked == {}
    assert same.dumps() == equal.dumps() == {n: templates[n].dump for n in names}
    again = same.start(names[0], copy.deepcopy(initial[names[0]]))  # restarted from another config
    assert names[0] not in same.forked and again.dump() == templates[names[0]].dump


def test_replays_from_a_template_are_replays_from_json_and_leave_it_intact(pool: EnvPool) -> None:
    """Random calls on every native environment (most fail, and are undone): the same results and final states
    either way, and the template unchanged (no bundled tool changes a record in place)."""
    rng = random.Random(7)
    for name in _native(pool):
        initial, _ = initial_states(pool, [name], 9, 2)
        templates = templates_of(pool, initial)
        env = pool.get(name)
        ids = [rid for v in initial[name].values() if isinstance(v, dict) for rid in v]
        for _ in range(5):
            calls = []
            for _ in range(rng.randint(1, 6)):
                tool = rng.choice(env.metadata.tools)
                args = {p: rng.choice([*ids, "x", 1, 2.5, True]) for p in tool.parameters}
                calls.append(ToolCall(server=name, name=tool.name, arguments=args))
            assert replay(pool, calls, initial, templates=templates) == replay(pool, calls, initial), name
        assert templates[name].intact(), name


def test_a_record_changed_in_place_breaks_the_template(pool: EnvPool) -> None:
    name = "hotels"
    initial, _ = initial_states(pool, [name], 1, 1)
    template = StateTemplate.of(pool.get(name), initial[name])
    assert template is not None
    session = Session(pool.get(name), template.fork())
    record = next(iter(session.state.hotels.values()))
    record.amenities.append("a tool's own list append")  # what no tool may do: the template shares the list
    assert not template.intact()
