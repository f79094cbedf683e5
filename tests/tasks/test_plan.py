"""Batch runs: the A×T×S×D plan, JSONL output one unit at a time, resume after a real SIGKILL, torn
lines, retried errors, statistics and their plot, config errors through the CLI."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.records.run_folder import CONVERSATIONS, DROPPED, in_id_order
from envfactory.tasks.offline import UnitOutcome, synthesize_offline
from envfactory.tasks.plan import (
    MAX_PLANNED,
    SynthConfig,
    SynthConfigError,
    Unit,
    choose_envs,
    load_config,
    load_conversations,
    plan_units,
    read_jsonl,
    run_units,
    summarize,
)
from envfactory.tasks.stats import dataset_stats, plot_stats
from envfactory.toolgraph import ToolGraph, save_graph
from tests.support.paths import ROOT

PROMPTS = ROOT / "prompts"


def offline(pool: EnvPool):  # type: ignore[no-untyped-def]
    def run(unit: Unit) -> UnitOutcome:
        return synthesize_offline(
            pool, unit.chain, key=unit.key, seed=unit.seed, state_variant=unit.state_variant, depth=unit.depth,
            prompts_dir=PROMPTS,
        )  # fmt: skip

    return run


def test_plan_composes_a_t_s_d_and_is_deterministic(pool: EnvPool, graph: ToolGraph) -> None:
    config = SynthConfig.model_validate({"A": 3, "T": 2, "S": 2, "D": 2, "seed": 5})
    plan = plan_units(config, pool, graph)
    assert len(plan.envs) == 3 and set(plan.envs) <= set(pool.native_names())
    assert len(plan.units) == 3 * 2 * 2 - 2 * sum(plan.shortfall.values())
    assert len({u.key for u in plan.units}) == len(plan.units)
    assert {u.depth for u in plan.units} == {2}
    by_task: dict[tuple[str, int], list[Unit]] = {}
    for u in plan.units:
        by_task.setdefault((u.env, u.task), []).append(u)
    for variants in by_task.values():  # S initial databases of one task: one chain, different seeds
        assert len({tuple(v.chain.tools) for v in variants}) == 1 and len({v.seed for v in variants}) == 2
    assert plan_units(config, pool, graph) == plan
    other = plan_units(config.model_copy(update={"seed": 6}), pool, graph)
    assert [u.seed for u in other.units] != [u.seed for u in plan.units]


@pytest.mark.parametrize("turns", [(1, 1), (2, 2), (2, 4), (5, 9)])
def test_llm_mode_cuts_each_chain_into_the_plans_turns(pool: EnvPool, graph: ToolGraph, turns: tuple[int, int]) -> None:
    """One `turns` knob for both modes: llm mode cuts each chain into a seeded count from the range (at most one
    turn per tool), consecutive and covering the chain; offline mode passes the range on to its joiner."""
    base = {"A": 3, "T": 3, "seed": 2, "chain_length": [2, 5], "turns": list(turns)}
    plan = plan_units(SynthConfig.model_validate({**base, "mode": "llm"}), pool, graph)
    assert plan.units
    for unit in plan.units:
        chain = unit.chain
        assert [t for turn in chain.turns for t in turn] == chain.tools and all(chain.turns)
        assert len(chain.turns) <= min(turns[1], len(chain.tools))
        assert len(chain.turns) >= min(turns[0], len(chain.tools))
    again = plan_units(SynthConfig.model_validate({**base, "mode": "llm"}), pool, graph)
    assert [u.chain.turns for u in again.units] == [u.chain.turns for u in plan.units]  # seeded
    offline = plan_units(SynthConfig.model_validate({**base, "mode": "offline"}), pool, graph)
    assert {u.turns for u in offline.units} == {turns}


def test_run_resume_torn_line_and_retried_errors(tmp_path: Path, pool: EnvPool, graph: ToolGraph) -> None:
    config = SynthConfig.model_validate({"envs": ["hotels", "banking"], "T": 3, "S": 2, "seed": 1})
    plan = plan_units(config, pool, graph)
    run = offline(pool)
    first = plan.units[:5]
    skipped, ran = run_units(first, run, tmp_path, concurrency=2)
    assert (skipped, ran) == (0, 5)
    lines = read_jsonl(tmp_path / CONVERSATIONS) + read_jsonl(tmp_path / DROPPED)
    assert len(lines) == 5
    # a kill mid-write leaves half a line: it is cut, and that unit runs again
    with (tmp_path / CONVERSATIONS).open("a") as f:
        f.write('{"id": "hotels/t9/s9", "servers": ["hot')

    def flaky(unit: Unit) -> UnitOutcome:
        if unit.key == plan.units[6].key:
            raise ConnectionError("LLM server down")
        return run(unit)

    skipped, ran = run_units(plan.units, flaky, tmp_path, concurrency=2)
    assert (skipped, ran) == (5, len(plan.units) - 5)
    errors = [r for r in read_jsonl(tmp_path / DROPPED) if r["code"] == "error"]
    assert [e["key"] for e in errors] == [plan.units[6].key] and "LLM server down" in errors[0]["reason"]
    skipped, ran = run_units(plan.units, run, tmp_path)  # only the errored unit runs again
    assert (skipped, ran) == (len(plan.units) - 1, 1)
    summary = summarize(plan, tmp_path, skipped)
    assert summary.kept + summary.dropped == len(plan.units)
    assert "error" not in summary.dropped_by_code
    keys = [r["id"] for r in read_jsonl(tmp_path / CONVERSATIONS)]
    assert len(keys) == len(set(keys)) == summary.kept
    # a middle row that is valid JSON but no record of the run: one line naming it (it was a 45-line traceback)
    rows = (tmp_path / DROPPED).read_text().splitlines()
    for odd in ('{"x": 1}', "[1, 2]", '{"key": 3, "code": "error"}'):
        (tmp_path / DROPPED).write_text("\n".join([rows[0], odd, *rows[1:]]) + "\n")
        with pytest.raises(SynthConfigError, match=r"dropped\.jsonl: row 2 is no record of a run .*'key' and 'code'"):
            run_units(plan.units, run, tmp_path)


def test_stats_and_plot(tmp_path: Path, pool: EnvPool, graph: ToolGraph) -> None:
    config = SynthConfig.model_validate({"envs": ["hotels", "flights", "shop"], "T": 3, "seed": 2})
    plan = plan_units(config, pool, graph)
    run_units(plan.units, offline(pool), tmp_path)
    conversations = load_conversations(tmp_path)
    stats = dataset_stats(conversations)
    assert stats.conversations == len(conversations) > 0
    assert stats.turns == sum(len(c.nodes) for c in conversations) == len(stats.steps_per_turn)
    calls = sum(len(n.raw_tool_call) for c in conversations for n in c.nodes)
    assert sum(stats.tool_calls.values()) == calls == sum(stats.calls_per_turn)
    assert stats.by_generator == {"template": len(conversations)}
    # a template turn: one step per call plus the closing answer (the lists in the conversations' id order)
    assert stats.steps_per_turn == [len(n.raw_tool_call) + 1 for c in in_id_order(conversations) for n in c.nodes]
    png = plot_stats(stats, tmp_path / "stats.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def _cli_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ENVFACTORY_ROOT": str(ROOT),
        "ENVFACTORY_DATA_DIR": str(tmp_path / "data"),
        "ENVFACTORY_BFCL": "false",
        "HF_HUB_OFFLINE": "1",
    }


def _lines(out: Path) -> int:
    return sum(len(read_jsonl(out / name)) for name in (CONVERSATIONS, DROPPED))


def test_cli_resumes_after_sigkill_without_duplicates_or_losses(tmp_path: Path, graph: ToolGraph) -> None:
    graph_file = save_graph(graph, tmp_path / "graph.json")
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    base = {"T": 3, "S": 2, "D": 1, "seed": 3, "concurrency": 1, "graph": str(graph_file), "plot": False}
    cfg = tmp_path / "synth.yaml"
    cfg.write_text(yaml.safe_dump({**base, "out": str(killed)}))
    cmd = [sys.executable, "-m", "envfactory.cli", "synth", "--config", str(cfg)]
    proc = subprocess.Popen(cmd, env=_cli_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and _lines(killed) < 10:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = _lines(killed)
    assert proc.returncode == -signal.SIGKILL
    assert before >= 10, "the run wrote nothing before it was killed"
    done = subprocess.run(cmd, env=_cli_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    cfg.write_text(yaml.safe_dump({**base, "out": str(clean)}))
    fresh = subprocess.run(cmd, env=_cli_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    planned = json.loads((clean / "summary.json").read_text())["summary"]["planned"]
    assert before < planned, "the run finished before the kill: nothing was resumed"
    for name in (CONVERSATIONS, DROPPED):
        resumed = read_jsonl(killed / name)
        keys = [r.get("id", r.get("key")) for r in resumed]
        assert len(keys) == len(set(keys)), f"duplicates in {name}"
        # the same units with the same content as an uninterrupted run (order may differ)
        by_key = lambda rows: {r.get("id", r.get("key")): r for r in rows}  # noqa: E731
        assert by_key(resumed) == by_key(read_jsonl(clean / name))
    summary = json.loads((killed / "summary.json").read_text())["summary"]
    assert summary["kept"] + summary["dropped"] == planned
    assert summary["skipped"] == before
    assert "N = " in done.stdout


def test_a_second_run_on_a_folder_being_written_is_refused(tmp_path: Path, graph: ToolGraph) -> None:
    """A reviewer ran two syntheses on one --out at once: both exited 0 with every record twice, summaries that
    disagreed with the logs, and an export of doubled rows. The second is refused in one line; once the first is
    over (its process gone, however it ended), the folder is free."""
    from envfactory.inputs import exclusive_folder

    out = tmp_path / "run"
    cfg = tmp_path / "synth.yaml"
    graph_file = save_graph(graph, tmp_path / "graph.json")
    cfg.write_text(yaml.safe_dump({"envs": ["hotels"], "T": 1, "S": 1, "out": str(out), "graph": str(graph_file)}))
    cmd = [sys.executable, "-m", "envfactory.cli", "synth", "--config", str(cfg)]
    with exclusive_folder(out, "envfactory synth"):  # the first run, still writing
        second = subprocess.run(cmd, env=_cli_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert second.returncode == 1 and second.stderr.count("\n") == 1, second.stderr
    assert f"error: {out} is being written by another `envfactory synth` (pid {os.getpid()})" in second.stderr
    assert not (out / CONVERSATIONS).exists() and not (out / "settings.json").exists()  # the first run's record
    with exclusive_folder(out, "envfactory synth"), exclusive_folder(out, "envfactory synth"):
        pass  # held again by the process that holds it (the CLI around the batch): it goes on
    after = subprocess.run(cmd, env=_cli_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert after.returncode == 0 and (out / CONVERSATIONS).is_file(), after.stderr


def test_config_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("T: 0\n")
    with pytest.raises(SynthConfigError, match="T"):
        load_config(bad)
    bad.write_text("chain_length: [4, 2]\n")
    with pytest.raises(SynthConfigError, match="chain_length"):
        load_config(bad)
    bad.write_text("tasks_per_env: 3\n")
    proc = subprocess.run(
        [sys.executable, "-m", "envfactory.cli", "synth", "--config", str(bad)],
        env=_cli_env(tmp_path), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: synth config") and "tasks_per_env" in proc.stderr
    assert "Traceback" not in proc.stderr
    with pytest.raises(SynthConfigError, match="unknown environment"):
        plan_units(SynthConfig(envs=["nope"]), EnvPool(Settings(root=ROOT, bfcl=False)), ToolGraph())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ht/s01²9٣_-", min_size=1, max_size=12), min_size=1, max_size=12), st.randoms())
def test_id_order_is_one_order_whatever_the_file_order(ids: list[str], rnd: random.Random) -> None:
    """The order export and the statistics read conversations in: the same for any order of the same ids, never
    raising on odd digits (`²`, Arabic-Indic), and numbers read as numbers."""
    first = [c.id for c in in_id_order([SimpleNamespace(id=i) for i in ids])]  # type: ignore[misc]
    shuffled = list(ids)
    rnd.shuffle(shuffled)
    assert [c.id for c in in_id_order([SimpleNamespace(id=i) for i in shuffled])] == first  # type: ignore[misc]
    assert sorted(first) == sorted(ids)


def test_id_order_reads_numbers_as_numbers_of_any_length() -> None:
    ids = ["h/t10/s0", "h/t2/s1", "h/t2/s0", "h/t" + "9" * 5000, "h/t02/s0", "a/t3"]
    got = [c.id for c in in_id_order([SimpleNamespace(id=i) for i in ids])]  # type: ignore[misc]
    assert got == ["a/t3", "h/t02/s0", "h/t2/s0", "h/t2/s1", "h/t10/s0", "h/t" + "9" * 5000]


def test_a_runs_size_counts_the_environments_it_will_use(pool: EnvPool) -> None:
    """`T: 1000000` with neither A nor envs passed the A·T·S limit as 1·T·S and then planned 9 million units in
    silence (found by a reviewer): the limit holds with the environments the run chooses, the listed ones, or A."""
    n = len(choose_envs(SynthConfig.model_validate({}), pool))
    assert n > 1
    tasks = MAX_PLANNED // n + 1  # within the limit for one environment, past it for the run's n
    with pytest.raises(SynthConfigError, match=f"more than one run plans .*{n} environments"):
        choose_envs(SynthConfig.model_validate({"T": tasks}), pool)
    with pytest.raises(ValueError, match="more than one run plans"):
        SynthConfig.model_validate({"T": tasks, "envs": pool.native_names()[:n]})
    assert choose_envs(SynthConfig.model_validate({"T": tasks, "A": 1}), pool)  # one environment: within it
    for bad in ({"envs": []}, {"T": True}, {"out": ""}, {"out": "  "}, {"seed": 1.5}):
        with pytest.raises(ValueError):
            SynthConfig.model_validate(bad)
    assert SynthConfig.model_validate({"out": "~/runs/a"}).folder() == Path.home() / "runs" / "a"


def test_an_llm_runs_preset_and_overrides_are_checked_with_the_config(tmp_path: Path) -> None:
    """`preset: NOPE` or `querygen: {pass_kk: 2}` loaded, recorded settings.json, then dropped every unit as an error
    — which the next run, refused for other settings, could not retry: one line at load now."""
    for extra, needle in (
        ("preset: NOPE", "unknown QueryGen preset 'NOPE'"),
        ("querygen: {pass_kk: 2}", "QueryGen override 'pass_kk'"),
    ):
        path = tmp_path / "c.yaml"
        path.write_text(f"mode: llm\n{extra}\n")
        with pytest.raises(SynthConfigError, match=needle):
            load_config(path)
    path.write_text("mode: offline\npreset: NOPE\n")  # offline runs ask no model: nothing to check
    assert load_config(path).preset == "NOPE"
    path.write_text("mode: llm\npreset: RL_NON_CONV\nquerygen: {pass_k: 2}\n")
    assert load_config(path).querygen == {"pass_k": 2}
