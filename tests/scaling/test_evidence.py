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
from envfactory.run_settings import file_sha256
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
    moved = tmp_path / "moved" / "run"  # the same run, copied elsewhere (from the cluster it was made on)
    shutil.copytree(run, moved)
    other = tmp_path / "other_run"  # another run with the same composition: other held-out tasks
    shutil.copytree(run, other)
    (other / "heldout.jsonl").write_text((run / "heldout.jsonl").read_text().replace("Lisbon", "Porto"))
    mine = file_sha256([run / "heldout.jsonl"])

    def evaluated(kind: str, source: Path, sha: str) -> Path:
        folder = tmp_path / f"eval-{kind}-{source.name}-{sha[:6]}"
        shutil.copytree(evaluation, folder, dirs_exist_ok=True)
        data = {"source": kind, "split": "heldout", "sha256": sha}
        record = {"command": "eval", "settings": {"data": data}, "context": {"source": str(source)}}
        (folder / "settings.json").write_text(json.dumps(record))
        return folder

    for n, (kind, source, sha, refused) in enumerate(
        [
            ("run", run, mine, False),
            ("run", tmp_path / "cluster" / "run", mine, False),  # recorded where it was: the sha says which run
            ("run", other, file_sha256([other / "heldout.jsonl"]), True),
            ("file", other / "heldout.jsonl", file_sha256([other / "heldout.jsonl"]), True),  # a run's file, given
            ("file", tmp_path / "shared-test.jsonl", "0" * 64, False),  # a shared test set: any run's model
        ]
    ):
        res = _cli("add", str(tmp_path / f"t{n}.csv"), "--run", str(moved), "--eval", str(evaluated(kind, source, sha)))
        if refused:
            assert res.returncode == 1 and "evaluated other tasks than heldout.jsonl" in res.stderr, res.stderr
            assert res.stderr.count("\n") == 1
        else:
            assert res.returncode == 0, res.stderr
    table, good = tmp_path / "t0.csv", evaluated("run", run, mine)
    again = _cli("add", str(table), "--run", str(run), "--eval", str(good))
    assert again.returncode == 1 and "row 1 is this run already" in again.stderr, again.stderr
    assert len(load_table(table).runs) == 1
    labelled = _cli("add", str(table), "--run", str(run), "--eval", str(good), "--label", "seed 2")
    assert labelled.returncode == 0, labelled.stderr


def test_a_run_that_kept_no_training_conversation_is_no_row(runs: tuple[Path, Path], tmp_path: Path) -> None:
    run, evaluation = runs
    empty = tmp_path / "run"
    shutil.copytree(run, empty)
    summary = json.loads((empty / "summary.json").read_text())
    summary["composition"].update(A=0, T=0)  # every training unit dropped, the held-out split kept
    (empty / "summary.json").write_text(json.dumps(summary))
    (empty / "settings.json").unlink(missing_ok=True)
    res = _cli("add", str(tmp_path / "t.csv"), "--run", str(empty), "--eval", str(evaluation))
    assert res.returncode == 1 and "kept no training conversation" in res.stderr and res.stderr.count("\n") == 1


def test_a_row_needs_a_whole_evaluation_of_held_out_tasks_in_one_metric(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    """What `scaling add` accepted and made a row of: an evaluation of the training split (score 1.0), one where no
    attempt ran (score 0.0), a partial one (--limit, attempts that never ran), a second metric in one table."""
    run, evaluation = runs
    record = json.loads((evaluation / "settings.json").read_text())

    def variant(name: str, *, settings: dict | None = None, summary: dict | None = None, failures: str = "") -> Path:
        folder = tmp_path / name
        shutil.copytree(evaluation, folder)
        if settings is not None:
            (folder / "settings.json").write_text(json.dumps(settings))
        if summary is not None:
            base = json.loads((folder / "summary.json").read_text())
            (folder / "summary.json").write_text(json.dumps({**base, **summary}))
        if failures:
            (folder / "failures.jsonl").write_text(failures)
        return folder

    train = {"source": "run", "split": "train", "sha256": file_sha256([run / "conversations.jsonl"])}
    refused = {
        "the training split": (
            variant("train", settings={**record, "settings": {**record["settings"], "data": train}}),
            "training conversations",
        ),
        "no attempt ran": (variant("none", summary={"attempts": 0, "items": 0}), "no attempt of this evaluation ran"),
        "--limit": (
            variant("limit", settings={**record, "context": {**(record.get("context") or {}), "limit": 2}}),
            "--limit 2",
        ),
        "attempts missing": (variant("short", summary={"attempts": 1}), "did not run"),
        "a failure never rerun": (
            variant("failed", failures='{"item": "nope", "attempt": 0, "reason": "OSError"}\n'),
            "never ran",
        ),
    }
    for case, (folder, needle) in refused.items():
        res = _cli("add", str(tmp_path / "t.csv"), "--run", str(run), "--eval", str(folder))
        assert res.returncode == 1 and needle in res.stderr and res.stderr.count("\n") == 1, (case, res.stderr)
    assert not (tmp_path / "t.csv").exists()
    table = tmp_path / "m.csv"
    assert _cli("add", str(table), "--run", str(run), "--eval", str(evaluation)).returncode == 0
    assert load_table(table).runs[0].metric == "success_rate"
    mixed = _cli("add", str(table), "--run", str(run), "--eval", str(evaluation), "--metric", "mean_reward")
    assert mixed.returncode == 1 and "one table, one metric" in mixed.stderr, mixed.stderr


def test_a_table_add_would_damage_or_a_score_that_is_none_is_refused(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """`scaling add` rewrote a table without its other columns ('notes' and its values gone), died in a traceback on a
    table with a compute column (an evaluation gives none) and on a summary's score outside [0, 1] or NaN, and took
    `"success_rate": true` as 1.0."""
    from envfactory.scaling.errors import RunTableError
    from envfactory.scaling.evidence import add_run, run_from

    run, evaluation = runs
    row = run_from(run, evaluation, metric="success_rate", model=None, label=None)
    noted = tmp_path / "noted.csv"
    noted.write_text("apps,tasks,states,depth,score,notes\n1,2,1,1,0.1,first try\n")
    with pytest.raises(RunTableError, match="holds column 'notes', which a run table does not keep"):
        add_run(noted, row)
    assert "first try" in noted.read_text()
    beside = tmp_path / "beside.json"
    beside.write_text(json.dumps({"runs": [{"A": 1, "T": 2, "S": 1, "D": 1, "score": 0.1}], "notes": "mine"}))
    with pytest.raises(RunTableError, match="holds 'notes' beside runs"):
        add_run(beside, row)
    costed = tmp_path / "costed.csv"
    costed.write_text("A,T,S,D,score,compute\n1,2,1,1,0.1,1e18\n")
    with pytest.raises(RunTableError, match="no compute to give this run"):
        add_run(costed, row)
    plain = tmp_path / "plain.csv"
    plain.write_text("apps,tasks,states,depth,score\n1,2,1,1,0.1\n")
    assert len(add_run(plain, row).runs) == 2  # known columns only: nothing is lost
    trailing = tmp_path / "trailing.csv"  # a spreadsheet's export: an empty last column, nothing in it to lose
    trailing.write_text("A,T,S,D,score,\n1,2,1,1,0.1,\n")
    assert len(add_run(trailing, row).runs) == 2
    unnamed = tmp_path / "unnamed.csv"
    unnamed.write_text("A,T,S,D,score,\n1,2,1,1,0.1,kept\n")
    with pytest.raises(RunTableError, match="holds column ''"):
        add_run(unnamed, row)

    damaged = tmp_path / "damaged"
    shutil.copytree(evaluation, damaged)
    summary = json.loads((damaged / "summary.json").read_text())
    for value, needle in ((1.5, "is no run table score"), (float("nan"), "is no run table score"), (True, "has no")):
        (damaged / "summary.json").write_text(json.dumps({**summary, "success_rate": value}))
        with pytest.raises(RunTableError, match=needle):
            run_from(run, damaged, metric="success_rate", model=None, label=None)
