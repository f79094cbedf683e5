"""The pool at scale: listing reads metadata and builds nothing, an environment is built on first use, and the
compiled environments kept built are bounded (count and bytes, least recently used out), whatever the order."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from envfactory.compiler.build import write_compiled
from envfactory.compiler.compile import compile_spec
from envfactory.compiler.scenarios import generate_scenarios
from envfactory.config import Settings
from envfactory.env.compiled import PLAN_FILE, CompiledEnvironment, CompiledPlan
from envfactory.env.metadata import MetadataSummary, parse_metadata, summarize_metadata
from envfactory.env.pool import EnvPool, read_metadata, read_summary
from envfactory.env.session import Session
from envfactory.envgen.openapi import load_openapi
from envfactory.errors import EnvLoadError, MetadataError
from envfactory.metatools import Hub
from envfactory.tasks.plan import SynthConfig, choose_envs
from tests.support.cli import CliRun, run_cli
from tests.support.paths import ROOT, TEST_DATA

SPEC = TEST_DATA / "corpus" / "api" / "googleapis.com" / "tasks.json"
CLONES = 12


def _plan() -> tuple[CompiledPlan, dict[str, dict[str, object]]]:
    plan, _ = compile_spec(load_openapi(SPEC), name="tasks", domain="office", source="openapi:googleapis.com/tasks")
    return plan, generate_scenarios(plan)


@pytest.fixture(scope="module")
def compiled_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CLONES compiled environments from one real spec, each under its own name, of different sizes."""
    out = tmp_path_factory.mktemp("compiled")
    plan, scenarios = _plan()
    for i in range(CLONES):
        name = f"tasks_{i:02d}"
        description = plan.description + " " + "padding " * (i * 400)  # sizes differ: the byte bound matters
        write_compiled(out / name, plan.model_copy(update={"name": name, "description": description}), scenarios)
    return out


def _pool(tmp_path: Path, compiled_dir: Path, **limits: float) -> EnvPool:
    empty = tmp_path / "envs"
    empty.mkdir(exist_ok=True)
    return EnvPool(Settings(root=tmp_path, envs_dir=empty, compiled_dir=compiled_dir, bfcl=False, **limits))


def _weight(folder: Path) -> int:
    return (folder / PLAN_FILE).stat().st_size + (folder / "metadata.json").stat().st_size


# ---- listing builds nothing ---------------------------------------------------------------------------


def test_listing_the_pool_builds_nothing_and_agrees_with_the_built_environments(
    tmp_path: Path, compiled_dir: Path
) -> None:
    envs = tmp_path / "envs"
    shutil.copytree(ROOT / "envs" / "hotels", envs / "hotels")  # trusted: its hash is pinned in the trust file
    pool = EnvPool(
        Settings(
            root=tmp_path,
            envs_dir=envs,
            compiled_dir=compiled_dir,
            bfcl=False,
            trust_path=ROOT / "configs" / "trusted.json",
        )
    )
    entries = {name: pool.entry(name) for name in pool.names()}
    assert len(entries) == CLONES + 1
    assert pool.stats().builds == 0 and pool.stats().resident == 0
    assert entries["hotels"].kind == "python" and entries["hotels"].runs == "in-process"
    assert entries["tasks_00"].kind == "compiled" and entries["tasks_00"].runs == "in-process"
    for name, e in entries.items():
        env = pool.get(name)
        meta = env.metadata
        assert (e.description, e.domain, e.tools) == (meta.description, meta.domain, len(meta.tools))
        assert e.write_tools == sum(t.kind == "write" for t in meta.tools)
        assert e.scenarios == env.scenario_names()
    assert pool.stats().builds == CLONES + 1  # each built once, on first use


def test_listing_runs_no_code_and_starts_no_sandbox(tmp_path: Path) -> None:
    """An untrusted folder is listed from its metadata.json as sandboxed: its env.py is never executed."""
    envs = tmp_path / "envs"
    shutil.copytree(ROOT / "envs" / "hotels", envs / "hotels")
    marker = tmp_path / "ran"
    code = (envs / "hotels" / "env.py").read_text()
    (envs / "hotels" / "env.py").write_text(f"open({str(marker)!r}, 'w').close()\n" + code)
    pool = EnvPool(Settings(root=tmp_path, envs_dir=envs, bfcl=False, trust_path=tmp_path / "trusted.json"))
    entry = pool.entry("hotels")
    assert entry.runs == "sandboxed" and entry.tools == 8 and entry.write_tools == 3
    assert not marker.exists() and pool.stats().builds == 0


def test_the_hub_and_synth_env_choice_list_without_building(tmp_path: Path, compiled_dir: Path) -> None:
    pool = _pool(tmp_path, compiled_dir)
    meta = parse_metadata(json.loads((compiled_dir / "tasks_03" / "metadata.json").read_text()))
    hub = Hub(pool)
    apps = hub.list_apps()
    assert [a.name for a in apps] == pool.names() and all(a.num_tools == len(meta.tools) for a in apps)
    assert choose_envs(SynthConfig(), pool) == pool.names()
    assert pool.stats().builds == 0
    tools = hub.list_tools("tasks_03")  # a tool listing is a use: that one environment is built
    assert [t.name for t in tools] == meta.tool_names
    assert pool.stats().builds == 1 and pool.stats().resident == 1


def test_envs_list_shows_the_compiled_environments_with_the_bundled_ones(tmp_path: Path, compiled_dir: Path) -> None:
    env = {
        **os.environ,
        "ENVFACTORY_ROOT": str(ROOT),
        "ENVFACTORY_COMPILED_DIR": str(compiled_dir),
        "ENVFACTORY_BFCL": "false",
        "COLUMNS": "250",
    }
    res = subprocess.run(
        [sys.executable, "-m", "envfactory.cli", "envs", "list"], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    rows = {line.split("│")[1].strip(): line for line in res.stdout.splitlines() if line.count("│") > 2}
    assert "hotels" in rows and all(f"tasks_{i:02d}" in rows for i in range(CLONES))
    cells = [c.strip() for c in rows["tasks_07"].split("│")[1:-1]]
    meta = parse_metadata(json.loads((compiled_dir / "tasks_07" / "metadata.json").read_text()))
    writes = sum(t.kind == "write" for t in meta.tools)
    scenarios = ", ".join(sorted(p.stem for p in (compiled_dir / "tasks_07" / "scenarios").iterdir()))
    assert cells == ["tasks_07", meta.domain, str(len(meta.tools)), str(writes), scenarios, meta.source, "in-process"]
    # `envs metadata` sees them too (it looked in envs/ alone: "no environment folder"), and writes nothing for one
    command = [sys.executable, "-m", "envfactory.cli", "envs", "metadata", "tasks_07"]
    shown = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and json.loads(shown.stdout)["tools"] == json.loads(meta.model_dump_json())["tools"]
    refused = subprocess.run([*command, "--write"], env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "is compiled: its metadata comes from its compiled.json" in refused.stderr


def test_a_broken_metadata_file_is_one_error_for_its_entry_alone(tmp_path: Path, compiled_dir: Path) -> None:
    local = tmp_path / "compiled"
    shutil.copytree(compiled_dir / "tasks_00", local / "tasks_00")
    shutil.copytree(compiled_dir / "tasks_01", local / "tasks_01")
    meta = json.loads((local / "tasks_01" / "metadata.json").read_text())
    (local / "tasks_01" / "metadata.json").write_text(json.dumps({**meta, "name": "other"}))
    pool = _pool(tmp_path, local)
    assert pool.entry("tasks_00").tools == len(read_metadata(local / "tasks_00").tools)
    with pytest.raises(EnvLoadError, match="names the environment 'other' but its folder is 'tasks_01'"):
        pool.entry("tasks_01")
    (local / "tasks_01" / "metadata.json").write_text('{"name": "tasks_01", ')
    with pytest.raises(EnvLoadError, match=r"metadata\.json: invalid JSON"):
        read_summary(local / "tasks_01")
    (local / "tasks_01" / "metadata.json").write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(EnvLoadError, match="recursion limit"):
        read_summary(local / "tasks_01")


# ---- the summary is the metadata's, checked the same way -------------------------------------------------


@pytest.mark.parametrize("name", ["hotels", "shop", "banking", "smart_home"])
def test_a_summary_is_what_the_full_metadata_says(name: str) -> None:
    data = json.loads((ROOT / "envs" / name / "metadata.json").read_text())
    assert summarize_metadata(data) == MetadataSummary.of(parse_metadata(data))


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"name": "9lives"}, "not a valid environment name"),
        ({"domain": "space"}, "domain"),
        ({"description": ""}, "description"),
        ({"tools": []}, "tools"),
        ({"extra": 1}, "extra"),
        ({"tools": [{"name": "a", "kind": "read"}, {"name": "a", "kind": "write"}]}, "tool 'a' is defined twice"),
        ({"tools": [{"name": "a", "kind": "delete"}]}, "tools[0](a).kind"),
    ],
)
def test_a_summary_refuses_what_the_full_metadata_refuses(change: dict[str, object], needle: str) -> None:
    data = {**json.loads((ROOT / "envs" / "hotels" / "metadata.json").read_text()), **change}
    with pytest.raises(MetadataError) as summary_error:
        summarize_metadata(data, "m.json")
    assert needle in str(summary_error.value)
    with pytest.raises(MetadataError):
        parse_metadata(data, "m.json")


# ---- the cache bound ---------------------------------------------------------------------------------------


def _reference_lru(
    order: list[int], weights: dict[str, int], max_envs: int, max_bytes: int
) -> tuple[int, int, list[str]]:
    """(builds, evictions, resident names oldest first) of a least-recently-used cache under both bounds."""
    kept: OrderedDict[str, int] = OrderedDict()
    builds = evictions = 0
    for i in order:
        name = f"tasks_{i:02d}"
        if name in kept:
            kept.move_to_end(name)
            continue
        builds += 1
        kept[name] = weights[name]
        while len(kept) > 1 and (len(kept) > max_envs or sum(kept.values()) > max_bytes):
            kept.popitem(last=False)
            evictions += 1
    return builds, evictions, list(kept)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    order=st.lists(st.integers(0, CLONES - 1), min_size=1, max_size=30),
    max_envs=st.integers(1, 6),
    budget=st.sampled_from([0.02, 0.05, 0.1, 1.0]),  # MB of files: from one small env to all of them
)
def test_the_cache_bound_holds_under_any_access_order(
    tmp_path: Path, compiled_dir: Path, order: list[int], max_envs: int, budget: float
) -> None:
    pool = _pool(tmp_path, compiled_dir, pool_cache_envs=max_envs, pool_cache_mb=budget)
    weights = {f.name: _weight(f) for f in compiled_dir.iterdir()}
    max_bytes = pool.max_bytes
    for i in order:
        name = f"tasks_{i:02d}"
        assert pool.get(name).name == name
        s = pool.stats()
        assert s.resident <= max_envs
        assert s.resident_bytes <= max_bytes or s.resident == 1  # only the one in use may be over alone
    builds, evictions, resident = _reference_lru(order, weights, max_envs, max_bytes)
    s = pool.stats()
    assert (s.builds, s.evictions, s.resident) == (builds, evictions, len(resident))
    assert s.resident_bytes == sum(weights[n] for n in resident)


def test_touching_every_environment_keeps_only_the_bound(tmp_path: Path, compiled_dir: Path) -> None:
    pool = _pool(tmp_path, compiled_dir, pool_cache_envs=3)
    for _ in range(2):
        for name in pool.names():
            pool.get(name)
    s = pool.stats()
    assert s.resident == 3 and s.builds == 2 * CLONES and s.evictions == 2 * CLONES - 3


def test_an_evicted_environment_comes_back_the_same(tmp_path: Path, compiled_dir: Path) -> None:
    pool = _pool(tmp_path, compiled_dir, pool_cache_envs=1)
    first = pool.get("tasks_05")
    assert isinstance(first, CompiledEnvironment)
    held = Session.fork(first, first.scenario("default"))
    pool.get("tasks_06")  # evicts tasks_05
    again = pool.get("tasks_05")
    assert again is not first and pool.stats().builds == 3
    assert again.metadata == first.metadata and again.scenario_names() == first.scenario_names()
    a = Session.fork(first, first.scenario("default"))
    b = Session.fork(again, again.scenario("default"))
    start = a.dump()
    assert b.dump() == start
    ids = {"list_id": next(iter(start["lists"])), "tasklist": next(iter(start["lists"])), "task_id": "TAS-0001"}
    for tool in first.metadata.tools:  # every tool once, in order: the same answers and states on both
        args = {p: ids[p] for p in tool.required}
        ra, rb = a.call(tool.name, args), b.call(tool.name, args)
        assert ra.payload() == rb.payload() and a.dump() == b.dump()
    assert a.dump() != start  # the calls changed the state, identically on both
    assert held.call("tasks_tasklists_list", {}).ok  # a session on the evicted object still works


def test_a_compiled_environment_that_failed_is_retried_once_its_files_change(
    tmp_path: Path, compiled_dir: Path
) -> None:
    local = tmp_path / "compiled"
    shutil.copytree(compiled_dir / "tasks_00", local / "tasks_00")
    plan = (local / "tasks_00" / PLAN_FILE).read_text()
    (local / "tasks_00" / PLAN_FILE).write_text(plan.replace('"tasks_00"', '"tasks_99"', 1))
    pool = _pool(tmp_path, local)
    for _ in range(2):
        with pytest.raises(EnvLoadError, match="names the environment 'tasks_99'"):
            pool.get("tasks_00")
    assert pool.stats().builds == 0
    (local / "tasks_00" / PLAN_FILE).write_text(plan)
    assert pool.get("tasks_00").name == "tasks_00"


def test_the_bounds_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVFACTORY_POOL_CACHE_ENVS", "7")
    monkeypatch.setenv("ENVFACTORY_POOL_CACHE_MB", "1.5")
    pool = EnvPool(Settings())
    assert (pool.max_envs, pool.max_bytes) == (7, int(1.5 * 1024 * 1024))
    with pytest.raises(ValidationError):
        Settings(pool_cache_envs=0)


def _envs_list(monkeypatch: pytest.MonkeyPatch, envs: Path, compiled: Path | None, *, bfcl: bool) -> CliRun:
    """`envfactory envs list` over this pool folder (and compiled folder), wide enough for whole rows."""
    monkeypatch.setenv("ENVFACTORY_ROOT", str(ROOT))
    monkeypatch.setenv("ENVFACTORY_ENVS_DIR", str(envs))
    if compiled is not None:
        monkeypatch.setenv("ENVFACTORY_COMPILED_DIR", str(compiled))
    monkeypatch.setenv("ENVFACTORY_BFCL", str(bfcl).lower())
    monkeypatch.setenv("COLUMNS", "300")
    listed = run_cli(["envs", "list"])
    assert listed.code == 0, listed.stderr
    return listed


def test_a_compiled_environment_named_like_a_pool_folder_is_hidden_and_envs_list_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool folder comes first: a compiled `hotels` is never loaded while envs/hotels exists. That is now
    said (it was silent), naming both folders; nothing else changes."""
    envs = tmp_path / "envs"
    shutil.copytree(ROOT / "envs" / "hotels", envs / "hotels")
    compiled = tmp_path / "compiled"
    plan, scenarios = _plan()
    for name in ("hotels", "tasks_a"):
        write_compiled(compiled / name, plan.model_copy(update={"name": name}), scenarios)
    pool = EnvPool(Settings(root=ROOT, envs_dir=envs, compiled_dir=compiled, bfcl=False))
    assert pool.shadowed() == {"hotels": compiled / "hotels"}
    assert not isinstance(pool.get("hotels"), CompiledEnvironment)
    assert isinstance(pool.get("tasks_a"), CompiledEnvironment)
    listed = _envs_list(monkeypatch, envs, compiled, bfcl=False)
    assert f"note: hotels in {compiled} is hidden by {envs / 'hotels'}" in listed.stdout
    assert EnvPool(Settings(root=ROOT, compiled_dir=compiled, envs_dir=tmp_path / "none", bfcl=False)).shadowed() == {}
    # the pool folder itself, written another way, hides nothing (it once hid every environment from itself)
    os.symlink(envs, tmp_path / "link")
    for same in (tmp_path / "link", tmp_path / "compiled" / ".." / "envs"):
        assert EnvPool(Settings(root=ROOT, envs_dir=envs, compiled_dir=same, bfcl=False)).shadowed() == {}


def test_a_folder_named_like_an_imported_suites_environment_is_listed_once_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool folder `bfcl_math` was listed twice (envs list, validate, the hub's list_apps) and the suite's
    environment of that name was hidden without a word: every call reached the folder's."""
    pytest.importorskip("bfcl_eval")
    envs = tmp_path / "envs"
    plan, scenarios = _plan()
    write_compiled(envs / "bfcl_math", plan.model_copy(update={"name": "bfcl_math"}), scenarios)
    pool = EnvPool(Settings(root=ROOT, envs_dir=envs, bfcl=True))
    assert "bfcl_math" in pool.imported_factories()
    names = pool.names()
    assert names.count("bfcl_math") == 1 and len(names) == len(set(names))
    assert pool.hidden_imported() == {"bfcl_math": envs / "bfcl_math"}
    assert isinstance(pool.get("bfcl_math"), CompiledEnvironment)
    apps = [a.name for a in Hub(pool).list_apps()]
    assert apps.count("bfcl_math") == 1
    listed = _envs_list(monkeypatch, envs, None, bfcl=True)
    assert f"note: the imported suite's bfcl_math is hidden by {envs / 'bfcl_math'}" in listed.stdout
    assert sum(line.startswith("│ bfcl_math ") for line in listed.stdout.splitlines()) == 1
