"""Environment health (`envfactory.envgen.health`, `envfactory envs health`): the contract's invariants, checked by
running the environment.

Every shipped environment (native and BFCL) must be healthy; and for each dimension a deliberately broken
environment — generated-style code run sandboxed, as the pool runs untrusted code — must be caught on that
dimension and named, while a control built from the same code stays healthy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from envfactory.config import Settings
from envfactory.env import State
from envfactory.env.environment import Environment
from envfactory.env.pool import EnvPool
from envfactory.env.sandboxed import SandboxedEnvironment
from envfactory.envgen.health import DIMENSIONS, HealthSettings, check_code, check_health, gate, health_of
from envfactory.envgen.validate import validate_env

# A small inventory environment; each broken variant changes one thing (CHANGES below).
CODE = '''
"""Items: look one up, count it up, archive it."""

from __future__ import annotations

from pydantic import Field

from envfactory.env import Environment, Record, State, ToolError


class Item(Record):
    id: str
    name: str
    count: int = 0
    archived: bool = False


class DB(State):
    items: dict[str, Item] = Field(default_factory=dict)
    total: int = 0
    bumps: int = Field(default=0, exclude=True)  # not in the dump (the round_trip variant uses it)


env = Environment("NAME", DB, description="Items and their counts.", domain="utilities")


@env.tool(kind="read")
def get_item(db: DB, item_id: str) -> Item:
    """Get one item with its count.

    Args:
        item_id: Id of the item, e.g. "IT-1".
    """
    return db.get("items", item_id, "item")


@env.tool(kind="write")
def bump(db: DB, item_id: str) -> Item:
    """Add one to an item's count.

    Args:
        item_id: Id of the item.
    """
    item = db.get("items", item_id, "item")
    db.set("total", db.total + 1)
    return db.update("items", item_id, count=item.count + 1)


@env.tool(kind="write")
def archive(db: DB, item_id: str) -> Item:
    """Archive an item.

    Args:
        item_id: Id of the item.
    """
    item = db.get("items", item_id, "item")
    if item.archived:
        raise ToolError(f"{item_id} is already archived")
    return db.update("items", item_id, archived=True)
'''

CONFIG = {"items": {"IT-1": {"id": "IT-1", "name": "Lamp", "count": 2}, "IT-2": {"id": "IT-2", "name": "Desk"}}}

GET = '    return db.get("items", item_id, "item")\n'
BUMP = '    return db.update("items", item_id, count=item.count + 1)\n'
ARCHIVE = '    return db.update("items", item_id, archived=True)\n'

# dimension -> (text replaced, replacement): one broken invariant each
CHANGES: dict[str, tuple[str, str]] = {
    # a field left out of the dump: a fork of a dump forgets the bumps it counts
    "round_trip": (
        BUMP,
        '    db.bumps += 1\n    return db.update("items", item_id, count=item.count + db.bumps)\n',
    ),
    # a module-level counter outlives the session: the same calls twice give other results
    "determinism": (BUMP, '    _SEEN.append(1)\n    return db.update("items", item_id, count=len(_SEEN))\n'),
    # a read tool that writes
    "read_only": (GET, '    db.set("total", db.total + 1)\n    return db.get("items", item_id, "item")\n'),
    # an unknown id crashes the tool (KeyError) instead of refusing it
    "robustness": (GET, "    return db.items[item_id]\n"),
    # a write that can never succeed
    "writes_reachable": (ARCHIVE, '    raise ToolError("archiving is not available")\n'),
}


def broken_code(name: str, dimension: str | None) -> str:
    code = CODE.replace('"NAME"', f'"{name}"')
    if dimension == "determinism":
        code = code.replace('env = Environment("', '_SEEN: list[int] = []\n\nenv = Environment("', 1)
    if dimension is not None:
        old, new = CHANGES[dimension]
        assert old in code
        code = code.replace(old, new, 1)
    return textwrap.dedent(code)


def write_env(root: Path, name: str, code: str, config: dict[str, object] = CONFIG) -> Path:
    """envs/<name>/ with the code, the metadata the code derives (in-process: our own test code) and one scenario."""
    from envfactory.env.pool import load_env_folder

    folder = root / "envs" / name
    (folder / "scenarios").mkdir(parents=True, exist_ok=True)
    (folder / "env.py").write_text(code, encoding="utf-8")
    (folder / "scenarios" / "default.json").write_text(json.dumps(config), encoding="utf-8")
    meta = load_env_folder(folder, with_metadata=False).derived_metadata()
    (folder / "metadata.json").write_text(meta.model_dump_json(indent=2, exclude_none=True), encoding="utf-8")
    sys.modules.pop(f"envfactory_envs.{name}", None)
    return folder


@pytest.fixture(scope="module")
def broken_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvPool]:
    """A project with the control and one broken variant per dimension, untrusted: all run sandboxed."""
    root = tmp_path_factory.mktemp("health")
    write_env(root, "control", broken_code("control", None))
    for dimension in CHANGES:
        write_env(root, f"broken_{dimension}", broken_code(f"broken_{dimension}", dimension))
    pool = EnvPool(Settings(root=root, bfcl=False, sandbox_workers=1, sandbox_call_timeout_s=5))
    yield pool
    for name in pool.names():
        env = pool.get(name)
        if isinstance(env, SandboxedEnvironment):
            env.pool.shutdown()


SMALL = HealthSettings(calls=20)


# ---- the shipped pool ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", EnvPool().names())
def test_every_shipped_environment_is_healthy(pool: EnvPool, name: str) -> None:
    report = health_of(pool, name, SMALL)
    assert report.healthy, report.summary()
    by = {d.name: d for d in report.dimensions}
    assert set(by) == set(DIMENSIONS)
    # the checks ran: sequences were replayed, malformed calls made, every tool's schema looked at
    assert by["round_trip"].checked > 0 and by["determinism"].checked > 0
    assert by["robustness"].checked > 20 and by["schema"].checked == len(pool.get(name).metadata.tools)


# ---- one broken environment per dimension -------------------------------------------------------
def test_the_control_is_healthy(broken_pool: EnvPool) -> None:
    env = broken_pool.get("control")
    assert isinstance(env, SandboxedEnvironment)
    report = check_health(env, SMALL, broken_pool)
    assert report.healthy, report.summary()


@pytest.mark.parametrize("dimension", list(CHANGES))
def test_a_broken_environment_fails_on_its_dimension(broken_pool: EnvPool, dimension: str) -> None:
    env = broken_pool.get(f"broken_{dimension}")
    report = check_health(env, SMALL, broken_pool)
    assert not report.healthy and report.error is None
    assert dimension in report.failing, report.summary()
    failing = next(d for d in report.dimensions if d.name == dimension)
    assert failing.problems and all(isinstance(p, str) and p for p in failing.problems)
    # the summary names the failing dimension(s) for a person; nothing else fails that should not
    assert dimension in report.summary()
    unrelated = set(report.failing) - {dimension, "round_trip"}  # a nondeterministic env also breaks round trips
    assert not unrelated, report.summary()


def test_a_write_around_the_change_log_is_caught_by_the_dumps(tmp_path: Path) -> None:
    # `db.total += 1` bypasses the state's change log: the session neither sees it as a change nor undoes it
    # when the call then fails; the dumps before and after do see it
    code = broken_code("sneaky", None).replace(GET, "    db.total += 1\n" + GET, 1)
    write_env(tmp_path, "sneaky", code)
    pool = EnvPool(Settings(root=tmp_path, bfcl=False, sandbox_workers=1))
    env = pool.get("sneaky")
    try:
        report = check_health(env, SMALL, pool)
    finally:
        assert isinstance(env, SandboxedEnvironment)
        env.pool.shutdown()
    assert set(report.failing) == {"read_only", "robustness"}, report.summary()
    robustness = next(d for d in report.dimensions if d.name == "robustness").problems
    assert any("failed but changed the state" in p for p in robustness)


def test_a_hang_is_a_robustness_problem_and_the_check_goes_on(tmp_path: Path) -> None:
    code = broken_code("hangs", None).replace(GET, "    while len(item_id) > 1000:\n        pass\n" + GET, 1)
    write_env(tmp_path, "hangs", code)
    pool = EnvPool(Settings(root=tmp_path, bfcl=False, sandbox_workers=1, sandbox_call_timeout_s=1))
    env = pool.get("hangs")
    try:
        report = check_health(env, HealthSettings(calls=5), pool)
    finally:
        assert isinstance(env, SandboxedEnvironment)
        env.pool.shutdown()
    assert report.failing == ["robustness"], report.summary()
    assert any("get_item" in p and "hung" in p for p in report.dimensions[3].problems)


class Notes(State):
    count: int = 0


def test_schema_problems_are_found_in_process() -> None:
    env = Environment("notes", Notes, description="Notes.", domain="office")

    @env.tool(kind="write")
    def add(db: Notes, n: int = 1) -> int:
        """Add to the count.

        Args:
            n: How much.
        """
        db.count += n
        return db.count

    assert check_health(env, SMALL).healthy
    meta = env.metadata
    tool = meta.tools[0]
    drifted = tool.model_copy(
        update={
            "input_schema": {"type": "object", "properties": {"n": {"type": "integr"}}, "required": ["m"]},
        }
    )
    env._metadata = meta.model_copy(update={"tools": [drifted]})  # metadata that no longer matches the code
    report = check_health(env, SMALL)
    problems = next(d for d in report.dimensions if d.name == "schema").problems
    assert "schema" in report.failing
    assert any("not valid JSON Schema" in p for p in problems)
    assert any("requires m" in p for p in problems)
    assert any("'integr' in metadata.json but 'integer' in env.py" in p for p in problems), problems


# ---- the gates: envs validate, EnvGen's Test Agent and register ----------------------------------
def test_validate_gate_refuses_an_unhealthy_environment(broken_pool: EnvPool) -> None:
    good, bad = validate_env(broken_pool, "control"), validate_env(broken_pool, "broken_read_only")
    assert good.ok and bad.ok  # the contract alone does not see it
    assert gate(broken_pool, good, SMALL) is not None and good.ok
    health = gate(broken_pool, bad, SMALL)
    assert health is not None and not health.healthy and not bad.ok
    assert any(p.startswith("health/read_only: ") for p in bad.problems), bad.problems


def test_check_code_stages_candidate_code_like_the_pool(tmp_path: Path) -> None:
    from envfactory.env.metadata import EnvMetadata

    folder = write_env(tmp_path, "staged", broken_code("staged", "writes_reachable"))
    meta = EnvMetadata.model_validate_json((folder / "metadata.json").read_text())
    code = (folder / "env.py").read_text()
    settings = Settings(root=tmp_path / "elsewhere", bfcl=False, sandbox_workers=1)
    report = check_code(code, meta, [("default", CONFIG)], settings, SMALL)
    assert report.failing == ["writes_reachable"], report.summary()
    assert "archive" in report.dimensions[4].problems[0]
    fixed = check_code(broken_code("staged", None), meta, [("default", CONFIG)], settings, SMALL)
    assert fixed.healthy, fixed.summary()


def test_the_test_agent_names_the_failing_dimension(tmp_path: Path) -> None:
    from envfactory.env.metadata import EnvMetadata
    from envfactory.envgen.checks import ExpectedCall, TestScenario
    from envfactory_agents.common import AgentDeps
    from envfactory_agents.test import run_tests

    # a fork of a dump forgets the private bumps: the Test Agent's own scenarios (one live session) pass
    folder = write_env(tmp_path, "agent", broken_code("agent", "round_trip"))
    meta = EnvMetadata.model_validate_json((folder / "metadata.json").read_text())
    step = ExpectedCall(tool="bump", args={"item_id": "IT-1"}, expect_result={"count": 3})
    scenario = TestScenario(name="lamp", description="Count the lamp.", initial_config=CONFIG, steps=[step])
    settings = Settings(root=tmp_path / "project", bfcl=False, sandbox_workers=1, health_calls=20)
    deps = AgentDeps(settings=settings)
    report = run_tests(deps, (folder / "env.py").read_text(), meta, [scenario])
    health = [e for e in report.errors if e.dimension == "health"]
    assert health and all(e.severity == "high" for e in health)
    assert report.scenarios_passed == report.scenarios_run  # what the checks saw was fine
    assert health[0].message.startswith("round_trip: ")
    assert not report.passed()
    assert "[high/health] round_trip: " in report.summary()


# ---- the CLI --------------------------------------------------------------------------------------
def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ENVFACTORY_ROOT": str(root), "ENVFACTORY_BFCL": "false", "COLUMNS": "220"}
    return subprocess.run(
        [sys.executable, "-m", "envfactory.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_cli_reports_every_environment_and_exits_non_zero(tmp_path: Path) -> None:
    write_env(tmp_path, "control", broken_code("control", None))
    write_env(tmp_path, "broken_read_only", broken_code("broken_read_only", "read_only"))
    unloadable = tmp_path / "envs" / "unloadable"
    (unloadable / "scenarios").mkdir(parents=True)
    (unloadable / "env.py").write_text("this is not python\n")
    res = run(tmp_path, "envs", "health", "--calls", "10")
    assert res.returncode == 1, res
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert lines[-1] == "error: 2 of 3 environments are unhealthy: broken_read_only, unloadable", res.stderr
    assert "control" in res.stdout and "healthy" in res.stdout
    assert "broken_read_only: unhealthy (read_only)" in res.stdout
    assert "unloadable: cannot be checked" in res.stdout

    res = run(tmp_path, "envs", "health", "control", "--json", "--seed", "3")
    assert res.returncode == 0, res.stderr
    (report,) = json.loads(res.stdout)
    assert report["name"] == "control" and report["healthy"] is True
    assert [d["name"] for d in report["dimensions"]] == list(DIMENSIONS)

    res = run(tmp_path, "envs", "health", "nope")
    assert res.returncode == 1 and "no environment 'nope'" in res.stderr

    # envs validate runs the health check too: the unhealthy one is not registered
    res = run(tmp_path, "envs", "validate")
    assert res.returncode == 1
    assert "health/read_only" in res.stdout
    servers = json.loads((tmp_path / "configs" / "mcp_server.json").read_text())["mcpServers"]
    assert list(servers) == ["control"]
