"""Batch units on Ray (a real local instance, `num_cpus=2`), with the guarantees of a local run.

The same plan run by the local executor and by Ray gives the same records byte for byte after sorting; a
worker process SIGKILLed mid-run costs a retry of its units and nothing else; a driver killed mid-run and
started again finishes with every unit once; an address where no cluster listens is one clear line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.executor import ExecutorError, ExecutorSettings, RayExecutor, WorkerLost, executor_from
from envfactory.records.run_folder import CONVERSATIONS, DROPPED
from envfactory.tasks.plan import Plan, SynthConfig, plan_units, run_units
from envfactory.tasks.run import OfflineRunner, tool_graph
from tests.support.paths import ROOT
from tests.support.ray_runners import SlowRunner

# needs what `make test` neither installs nor starts: `make test-external` runs it (and .ci/run runs both)
pytestmark = pytest.mark.external  # a Ray cluster

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module", autouse=True)
def ray_instance() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return Settings(root=ROOT, bfcl=False)


@pytest.fixture(scope="module")
def plan(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Plan:
    config = SynthConfig.model_validate(
        {"envs": ["hotels", "banking", "shop"], "T": 3, "S": 2, "D": 2, "seed": 4, "out": tmp_path_factory.mktemp("p")}
    )
    return plan_units(config, EnvPool(settings), tool_graph(settings, config))


def records(out: Path) -> tuple[list[bytes], list[bytes]]:
    """The output files' whole lines, sorted (the order results arrived in is not part of the contract). A line
    still being written (no newline yet: the test polls a running driver) is not read; in a finished file it
    would show as a missing record."""

    def read(p: Path) -> list[bytes]:
        data = p.read_bytes() if p.exists() else b""
        return sorted(data[: data.rfind(b"\n") + 1].splitlines())

    return read(out / CONVERSATIONS), read(out / DROPPED)


def keys(out: Path) -> list[str]:
    kept = [json.loads(x)["id"] for x in records(out)[0]]
    return kept + [json.loads(x)["key"] for x in records(out)[1]]


@pytest.fixture(scope="module")
def local_run(plan: Plan, settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("local")
    run_units(plan.units, OfflineRunner(settings), out, concurrency=2)
    return out


def test_a_ray_run_gives_the_local_runs_records(
    plan: Plan, settings: Settings, local_run: Path, tmp_path: Path
) -> None:
    executor = RayExecutor(ExecutorSettings(kind="ray", workers=2))
    skipped, ran = run_units(plan.units, OfflineRunner(settings), tmp_path, executor=executor)
    assert (skipped, ran) == (0, len(plan.units))
    assert records(tmp_path) == records(local_run) and records(tmp_path)[0]
    assert sorted(keys(tmp_path)) == sorted(u.key for u in plan.units)  # exactly one record per unit


def test_a_killed_worker_costs_a_retry_of_its_units_and_nothing_else(
    plan: Plan, settings: Settings, local_run: Path, tmp_path: Path
) -> None:
    notes = tmp_path / "pids"
    notes.mkdir()
    executor = RayExecutor(ExecutorSettings(kind="ray", workers=2, retries=3))
    killed: list[int] = []

    def kill_one(_: Any) -> None:
        if not killed:
            victim = executor.worker_pids()[0]
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    out = tmp_path / "out"
    run_units(plan.units, SlowRunner(settings, 0.3, notes), out, executor=executor, progress=kill_one)
    assert killed and str(killed[0]) in {p.name for p in notes.iterdir()}  # it was running units
    assert len(list(notes.iterdir())) >= 3  # the restarted worker is a new process
    assert sorted(keys(out)) == sorted(u.key for u in plan.units)  # none lost, none twice
    assert records(out) == records(local_run)  # no unit became an error


def test_a_worker_that_keeps_dying_is_a_recorded_failure(plan: Plan, settings: Settings, tmp_path: Path) -> None:
    executor = RayExecutor(ExecutorSettings(kind="ray", workers=1, retries=0))
    results = []
    for _job, result in executor.map(Suicide(), plan.units[:2]):
        results.append(result)
    assert len(results) == 2 and all(isinstance(r, WorkerLost) for r in results)
    out = tmp_path / "out"
    run_units(plan.units[:2], Suicide(), out, executor=RayExecutor(ExecutorSettings(kind="ray", workers=1, retries=0)))
    drops = [json.loads(x) for x in records(out)[1]]
    assert len(drops) == 2 and all(d["code"] == "error" and "Actor" in d["reason"] for d in drops), drops


class Suicide:
    def __call__(self, unit: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)


DRIVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from envfactory.config import Settings
    from envfactory.env.pool import EnvPool
    from envfactory.executor import ExecutorSettings, RayExecutor
    from envfactory.tasks.plan import SynthConfig, plan_units, run_units
    from envfactory.tasks.run import tool_graph
    from tests.support.ray_runners import SlowRunner

    out, notes, delay = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    settings = Settings(root=Path.cwd(), bfcl=False)
    config = SynthConfig.model_validate(
        {"envs": ["hotels", "banking", "shop"], "T": 3, "S": 2, "D": 2, "seed": 4, "out": out}
    )
    plan = plan_units(config, EnvPool(settings), tool_graph(settings, config))
    executor = RayExecutor(ExecutorSettings(kind="ray", workers=2, num_cpus=2))
    run_units(plan.units, SlowRunner(settings, delay, notes), out, executor=executor)
    """
)


def test_a_killed_driver_resumes_with_no_unit_lost_or_repeated(plan: Plan, local_run: Path, tmp_path: Path) -> None:
    out, notes = tmp_path / "out", tmp_path / "pids"
    notes.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(out), str(notes), "0.5"], cwd=ROOT, env=env)
    deadline = time.monotonic() + 240
    while len(keys(out) if out.exists() else []) < 4:
        assert driver.poll() is None and time.monotonic() < deadline, "the driver ended before it was killed"
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    partial = keys(out)
    assert 4 <= len(partial) < len(plan.units)
    rerun = subprocess.run([sys.executable, "-c", DRIVER, str(out), str(notes), "0"], cwd=ROOT, env=env, timeout=300)
    assert rerun.returncode == 0
    assert sorted(keys(out)) == sorted(u.key for u in plan.units)  # the done ones were not run again
    assert records(out) == records(local_run)


def test_an_unreachable_cluster_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(ExecutorError, match=r"cannot reach the Ray cluster at 127\.0\.0\.1:1: "):
        executor_from("ray", "127.0.0.1:1", None, 2)
    with pytest.raises(ExecutorError, match=r"^--ray-address needs --executor ray$"):
        executor_from("local", "auto", None, 2)
    with pytest.raises(ExecutorError, match=r"^--ray-address and --workers need --executor ray$"):
        executor_from("local", "auto", 2, 2)
    config = tmp_path / "synth.yaml"
    config.write_text(f"envs: [hotels]\nT: 1\nout: {tmp_path / 'out'}\n")
    start = time.monotonic()
    res = subprocess.run(
        [*(sys.executable, "-m", "envfactory.cli", "synth", "--config", str(config)), "--executor", "ray",
         "--ray-address", "ray://127.0.0.1:1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode != 0 and time.monotonic() - start < 60
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot reach the Ray cluster at ray://127.0.0.1:1" in lines[0], res.stderr


def test_an_address_where_no_ray_head_answers_is_one_line_in_seconds() -> None:
    """A reachable port that is not a head's GCS (the dashboard's, an HTTP server, the client server's without
    ray://): `ray.init` waited on it for ever, past SIGTERM. The running instance's own GCS address passes."""
    import http.server

    import ray

    from envfactory.executor import _reachable

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        start = time.monotonic()
        with pytest.raises(ExecutorError, match="no Ray head's GCS answers there"):
            executor_from("ray", f"127.0.0.1:{httpd.server_address[1]}", None, 2)
        assert time.monotonic() - start < 30
    finally:
        httpd.shutdown()
    gcs = ray.get_runtime_context().gcs_address
    _reachable(gcs)  # a head's GCS: no refusal
    with pytest.MonkeyPatch.context() as env:  # a proxy Ray's own channels do not use, nor does the probe
        for name in ("http_proxy", "https_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
            env.setenv(name, "http://127.0.0.1:1")
        _reachable(gcs)


def test_an_evaluation_on_ray_records_what_a_local_one_does(plan: Plan, settings: Settings, tmp_path: Path) -> None:
    from envfactory.eval.agent import AgentLimits
    from envfactory.eval.items import items_from_conversations, load_conversations
    from envfactory.eval.run import ATTEMPTS, EvalSettings, TurnRunner, run_eval
    from tests.support.eval import GroundTruthModels

    run_units(plan.units[:6], OfflineRunner(settings), tmp_path / "run")
    pool = EnvPool(settings)
    items = items_from_conversations(load_conversations(tmp_path / "run"), pool)
    assert len(items) >= 4
    config = EvalSettings(attempts=2)

    def lines(out: Path) -> list[dict[str, Any]]:
        rows = [json.loads(x) for x in (out / ATTEMPTS).read_text().splitlines()]
        return sorted(
            ({k: v for k, v in r.items() if k != "seconds"} for r in rows), key=lambda r: (r["item"], r["attempt"])
        )

    local = run_eval(items, GroundTruthModels(items), TurnRunner(settings, AgentLimits()), tmp_path / "l", config)
    executor = RayExecutor(ExecutorSettings(kind="ray", workers=2))
    remote = run_eval(
        items, GroundTruthModels(items), TurnRunner(settings, AgentLimits()), tmp_path / "r", config, executor=executor
    )
    assert lines(tmp_path / "r") == lines(tmp_path / "l") and len(lines(tmp_path / "r")) == 2 * len(items)
    assert remote.success_rate == local.success_rate == 1.0


def test_envgen_batch_on_ray_registers_and_records_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`envfactory envgen run --executor ray`: the driver starts its own local instance; the worker opens its own
    checkpointer and pool; two environments register, a request whose model runs out of replies is a failed row,
    the batch goes on. (A malformed metadata file is the user's mistake: refused before any run starts.)"""
    from tests.support.envgen import METADATA, SCENARIOS, code, fenced, setup_project

    broken = tmp_path / "broken_metadata.json"
    broken.write_text('{"name": "x", "domain": "space"}')
    root = setup_project(
        tmp_path, monkeypatch, {"code/generate": [fenced(code("good"))] * 2, "test/scenarios": [SCENARIOS] * 2}
    )
    command = [sys.executable, "-m", "envfactory.cli", "envgen", "run", "--executor", "ray", "--workers", "1"]
    refused = subprocess.run(
        [*command, "--metadata", str(METADATA), "--metadata", str(broken)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "250"}, cwd=ROOT,
    )  # fmt: skip
    assert refused.returncode != 0 and "broken_metadata.json" in refused.stderr and "Traceback" not in refused.stderr
    assert "envgen-" not in refused.stdout  # no run started
    res = subprocess.run(
        [*command, *["--metadata", str(METADATA)] * 3],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "250"}, cwd=ROOT,
    )  # fmt: skip
    rows = [line for line in res.stdout.splitlines() if "envgen-" in line]
    assert len(rows) == 3 and sum("registered" in r for r in rows) == 2, res.stdout + res.stderr[-3000:]
    assert sum("failed" in r for r in rows) == 1, res.stdout
    assert (root / ".envfactory" / "checkpoints.sqlite").is_file()  # written by the worker, on this machine


def test_llm_mode_synth_on_a_ray_worker_uses_the_runs_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """QueryGen units on a Ray worker: the runner carries the run's settings (the scripted model, the project),
    the worker opens its own pool and checkpointer, and the kept conversation is written by the driver."""
    from envfactory.config import get_settings
    from envfactory.tasks.plan import Unit, load_conversations, read_jsonl
    from graphs.querygen.batch import QueryGenRunner
    from tests.support.querygen import SEED, base_script, hotels_chain, pi_star, setup

    probe = setup(tmp_path / "probe", monkeypatch, {})
    setup(tmp_path, monkeypatch, base_script(pi_star(probe)))  # this process's environment only
    out = tmp_path / "run"
    config = SynthConfig.model_validate(
        {"mode": "llm", "out": str(out), "preset": "SFT_NON_CONV", "querygen": {"pass_k": 1}, "S": 1}
    )
    unit = Unit(key="hotels/t0/s0", env="hotels", task=0, state_variant=0, depth=1, seed=SEED, chain=hotels_chain())
    executor = RayExecutor(ExecutorSettings(kind="ray", workers=1))
    assert run_units([unit], QueryGenRunner(get_settings(), config), out, executor=executor) == (0, 1)
    [conv] = load_conversations(out)
    assert conv.id == unit.key and conv.provenance.generator == "llm", read_jsonl(out / "dropped.jsonl")
    assert (tmp_path / "project" / ".envfactory" / "checkpoints.sqlite").is_file()  # the worker's checkpoints


def test_units_travel_in_batches_and_each_comes_back_once_with_its_own_outcome() -> None:
    """A task carries several units (Ray's per-task cost paid once for them), fewer at the end so every queue
    stays full; each unit comes back once, a failing one as its exception, its batch-mates with their results."""
    from tests.support.ray_runners import TaskOf

    jobs = list(range(1, 201))
    executor = RayExecutor(ExecutorSettings(kind="ray", workers=2, in_flight=2, batch=16))
    out = dict(executor.map(TaskOf(), jobs))
    assert sorted(out) == jobs
    failed = {j for j, r in out.items() if isinstance(r, ValueError)}
    assert failed == {j for j in jobs if j % 13 == 0} and all(str(j) in str(out[j]) for j in failed)
    tasks = [r[1] for j, r in out.items() if j not in failed]
    assert all(r[0] == j for j, r in out.items() if j not in failed)
    assert len(set(tasks)) <= len(jobs) // 4, len(set(tasks))  # batched: far fewer tasks than units
    one = RayExecutor(ExecutorSettings(kind="ray", workers=2, batch=1))
    singles = {r[1] for r in dict(one.map(TaskOf(), jobs[:20])).values() if isinstance(r, tuple)}
    assert len(singles) == 19  # one task a unit (job 13 failed)


def test_a_unit_past_its_time_is_stopped_and_the_batch_goes_on() -> None:
    """`corpus compile --spec-timeout` on Ray: a spec whose pattern backtracks for ever held its worker, and the
    batch, for ever. A unit running past `unit_timeout` has its worker killed and comes back lost, not retried; the
    units queued behind it run on a fresh worker, and every unit comes back exactly once."""
    from tests.support.executor import HangsOn

    executor = RayExecutor(ExecutorSettings(kind="ray", workers=2, in_flight=2, unit_timeout=5))
    started = time.monotonic()
    results = list(executor.map(HangsOn(stuck=3), list(range(12))))
    assert sorted(unit for unit, _ in results) == list(range(12))
    lost = {unit: r for unit, r in results if isinstance(r, WorkerLost)}
    assert list(lost) == [3] and "ran longer than 5 s and was stopped" in lost[3].reason
    assert all(r == unit * 10 for unit, r in results if unit != 3)
    assert time.monotonic() - started < 60  # stopped, not waited for
    assert executor.actors == []  # every worker, the fresh one included, is gone


def test_a_units_time_starts_when_it_does_not_while_its_worker_starts() -> None:
    """A worker that takes longer to start (its runner unpickled: a pool, a model) than a unit may run does not make
    its first units overdue: the clock of a worker's first task starts once the worker answers."""
    from tests.support.ray_runners import SlowToStart

    executor = RayExecutor(ExecutorSettings(kind="ray", workers=2, in_flight=2, unit_timeout=3))
    out = dict(executor.map(SlowToStart(4.5), list(range(6))))
    assert out == {unit: unit * 10 for unit in range(6)}


def test_a_unit_that_keeps_killing_its_worker_costs_itself_alone() -> None:
    """Past its restarts a worker is dead, and every task sent to it failed: a batch of `corpus compile` lost all
    its later specs to one that ran out of memory again and again. The dead worker is replaced; the units of the
    task it was running run one a task, so only the one that kills it is lost; the tasks queued behind go on."""
    from tests.support.executor import DiesOn

    for timeout in (None, 30.0):
        executor = RayExecutor(ExecutorSettings(kind="ray", workers=1, retries=1, unit_timeout=timeout))
        results = list(executor.map(DiesOn(fatal=3), list(range(10))))
        assert sorted(unit for unit, _ in results) == list(range(10))
        lost = {unit: r for unit, r in results if isinstance(r, WorkerLost)}
        assert list(lost) == [3] and "ActorDiedError" in lost[3].reason, lost
        assert all(r == unit * 10 for unit, r in results if unit != 3)


@pytest.mark.timeout(120)
def test_more_workers_than_the_cluster_has_cpus_still_finish() -> None:
    """`--workers 4` on a 2-CPU cluster: the two workers that are never placed held their queued units for ever, and
    the run hung. Once the placed workers are idle with nothing left to hand out, the others are given up and their
    units run on the idle ones."""
    from tests.support.executor import DiesOn

    executor = RayExecutor(ExecutorSettings(kind="ray", workers=4, in_flight=2))
    assert dict(executor.map(DiesOn(fatal=-1), list(range(20)))) == {unit: unit * 10 for unit in range(20)}
    assert executor.actors == []


def test_a_units_exception_that_cannot_travel_fails_that_unit_alone() -> None:
    """A unit's exception is returned to the driver, pickled: one that could not be pickled (or rebuilt) failed every
    unit of its task (up to `batch`), its own message lost; a unit's `sys.exit` killed the worker three times over
    and came back as 'ActorDiedError'. Each is now that unit's failure, with its type and message."""
    from tests.support.ray_runners import FailsOddly

    jobs = list(range(1, 21))
    out = dict(RayExecutor(ExecutorSettings(kind="ray", workers=2, batch=16)).map(FailsOddly(), jobs))
    assert sorted(out) == jobs
    odd = (5, 7, 9, 11)
    assert {j: r for j, r in out.items() if j not in odd} == {j: j * 10 for j in jobs if j not in odd}
    assert type(out[11]).__name__ == "LocalError" and str(out[11]) == "job 11 is local"  # its own type
    for job, says in ((5, "_HoldsALock: job 5 holds a lock"), (7, "_NeedsAKeyword: job 7 needs a keyword")):
        assert isinstance(out[job], RuntimeError) and str(out[job]) == says, out[job]
    assert isinstance(out[9], RuntimeError) and "SystemExit" in str(out[9]) and "3" in str(out[9]), out[9]
