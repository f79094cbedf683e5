"""Held-out splits: `envfactory synth` reserves environments (unseen apps) and tasks (unseen tasks) for
evaluation, records them in the run, and export never emits a held-out conversation."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from envfactory.config import Settings
from envfactory.eval.items import load_conversations as eval_conversations
from envfactory.export.errors import ExportError
from envfactory.export.files import training_conversations
from envfactory.records.run_folder import CONVERSATIONS, HELDOUT
from envfactory.tasks.plan import SynthConfig, heldout_tasks, read_jsonl
from envfactory.tasks.run import plan_batch, run_batch, training_composition
from tests.support.paths import ROOT


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


def test_a_killed_runs_held_out_lines_stay_out_of_export_and_the_cli_says_the_run_is_unfinished(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed run has no summary.json yet: its heldout.jsonl was ignored, so held-out lines in the training file
    were exported; and such a run was exported without a word that it had not finished."""
    import shutil

    from tests.support.cli import run_cli

    killed = tmp_path / "killed"
    shutil.copytree(run, killed)
    (killed / "summary.json").unlink()
    with (killed / CONVERSATIONS).open("a") as f:
        f.write((killed / HELDOUT).read_text())
    held = {r["id"] for r in read_jsonl(run / HELDOUT)}
    assert held and not {c.id for c in training_conversations(killed)} & held
    monkeypatch.setenv("ENVFACTORY_DATA_DIR", str(tmp_path / "data"))
    done = run_cli(["export", str(killed), "--format", "trl-sft", "--out", str(tmp_path / "sft")])
    assert done.code == 0 and "has no summary.json: the run did not finish" in done.stderr, done
    finished = run_cli(["export", str(run), "--format", "trl-sft", "--out", str(tmp_path / "sft2")])
    assert finished.code == 0 and "did not finish" not in finished.stderr, finished


def test_a_finished_runs_summary_decides_and_a_killed_runs_damaged_heldout_is_one_line(
    run: Path, tmp_path: Path
) -> None:
    """A finished run's held-out ids come from its summary: a damaged heldout.jsonl beside it does not stop its export
    (it did, once export read that file too); a killed run's damaged one is one line that says what to do."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / HELDOUT).write_text('{"id": "a"}\n{not json\n{"id": "b"}\n')
    assert {c.id for c in training_conversations(copy)} == {r["id"] for r in read_jsonl(run / CONVERSATIONS)}
    (copy / "summary.json").unlink()
    with pytest.raises(
        ExportError, match=r"held-out conversations of an unfinished run: .*heldout.jsonl:2: .*fix or remove it$"
    ):
        training_conversations(copy)


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


def test_the_recorded_composition_is_that_of_the_training_conversations_kept(run: Path) -> None:
    record = json.loads((run / "summary.json").read_text())
    train = [r["id"].split("/") for r in read_jsonl(run / CONVERSATIONS)]
    envs = {env for env, _, _ in train}
    tasks = max(len({t for e, t, _ in train if e == env}) for env in envs)
    assert (record["composition"]["A"], record["composition"]["T"]) == (len(envs), tasks)
    assert record["planned_composition"]["A"] == 2  # shop is held out whole


def test_an_environment_whose_training_units_were_all_dropped_is_not_counted(tmp_path: Path) -> None:
    from envfactory.env.pool import EnvPool
    from envfactory.terminal import SafeConsole

    settings = Settings(root=ROOT, bfcl=False, data_dir=tmp_path / "data")
    config = SynthConfig.model_validate({"envs": ["hotels", "banking"], "T": 3, "S": 2, "D": 1, "out": tmp_path / "r"})
    plan = plan_batch(config, settings, EnvPool(settings), SafeConsole(file=io.StringIO()))
    train = [u for u in plan.units if u.split == "train"]
    planned = training_composition(config, plan)
    assert (planned.A, planned.T) == (2, 3)
    first = next(u.task for u in train if u.env == "hotels")
    kept = {u.key for u in train if u.env == "hotels" and u.task != first}  # banking's all dropped, a hotels task too
    assert (training_composition(config, plan, kept=kept).A, training_composition(config, plan, kept=kept).T) == (1, 2)
    assert training_composition(config, plan, kept=set()).A == 0


@pytest.mark.parametrize(("seed", "share", "held_envs"), [(0, 0.25, []), (3, 0.5, ["hotels"]), (7, 0.2, [])])
def test_no_chain_is_joined_on_both_sides_of_the_split(
    tmp_path: Path, seed: int, share: float, held_envs: list[str]
) -> None:
    """An offline conversation joins other chains after its own: a training one must never join a held-out task's
    chain (6 of 178 training conversations did), nor a held-out one a chain that training conversations join."""
    from envfactory.env.pool import EnvPool

    settings = Settings(root=ROOT, bfcl=False, data_dir=tmp_path / "data")
    config = SynthConfig.model_validate(
        {
            "envs": ["hotels", "banking", "calendar"],
            "T": 12,
            "S": 1,
            "D": 2,
            "seed": seed,
            "out": tmp_path / "run",
            "holdout_tasks": share,
            "holdout_envs": held_envs,
            "plot": False,
        }
    )
    plan = plan_batch(config, settings, EnvPool(settings))
    sides: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    for unit in plan.units:
        assert unit.more is not None
        for chain in [unit.chain, *unit.more]:
            sides.setdefault((unit.env, tuple(chain.tools)), set()).add(unit.split)
    both = sorted(chain for chain, split in sides.items() if len(split) > 1)
    assert not both, both
    assert {u.split for u in plan.units} == {"train", "heldout"}
    held = [u for u in plan.units if u.split == "heldout" and u.env not in held_envs]
    assert all(u.more for u in held)  # a held-out task still has chains to join
