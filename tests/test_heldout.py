"""Held-out splits: `envfactory synth` reserves environments (unseen apps) and tasks (unseen tasks) for
evaluation, records them in the run, and export never emits a held-out conversation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envfactory.config import Settings
from envfactory.eval.items import load_conversations as eval_conversations
from envfactory.export.errors import ExportError
from envfactory.export.files import training_conversations
from envfactory.records.run_folder import CONVERSATIONS, HELDOUT
from envfactory.tasks.plan import SynthConfig, heldout_tasks, read_jsonl
from envfactory.tasks.run import run_batch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("heldout") / "run"
    settings = Settings(root=ROOT, bfcl=False, data_dir=tmp_path_factory.mktemp("data"))
    config = {"envs": ["hotels", "banking", "shop"], "T": 2, "S": 2, "D": 1, "seed": 5, "out": out, "plot": False}
    run_batch(SynthConfig.model_validate({**config, "holdout_envs": ["shop"], "holdout_tasks": 0.5}), settings)
    return out


def test_the_run_records_its_held_out_split_and_keeps_it_apart(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())["summary"]
    held_units = set(summary["heldout_units"])
    assert summary["heldout_envs"] == ["shop"] and summary["heldout"] > 0
    assert {u for u in held_units if u.startswith("shop/")} == {f"shop/t{t}/s{s}" for t in range(2) for s in range(2)}
    for env in ("hotels", "banking"):  # half the tasks, with every state variant of a held-out task
        tasks = {u.split("/")[1] for u in held_units if u.startswith(f"{env}/")}
        assert len(tasks) == 1 and {f"{env}/{t}/s{s}" for t in tasks for s in range(2)} <= held_units
    train = {r["id"] for r in read_jsonl(run / CONVERSATIONS)}
    held = {r["id"] for r in read_jsonl(run / HELDOUT)}
    assert train and held and not train & held and held <= held_units and not train & held_units


def test_export_never_emits_held_out_conversations(run: Path, tmp_path: Path) -> None:
    assert {c.id for c in training_conversations(run)} == {r["id"] for r in read_jsonl(run / CONVERSATIONS)}
    with pytest.raises(ExportError, match="held-out split, kept for evaluation"):
        training_conversations(run / HELDOUT)
    mixed = run / "mixed.jsonl"  # held-out lines pasted into a training file: left out by the run's record
    mixed.write_text((run / CONVERSATIONS).read_text() + (run / HELDOUT).read_text())
    held = {r["id"] for r in read_jsonl(run / HELDOUT)}
    assert not {c.id for c in training_conversations(mixed)} & held


def test_evaluation_reads_the_held_out_split(run: Path) -> None:
    assert {c.id for c in eval_conversations(run, "heldout")} == {r["id"] for r in read_jsonl(run / HELDOUT)}


def test_the_choice_is_seeded_and_bounded() -> None:
    config = SynthConfig.model_validate({"holdout_tasks": 0.25, "seed": 1})
    assert (
        heldout_tasks(config, "hotels", 8) == heldout_tasks(config, "hotels", 8)
        and len(heldout_tasks(config, "hotels", 8)) == 2
    )
    assert heldout_tasks(SynthConfig.model_validate({}), "hotels", 8) == set()
    with pytest.raises(ValueError):
        SynthConfig.model_validate({"holdout_tasks": 1.0})


def test_a_held_out_environment_outside_the_run_is_a_config_error(tmp_path: Path) -> None:
    from envfactory.tasks.plan import SynthConfigError

    settings = Settings(root=ROOT, bfcl=False, data_dir=tmp_path / "data")
    config = {"envs": ["hotels"], "T": 1, "out": tmp_path / "run", "plot": False, "holdout_envs": ["flights"]}
    with pytest.raises(
        SynthConfigError, match=r"holdout_envs names environment\(s\) this run does not use: \['flights'\]"
    ):
        run_batch(SynthConfig.model_validate(config), settings)
