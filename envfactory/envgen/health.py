"""Environment health: the invariants of the environment contract, checked by running the environment.

Every environment — native, imported (BFCL), generated (sandboxed) — must keep them; `envfactory envs
health` measures them, `envs validate` and EnvGen's register step require them. Dimensions:

- **round_trip**: `fork(dump(s))` behaves exactly like `s`: seeded agent-like call sequences, each run
  twice — plainly, and with dump → fork round trips at random points — give the same results and states;
- **determinism**: the same sequence from the same scenario twice gives the same results and states;
- **read_only**: a read tool never changes the state (the dump before and after, runtime keys aside);
- **robustness**: malformed calls (wrong types, 1 MB strings, unicode, negative and huge numbers,
  unknown ids, missing and extra arguments, a tool that does not exist) never raise out of a session,
  never hang past the call limit, never succeed when the schema says no, and never corrupt the state
  (a failed call leaves the dump as it was; every dump still loads);
- **writes_reachable**: every write tool succeeds at least once from a shipped scenario, with the
  schema checks' own arguments (ids from the scenario) — a write no call can reach is dead weight;
- **schema**: the metadata agrees with what the code defines (native: signatures and docstrings;
  sandboxed: the same, derived in the sandbox; imported: their converted docs, nothing to compare).

Agent-like calls: the schema checks' valid arguments for every tool (ids from the current state), in
a seeded order, with ids also taken from earlier results — what an agent exploring the tools does.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, Field

from envfactory.config import Settings
from envfactory.env.compiled import CompiledEnvironment
from envfactory.env.diff import state_part
from envfactory.env.environment import BaseEnvironment, Environment, contract_problems
from envfactory.env.json_schema import pattern_budget, timed_validator
from envfactory.env.metadata import EnvMetadata, dump_metadata
from envfactory.env.pool import EnvPool
from envfactory.env.sandboxed import WorkerPool, release_pool
from envfactory.env.session import CallRecord, Session
from envfactory.envgen.checks.schema_scenarios import schema_checks
from envfactory.envgen.validate import EnvReport
from envfactory.errors import EnvFactoryError

Dimension = Literal["round_trip", "determinism", "read_only", "robustness", "writes_reachable", "schema"]
DIMENSIONS: tuple[Dimension, ...] = (
    "round_trip",
    "determinism",
    "read_only",
    "robustness",
    "writes_reachable",
    "schema",
)


class HealthSettings(BaseModel):
    calls: int = Field(default=60, ge=1, description="agent-like calls per scenario and sequence")
    scenarios: int = Field(default=4, ge=1, description="shipped scenarios (sample configs) checked")
    solver_seeds: int = Field(default=4, ge=1, description="seeds the solver tries per scenario for a write")
    reach_scenarios: int = Field(
        default=200, ge=1, description="scenarios whose known calls may show a write reachable"
    )
    seed: int = 0
    call_timeout_s: float = Field(default=5.0, gt=0, description="a call that takes longer is a hang")
    max_problems: int = Field(default=5, ge=1, description="problems kept per dimension")


class DimensionResult(BaseModel):
    name: Dimension
    ok: bool = True
    checked: int = 0
    problems: list[str] = Field(default_factory=list)


class HealthReport(BaseModel):
    name: str
    healthy: bool
    dimensions: list[DimensionResult]
    seconds: float = 0.0
    error: str | None = None  # the environment could not even be checked

    @property
    def failing(self) -> list[str]:
        return [d.name for d in self.dimensions if not d.ok]

    def summary(self) -> str:
        if self.error:
            return f"{self.name}: cannot be checked: {self.error}"
        if self.healthy:
            return f"{self.name}: healthy"
        first = next(d for d in self.dimensions if not d.ok)
        return f"{self.name}: unhealthy ({', '.join(self.failing)}): {first.name}: {first.problems[0]}"


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _limit(seconds: float) -> Iterator[None]:
    """Interrupt an in-process call that runs past `seconds` (main thread only; elsewhere: no limit —
    sandboxed environments have their own, enforced by the parent)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise _Hang()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Checker:
    def __init__(self, env: BaseEnvironment, settings: HealthSettings, pool: EnvPool | None) -> None:
        self.env, self.s, self.pool = env, settings, pool
        self.results = {d: DimensionResult(name=d) for d in DIMENSIONS}
        self.kinds = {t.name: t.kind for t in env.metadata.tools}
        self.reached: set[str] = set()  # write tools seen to succeed and change the state
        self.schema_errors: dict[str, SchemaError | None] = {}  # tool -> why its input schema is invalid

    def fail(self, dim: Dimension, problem: str) -> None:
        r = self.results[dim]
        r.ok = False
        if len(r.problems) < self.s.max_problems:
            r.problems.append(problem)

    def call(self, session: Session, tool: str, args: Any) -> CallRecord | None:
        """One call, guarded: a raise or a hang is a robustness problem (None)."""
        self.results["robustness"].checked += 1
        try:
            with _limit(self.s.call_timeout_s):
                rec = session.call(tool, args)
            if rec.error is not None and rec.error.type in ("timeout", "internal_error"):
                # the session caught it, but the tool's own code crashed or hung: not a refusal a user can act on
                what = "hung" if rec.error.type == "timeout" else "crashed"
                self.fail("robustness", f"{tool}({_short(args)}) {what}: {_short(rec.error.message, 160)}")
            return rec
        except _Hang:
            self.fail("robustness", f"{tool} did not return within {self.s.call_timeout_s:g} s")
        except BaseException as e:  # Session.call promises never to raise
            if isinstance(e, KeyboardInterrupt):
                raise
            self.fail("robustness", f"{tool}({_short(args)}) raised {type(e).__name__}: {_short(str(e))}")
        return None

    def _holds(self, session: Session, dump: dict[str, Any]) -> bool:
        """Whether the session's state still dumps to `dump`, where that is known without a dump: a compiled
        environment's state is plain JSON and its dump a copy of it. Elsewhere: not known (False)."""
        return isinstance(self.env, CompiledEnvironment) and type(session) is Session and session.state == dump

    # ---- agent-like sequences ------------------------------------------------------------------
    def sequence(self, label: str, state: dict[str, Any], rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
        """The scenario's known calls (an imported suite's ground truth), then `calls` random valid ones."""
        known = [(tool, args) for tool, args in self.env.known_calls(label) if tool in self.kinds]
        valid = self.valid_calls(state)
        if not valid:
            return known
        return known + [rng.choice(valid) for _ in range(self.s.calls)]

    def valid_calls(self, state: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The schema checks' valid calls for every tool, ids from `state`."""
        return [
            (step.tool, step.args)
            for s in schema_checks(self.env.metadata, state)
            for step in s.steps
            if step.expect_ok is None and step.tool in self.kinds
        ]

    def replay(self, scenario: Any, calls: list[tuple[str, dict[str, Any]]], trips: set[int]) -> list[Any]:
        """The state before the calls, then per call its result and the state after it, from `scenario`, with a
        dump → fork round trip before the calls in `trips`. A write that succeeds and changes the state is
        marked reached."""
        session = Session.fork(self.env, scenario)
        before = state_part(session.dump())
        out: list[Any] = [before]
        for i, (tool, args) in enumerate(calls):
            if i in trips:
                try:
                    session = Session.fork(self.env, session.dump())
                except EnvFactoryError as e:
                    self.fail("round_trip", f"the dump before call {i + 1} {tool}({_short(args)}) does not load: {e}")
                    return out
            rec = self.call(session, tool, args)
            if rec is None:
                return out
            after = before if self._holds(session, before) else state_part(session.dump())
            if rec.ok and after != before and self.kinds.get(tool) == "write":
                self.reached.add(tool)
            out.append((tool, rec.ok, rec.result, rec.error.type if rec.error else None, after))
            before = after
        return out

    # ---- the dimensions --------------------------------------------------------------------------
    def run(self) -> None:
        configs = self.env.sample_configs(self.s.scenarios)
        for n, (label, config) in enumerate(configs):
            rng = random.Random(f"{self.env.name}/{label}/{self.s.seed}")
            calls = self.sequence(label, config, rng)
            if not calls:
                continue
            plain = self.replay(config, calls, set())
            again = self.replay(config, calls, set())
            self.results["determinism"].checked += len(calls)
            self._compare("determinism", label, calls, plain[1:], again[1:])
            trips = {i for i in range(len(calls)) if rng.random() < 0.3}
            tripped = self.replay(config, calls, trips)
            self.results["round_trip"].checked += len(calls)
            self._compare("round_trip", label, calls, plain[1:], tripped[1:])
            self._read_only(label, calls, plain)
            if n == 0:
                self._malformed(config, calls, rng)
        self._writes(self.env.sample_configs(max(self.s.scenarios, self.s.reach_scenarios)))
        self._schema()

    def _compare(self, dim: Dimension, scenario: str, calls: list[Any], a: list[Any], b: list[Any]) -> None:
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                what = "result" if x[:4] != y[:4] else "state"
                self.fail(dim, f"{scenario}: call {i + 1} {calls[i][0]}({_short(calls[i][1])}) gave another {what}")
                return
        if len(a) != len(b):
            self.fail(dim, f"{scenario}: the sequences stopped at different calls")

    def _read_only(self, scenario: str, calls: list[tuple[str, dict[str, Any]]], replayed: list[Any]) -> None:
        """From a plain replay (the state before, then per call its outcome and the state after): no read tool
        changed the state, whether or not the session caught it (`contract_violation`)."""
        before = replayed[0]
        for (tool, args), (_, _, _, error, after) in zip(calls, replayed[1:], strict=False):
            if self.kinds.get(tool) == "read":
                self.results["read_only"].checked += 1
                if after != before or error == "contract_violation":
                    self.fail("read_only", f"{scenario}: read tool {tool}({_short(args)}) changed the state")
            before = after

    def _malformed(self, scenario: dict[str, Any], valid: list[tuple[str, dict[str, Any]]], rng: random.Random) -> None:
        """Every tool with every odd value in every argument, then valid calls with one argument spoiled at
        random (a wrong type, an odd value, dropped, an extra one) — deeper paths: the other ids are real."""
        session = Session.fork(self.env, scenario)
        validators = {t.name: self._validator(t.name, t.input_schema) for t in self.env.metadata.tools}
        malformed = [
            (spec.name, args)
            for spec in self.env.metadata.tools
            for args in _malformed_args(spec.parameters, spec.required)
        ]
        malformed += [_spoil(tool, args, rng) for tool, args in rng.sample(valid, min(len(valid), self.s.calls))]
        dump = session.dump()
        loads: dict[str, Any] | None = None  # the last dump seen to load: an equal one needs no new try
        for tool, args in malformed:
            before = state_part(dump)
            rec = self.call(session, tool, args)
            if rec is None:
                session = Session.fork(self.env, scenario)
                dump, loads = session.dump(), None
                continue
            if loads is not dump or not self._holds(session, dump):
                dump = session.dump()
            if not rec.ok and state_part(dump) != before:
                self.fail("robustness", f"{tool}({_short(args)}) failed but changed the state")
            if rec.ok and not _fits(validators.get(tool), args):
                self.fail("robustness", f"{tool}({_short(args)}) succeeded though its schema rejects it")
            if loads is not None and (dump is loads or dump == loads):
                continue
            try:
                Session.fork(self.env, dump)
                loads = dump
            except EnvFactoryError as e:
                self.fail("robustness", f"after {tool}({_short(args)}) the state no longer loads: {e}")
                session = Session.fork(self.env, scenario)
                dump, loads = session.dump(), None
        rec = self.call(session, "__no_such_tool__", {})
        if rec is not None and (rec.ok or rec.error is None or rec.error.type != "unknown_tool"):
            self.fail("robustness", "a tool that does not exist did not come back unknown_tool")

    def _validator(self, tool: str, schema: dict[str, Any]) -> Draft202012Validator | None:
        """The tool's input schema as a validator, or None where it is no valid JSON Schema (checked once
        per tool: the schema dimension reports why)."""
        if tool not in self.schema_errors:
            try:
                Draft202012Validator.check_schema(schema)
                self.schema_errors[tool] = None
            except SchemaError as e:
                self.schema_errors[tool] = e
        if self.schema_errors[tool] is not None:
            return None
        return timed_validator(schema, formats=False)  # an untrusted environment's patterns, matched here

    def _writes(self, configs: list[tuple[str, dict[str, Any]]]) -> None:
        """Every write tool succeeds and changes the state somewhere: in the agent-like sequences, or else
        alone from a shipped scenario by the privileged solver (its retries, learned bounds, shaped
        values; ids from the state)."""
        writes = sorted(t for t, k in self.kinds.items() if k == "write")
        self.results["writes_reachable"].checked = len(writes)
        if set(writes) - self.reached:
            for label, config in configs[self.s.scenarios :]:
                calls = [(t, a) for t, a in self.env.known_calls(label) if t in self.kinds]
                if any(t in writes and t not in self.reached for t, _ in calls):
                    self.replay(config, calls, set())
        for tool in [t for t in writes if t not in self.reached]:
            self._walk_to(tool, configs[: self.s.scenarios])
        writes = [t for t in writes if t not in self.reached]
        if self.pool is None or not writes:
            for tool in writes:
                self.fail("writes_reachable", f"write tool {tool} never succeeded in a change from a shipped scenario")
            return
        from envfactory.tasks.pi_star import PiStarSettings, solve_chain
        from envfactory.toolgraph.sampler import ChainStep, InputSource, ToolChain

        settings = PiStarSettings(ids_from_state=True, target_plans=4)
        for tool in writes:
            spec = self.env.metadata.tool(tool)
            inputs = [InputSource(parameter=p, required=p in spec.required, source="user") for p in spec.parameters]
            chain = ToolChain(
                tools=[f"{self.env.name}.{tool}"],
                servers=[self.env.name],
                turns=[[f"{self.env.name}.{tool}"]],
                seed=self.s.seed,
                target_length=1,
                steps=[ChainStep(tool=f"{self.env.name}.{tool}", inputs=inputs)],
            )
            last = "no shipped scenario"
            attempts = [
                (state, self.s.seed + k) for k in range(self.s.solver_seeds) for _, state in configs[: self.s.scenarios]
            ]
            for state, seed in attempts:
                outcome = solve_chain(self.pool, chain, {self.env.name: state}, seed=seed, settings=settings)
                if outcome.ok:
                    break
                last = outcome.failure or "failed"
            else:
                self.fail("writes_reachable", f"write tool {tool} never succeeded from a shipped scenario: {last}")

    def _walk_to(self, tool: str, configs: list[tuple[str, dict[str, Any]]]) -> None:
        """Random walks that try `tool` after every other call: a write that needs some earlier call first
        (a login after a logout) is reached the way an agent would reach it."""
        for label, config in configs:
            valid = self.valid_calls(config)
            targets = [c for c in valid if c[0] == tool]
            if not targets:
                continue
            rng = random.Random(f"{self.env.name}/{label}/{tool}/{self.s.seed}")
            walk = [c for _ in range(self.s.calls) for c in (rng.choice(valid), rng.choice(targets))]
            self.replay(config, walk, set())
            if tool in self.reached:
                return

    def _schema(self) -> None:
        env = self.env
        self.results["schema"].checked = len(env.metadata.tools)
        for t in env.metadata.tools:
            self._validator(t.name, t.input_schema)
            error = self.schema_errors[t.name]
            if error is not None:
                self.fail("schema", f"{t.name}: its input schema is not valid JSON Schema: {error.message}")
            props = t.input_schema.get("properties") or {}
            missing = [r for r in t.input_schema.get("required") or [] if r not in props]
            if missing:
                self.fail("schema", f"{t.name}: requires {', '.join(missing)}, which its schema does not define")
        derived = None
        if isinstance(env, Environment):
            derived = env.derived_metadata()
        elif getattr(env, "blocking_io", False):
            load = getattr(env, "pool", None)
            answer = load.ensure_loaded() if load is not None else None
            if answer is not None and answer.derived_metadata:
                derived = EnvMetadata.model_validate(answer.derived_metadata)
        if derived is not None:
            for problem in contract_problems(env.metadata, derived):
                self.fail("schema", problem)


def _fits(validator: Draft202012Validator | None, args: dict[str, Any]) -> bool:
    """Whether the tool's own JSON Schema accepts `args` (an invalid schema: no verdict, taken as yes)."""
    if validator is None:
        return True
    # null for an optional argument means "not given": advertised schemas leave `null` out of an
    # `anyOf [T, null]` with a None default for a model's sake, and the tools still accept it
    required = set(validator.schema.get("required") or [])
    given = {k: v for k, v in args.items() if v is not None or k in required}
    try:
        with pattern_budget():
            return validator.is_valid(given)
    except RecursionError:
        return True


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# wrong types, a 1 MB string, unicode (with a right-to-left override), negative and huge numbers, empties
_ODD: tuple[Any, ...] = ("x" * 1_000_000, "ünïcødé ✓ 日本 \u202e", -(10**18), 10**18, 1e308, -1, 0, True, None, [], {})


def _malformed_args(params: dict[str, Any], required: list[str]) -> list[dict[str, Any]]:
    """Arguments no valid call has: wrong types, huge and odd values, unknown ids, missing and extra keys."""
    names = list(params)
    out: list[dict[str, Any]] = [{}, {"unexpected_argument": 1}]
    odd = _ODD
    for name in names:
        for value in odd:
            out.append({**dict.fromkeys(required, "UNKNOWN-0000"), name: value})
        out.append({**dict.fromkeys(required, "UNKNOWN-0000"), name: "UNKNOWN-9999"})
    return out


def _spoil(tool: str, args: dict[str, Any], rng: random.Random) -> tuple[str, dict[str, Any]]:
    """A valid call with one thing wrong: an argument set to an odd value or an unknown id, or dropped, or
    an extra argument."""
    spoiled = dict(args)
    how = rng.random()
    if spoiled and how < 0.6:
        spoiled[rng.choice(sorted(spoiled))] = rng.choice([*_ODD, "UNKNOWN-9999"])
    elif spoiled and how < 0.8:
        del spoiled[rng.choice(sorted(spoiled))]
    else:
        spoiled["unexpected_argument"] = rng.choice(_ODD)
    return tool, spoiled


def check_health(
    env: BaseEnvironment, settings: HealthSettings | None = None, pool: EnvPool | None = None
) -> HealthReport:
    """Run every dimension on `env` (`pool`: where it comes from, for the solver that checks writes are
    reachable; without one that dimension is not checked); never raises for what the environment does."""
    s = settings or HealthSettings()
    started = time.monotonic()
    checker = _Checker(env, s, pool)
    error = None
    try:
        checker.run()
    except EnvFactoryError as e:  # a shipped scenario that does not load, a sandbox that will not start
        error = str(e)
    unhealthy = getattr(env, "unhealthy", None)  # a sandboxed environment its pool stopped serving (a canary...)
    if isinstance(unhealthy, str) and error is None:
        error = f"its sandboxed workers were stopped: {unhealthy}"
    dims = [checker.results[d] for d in DIMENSIONS]
    healthy = error is None and all(d.ok for d in dims)
    return HealthReport(
        name=env.name, healthy=healthy, dimensions=dims, seconds=time.monotonic() - started, error=error
    )


def health_of(pool: EnvPool, name: str, settings: HealthSettings | None = None) -> HealthReport:
    """`check_health` for the pool's environment `name`; one that does not even load is reported, not raised."""
    started = time.monotonic()
    try:
        env = pool.get(name)
    except EnvFactoryError as e:
        return HealthReport(name=name, healthy=False, dimensions=[], seconds=time.monotonic() - started, error=str(e))
    return check_health(env, settings, pool)


def health_problems(report: HealthReport) -> list[str]:
    """One line per problem, each naming its dimension: what `envs validate` and EnvGen's register report."""
    if report.error:
        return [f"health: cannot be checked: {report.error}"]
    return [f"health/{d.name}: {p}" for d in report.dimensions for p in d.problems]


def gate(pool: EnvPool, report: EnvReport, settings: HealthSettings | None = None) -> HealthReport | None:
    """`envs validate` and EnvGen's register step: a valid environment must also be healthy. An unhealthy
    one's problems (each naming its dimension) join `report`, which then fails (and is not registered)."""
    if not report.ok:
        return None
    health = health_of(pool, report.name, settings)
    if not health.healthy:
        report.problems += health_problems(health)
        report.ok = False
    return health


def check_code(
    code: str,
    metadata: EnvMetadata,
    configs: list[tuple[str, dict[str, Any]]],
    settings: Settings,
    health: HealthSettings | None = None,
) -> HealthReport:
    """The health of environment code that is not in the pool yet (EnvGen's candidate), with `configs` as
    its shipped scenarios: staged in a temporary project and run sandboxed, exactly as the pool would run it."""
    with tempfile.TemporaryDirectory(prefix="envfactory-health-") as tmp:
        root = Path(tmp)
        folder = root / "envs" / metadata.name
        (folder / "scenarios").mkdir(parents=True)
        (folder / "env.py").write_text(code, encoding="utf-8")
        dump_metadata(metadata, folder / "metadata.json")
        for i, (_, config) in enumerate(configs):
            name = "default" if i == 0 else f"scenario_{i}"
            (folder / "scenarios" / f"{name}.json").write_text(json.dumps(config), encoding="utf-8")
        staged = settings.model_copy(
            update={
                "envs_dir": root / "envs",
                "trust_path": root / "trusted.json",  # nothing trusted: the code runs sandboxed
                "registry_path": root / "mcp_server.json",
                "bfcl": False,
            }
        )
        pool = EnvPool(staged)
        try:
            return health_of(pool, metadata.name, health)
        finally:
            with contextlib.suppress(EnvFactoryError):
                workers = getattr(pool.get(metadata.name), "pool", None)
                if isinstance(workers, WorkerPool):
                    release_pool(workers)  # shared with a concurrent check of the same code: the last one stops it
