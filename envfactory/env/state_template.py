"""A native state validated once from a dump, which sessions fork from sharing its records.

Validating a dump again for every session forked from it costs 60–280 µs a fork here, and offline synthesis
forks from one unit's initial state some seven times (π* solves the chain from it again for each candidate
joined and each retry, and the first turn and the whole conversation are replayed from it).
`State.fork_sharing_records` gives an equal, independent state in ~10 µs. The two stay apart as long as tools
write through the state's CRUD helpers, which replace a record and never change one in place: the contract a
session's diff and rollback rest on. `intact` tells whether a tool broke it (the template no longer dumps to
what it was validated to); a caller that finds it broken does its work again with sessions forked from JSON.
The reward forks its replays the same way (`reward.scorer`, which checks its templates every 64th fork).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic_core import to_json

from envfactory.env.environment import BaseEnvironment, Environment
from envfactory.env.pool import EnvPool
from envfactory.env.state import State
from envfactory.env.state_fields import FieldWise


@dataclass(frozen=True)
class StateTemplate:
    """`state`, validated from `config` (forks are for that very object), and its dump then (read-only)."""

    env: Environment
    config: dict[str, Any]
    state: State
    dump: dict[str, Any]
    text: bytes  # the dump's JSON

    @staticmethod
    def of(env: BaseEnvironment, config: dict[str, Any]) -> StateTemplate | None:
        """A template of `config`; None for anything but a native environment whose state model is plain data
        (`FieldWise`: no validator or post-init of its own that a shared record could slip past). Raises
        `ScenarioError` for a config that does not fit."""
        if type(env) is not Environment or FieldWise.of(env.state_model) is None:
            return None
        state = env.new_state(config)
        dump = env.dump_state(state)
        return StateTemplate(env, config, state, dump, to_json(dump))

    def fork(self) -> State:
        return self.state.fork_sharing_records()

    def intact(self) -> bool:
        """Whether the template still dumps to what it was validated to (no tool changed a record in place)."""
        return to_json(self.env.dump_state(self.state)) == self.text


StateTemplates = Mapping[str, StateTemplate]  # server → the template of its initial state


def templates_of(pool: EnvPool, states: Mapping[str, dict[str, Any]]) -> dict[str, StateTemplate]:
    """Templates of the servers' initial states, where they can have one."""
    out: dict[str, StateTemplate] = {}
    for name, config in states.items():
        made = StateTemplate.of(pool.get(name), config)
        if made is not None:
            out[name] = made
    return out
