"""An episode over several environments: one isolated `Session` per environment, forked from given states.

Chains may span up to three environments (the sampler's `max_servers`); a task's initial database
is one state dump per environment. `replay` runs a list of calls from initial states and returns
what each call gave and the final states — the privileged solver, the verifier's v(Exec(π*, Db⁰)),
the selection of pass@k trajectories and the reward all use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from envfactory.env.environment import BaseEnvironment
from envfactory.env.pool import EnvPool
from envfactory.env.session import CallRecord, Session, ToolErrorInfo
from envfactory.env.state_template import StateTemplate, StateTemplates
from envfactory.records.models import States, ToolCall, ToolResult


class Episode:
    """Sessions per environment; environments not given an initial state start from their default scenario
    (at once for `initial` and `servers`, on first use for any other: `session`). A session started from the
    very config a template was validated from forks from the template (`templates`; `forked` says which)."""

    def __init__(
        self,
        pool: EnvPool,
        initial: States | None = None,
        servers: Iterable[str] = (),
        templates: StateTemplates | None = None,
    ) -> None:
        self.pool = pool
        self.sessions: dict[str, Session] = {}
        self.templates = templates or {}
        self.forked: dict[str, StateTemplate] = {}  # server → the template its session forked from
        initial = initial or {}
        for name in dict.fromkeys([*initial, *servers]):
            self.start(name, initial.get(name))

    def close(self) -> None:
        """Let go of every session's resources (a sandboxed worker's copy of its state); idempotent."""
        for session in list(self.sessions.values()):  # (a call on another thread may start one meanwhile)
            session.close()

    def start(self, server: str, config: dict[str, Any] | str | None = None) -> Session:
        """(Re)start `server`'s session from `config` (None: its default scenario)."""
        env = self.pool.get(server)
        template = self.templates.get(server)
        if template is not None and template.config is config and template.env is env:
            self.forked[server] = template
            session = self.sessions[server] = Session(env, template.fork())
            return session
        self.forked.pop(server, None)
        session = self.sessions[server] = Session.fork(env, env.default_scenario() if config is None else config)
        return session

    def session(self, server: str) -> Session:
        """`server`'s session, started from its default scenario on first use."""
        return self.sessions.get(server) or self.start(server)

    def env(self, server: str) -> BaseEnvironment:
        return self.pool.get(server)

    def call(self, server: str, tool: str, arguments: dict[str, Any]) -> CallRecord:
        session = self.sessions.get(server)
        if session is None:
            known = ", ".join(self.sessions) or "none"
            info = ToolErrorInfo(type="unknown_tool", message=f"no environment '{server}' in this episode ({known})")
            return CallRecord(index=-1, tool=tool, arguments=arguments, ok=False, error=info)
        return session.call(tool, arguments)

    def dumps(self) -> States:
        return {name: s.dump() for name, s in self.sessions.items()}


class Replay(BaseModel):
    """What replaying calls gave: one result per call and the final states."""

    results: list[ToolResult]
    final: States

    @property
    def failures(self) -> int:
        return sum(not r.ok for r in self.results)


def result_of(call: ToolCall, rec: CallRecord) -> ToolResult:
    return ToolResult(server=call.server, name=call.name, ok=rec.ok, result=rec.payload(), call_id=call.id)


def replay(
    pool: EnvPool,
    calls: Iterable[ToolCall],
    initial: States,
    servers: Iterable[str] = (),
    templates: StateTemplates | None = None,
) -> Replay:
    """Run `calls` in order in a fresh episode forked from `initial` (plus `servers` at their defaults; from
    `templates` where they were validated from `initial`'s very configs).

    A call to an environment outside the episode is an error result, not an exception: a model's
    completion may name anything."""
    episode = Episode(pool, initial, servers, templates)
    results = [result_of(c, episode.call(c.server, c.name, c.arguments)) for c in calls]
    return Replay(results=results, final=episode.dumps())
