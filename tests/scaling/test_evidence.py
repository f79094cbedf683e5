"""The loop's last step: `envfactory scaling add` builds the run table from a real synth run (its training
composition) and a real evaluation (its score), and `scaling fit` reads that table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.eval.agent import AgentLimits
from envfactory.eval.items import items_from_conversations, load_conversations
from envfactory.eval.run import EvalSettings, run_eval, turn_runner
from envfactory.llm.scripted import ScriptedChatModel
from envfactory.scaling.table import load_table
from envfactory.tasks.plan import SynthConfig
from envfactory.tasks.run import run_batch
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("loop")
    settings = Settings(root=ROOT, bfcl=False, data_dir=base / "data")
    config = {"envs": ["hotels", "banking"], "T": 2, "S": 1, "D": 2, "seed": 2, "plot": False}
    run_batch(SynthConfig.model_validate({**config, "out": base / "run", "holdout_tasks": 0.5}), settings)
    pool = EnvPool(settings)
    items = items_from_conversations(load_conversations(base / "run", "heldout"), pool)
    script: list[object] = []
    for n, item in enumerate(items):  # solve every other turn: a score strictly between 0 and 1
        if n % 2 == 0:
            script.append({"tool_calls": [{"name": c.name, "args": dict(c.arguments)} for c in item.ground_truth]})
        script.append("Done.")
    run_eval(
        items, lambda: ScriptedChatModel(script=script), turn_runner(pool, AgentLimits()), base / "eval", EvalSettings()
    )
    return base / "run", base / "eval"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ENVFACTORY_ROOT": str(ROOT), "ENVFACTORY_BFCL": "false", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "envfactory.cli", "scaling", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_row_from_a_synth_run_and_its_evaluation(runs: tuple[Path, Path], tmp_path: Path) -> None:
    run, evaluation = runs
    composition = json.loads((run / "summary.json").read_text())["composition"]
    assert composition == {"A": 2, "T": 1, "S": 1, "D": 2, "seed": 2, "mode": "offline"}  # T: the training split's
    score = json.loads((evaluation / "summary.json").read_text())["success_rate"]
    assert 0.0 < score < 1.0
    table = tmp_path / "runs.csv"
    for label in ("a", "b"):
        res = _cli("add", str(table), "--run", str(run), "--eval", str(evaluation), "--model", "m", "--label", label)
        assert res.returncode == 0, res.stderr
    rows = load_table(table).runs
    assert [(r.apps, r.tasks, r.states, r.depth, r.label) for r in rows] == [(2, 1, 1, 2, "a"), (2, 1, 1, 2, "b")]
    assert rows[0].score == pytest.approx(score) and rows[0].model == "m"


def test_bad_inputs_are_one_line_errors(runs: tuple[Path, Path], tmp_path: Path) -> None:
    run, evaluation = runs
    for args, needle in (
        (["--run", str(tmp_path), "--eval", str(evaluation)], "synth run summary"),
        (["--run", str(run), "--eval", str(tmp_path)], "evaluation summary"),
        (["--run", str(run), "--eval", str(evaluation), "--metric", "vibes"], "--metric is success_rate"),
    ):
        res = _cli("add", str(tmp_path / "t.csv"), *args)
        assert res.returncode == 1 and needle in res.stderr and res.stderr.count("\n") == 1, res.stderr


def test_an_evaluation_of_another_run_or_the_same_row_twice_is_refused(runs: tuple[Path, Path], tmp_path: Path) -> None:
    run, evaluation = runs
    other = tmp_path / "other_run"
    shutil.copytree(run, other)  # the same composition, another run
    record = {"command": "eval", "settings": {"data": {"source": "run", "split": "heldout"}}, "context": {}}
    for source, refused in ((run, False), (other, True), (tmp_path / "gone", True)):
        shutil.copytree(evaluation, tmp_path / "eval", dirs_exist_ok=True)
        record["context"] = {"source": str(source)}
        (tmp_path / "eval" / "settings.json").write_text(json.dumps(record))
        res = _cli("add", str(tmp_path / f"{source.name}.csv"), "--run", str(run), "--eval", str(tmp_path / "eval"))
        if refused:
            assert res.returncode == 1 and f"evaluated the run {source}, not {run}" in res.stderr, res.stderr
            assert res.stderr.count("\n") == 1
        else:
            assert res.returncode == 0, res.stderr
    record["context"] = {"source": str(run)}
    (tmp_path / "eval" / "settings.json").write_text(json.dumps(record))
    again = _cli("add", str(tmp_path / f"{run.name}.csv"), "--run", str(run), "--eval", str(tmp_path / "eval"))
    assert again.returncode == 1 and "row 1 is this run already" in again.stderr, again.stderr
    assert len(load_table(tmp_path / f"{run.name}.csv").runs) == 1
    labelled = _cli(
        "add",
        str(tmp_path / f"{run.name}.csv"),
        "--run",
        str(run),
        "--eval",
        str(tmp_path / "eval"),
        "--label",
        "seed 2",
    )
    assert labelled.returncode == 0, labelled.stderr
