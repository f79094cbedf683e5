"""Runs remember their settings: `eval` and `synth` write `settings.json` before any work, a resume made otherwise
is refused in one line naming what differs (and nothing runs), a resume made the same way still resumes, every
attempt record says how it was made, and an export records its source's sha256 and refuses to land on an earlier
export of another format."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.eval.agent import AgentLimits
from envfactory.eval.items import items_from_conversations, load_conversations
from envfactory.eval.run import ATTEMPTS, EvalSettings, done_attempts, run_eval, turn_runner
from envfactory.export.errors import ExportError
from envfactory.llm.scripted import ScriptedChatModel
from envfactory.records.run_folder import CONVERSATIONS
from envfactory.run_settings import (
    SETTINGS_FILE,
    RunRecord,
    RunSettingsError,
    differences,
    record_or_check,
)
from envfactory.tasks.plan import SynthConfig, Unit, run_units
from envfactory.tasks.run import offline_runner
from envfactory.tasks.synth_settings import record_synth_settings
from envfactory.toolgraph.graph import ToolGraph
from envfactory.toolgraph.io import save_graph
from tests.chains import hotel_chain

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synth run (two hotel conversations of two turns), made as `synth` makes it."""
    out = tmp_path_factory.mktemp("settings") / "run"
    settings = Settings(root=ROOT, bfcl=False)
    units = [
        Unit(key=f"u{i}", env="hotels", task=i, state_variant=0, depth=1, seed=seed, chain=hotel_chain())
        for i, seed in enumerate((4, 5))
    ]
    run_units(units, offline_runner(EnvPool(settings), settings), out, concurrency=1)
    assert len((out / CONVERSATIONS).read_text().splitlines()) == 2
    return out


def _eval(monkeypatch: pytest.MonkeyPatch, script: Path, *args: str, **env: str) -> Any:
    """`envfactory eval ARGS` in this process, the scripted model as the eval role's."""
    from envfactory.cli.eval import app

    monkeypatch.setenv("ENVFACTORY_ROOT", str(ROOT))
    monkeypatch.setenv("ENVFACTORY_BFCL", "false")
    monkeypatch.setenv("ENVFACTORY_LLM_ROLES__EVAL__PROVIDER", "scripted")
    monkeypatch.setenv("ENVFACTORY_LLM_ROLES__EVAL__SCRIPT", str(script))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return CliRunner().invoke(app, list(args))


def _script(path: Path, replies: int) -> Path:
    """A model that answers every attempt at once, in words (a failed attempt, but a recorded one)."""
    path.write_text(yaml.safe_dump(["I would rather not."] * replies))
    return path


def test_a_resume_with_other_settings_is_refused_naming_them(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: `--tools meta`, then `--tools direct --attempts 2` into the same folder mixed both into
    one pass@2. Now the second is refused before any attempt, naming both settings."""
    out = tmp_path / "eval"
    script = _script(tmp_path / "s.yaml", 3)
    first = _eval(monkeypatch, script, str(run_dir), "--out", str(out), "--tools", "meta", "--limit", "3")
    assert first.exit_code == 0, (first.output, first.exception)
    log = (out / ATTEMPTS).read_text()
    assert len(log.splitlines()) == 3
    recorded = json.loads((out / SETTINGS_FILE).read_text())
    assert recorded["command"] == "eval" and recorded["settings"]["tools"] == "meta"
    assert recorded["settings"]["data"]["sha256"] == hashlib.sha256((run_dir / CONVERSATIONS).read_bytes()).hexdigest()
    assert recorded["settings"]["model"] == {
        "provider": "scripted",
        "model": str(script),
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 4096,
    }
    for record in done_attempts(out):  # each attempt says how it was made
        assert (record.tools, record.mode, record.model) == ("meta", "turn", f"scripted:{script}")

    empty = _script(tmp_path / "none.yaml", 0)  # a model that would fail every attempt, were one made
    second = _eval(
        monkeypatch, empty, str(run_dir), "--out", str(out), "--tools", "direct", "--attempts", "2", "--limit", "3"
    )
    assert isinstance(second.exception, RunSettingsError), (second.output, second.exception)
    message = str(second.exception)
    assert "\n" not in message and "tools: meta → direct" in message and "attempts: 1 → 2" in message, message
    assert "model.model: " in message  # the script differs too: named
    assert (out / ATTEMPTS).read_text() == log  # nothing ran

    cooler = _eval(
        monkeypatch,
        script,
        *(str(run_dir), "--out", str(out), "--tools", "meta", "--limit", "3"),
        ENVFACTORY_LLM_ROLES__EVAL__TEMPERATURE="0",
    )
    assert isinstance(cooler.exception, RunSettingsError) and "model.temperature: 0.7 → 0.0" in str(cooler.exception)
    assert (out / ATTEMPTS).read_text() == log


def test_a_resume_with_the_same_settings_still_resumes(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "eval"
    args = (str(run_dir), "--out", str(out), "--attempts", "2", "--limit", "2")
    assert _eval(monkeypatch, _script(tmp_path / "a.yaml", 4), *args).exit_code == 0
    log = out / ATTEMPTS
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:3]) + "\n")  # one attempt lost to a kill
    again = _eval(monkeypatch, _script(tmp_path / "a.yaml", 1), *args)
    assert again.exit_code == 0, (again.output, again.exception)
    assert len(log.read_text().splitlines()) == 4
    more = _eval(monkeypatch, _script(tmp_path / "a.yaml", 2), *args[:-1], "3")  # --limit picks items: not a setting
    assert more.exit_code == 0, (more.output, more.exception)
    assert len({(r.item, r.attempt) for r in done_attempts(out)}) == 6
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["attempts"] == 2 and summary["attempts"] == 6


def test_changed_data_and_unrecorded_runs_are_refused(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "source"
    shutil.copytree(run_dir, source)
    out = tmp_path / "eval"
    script = _script(tmp_path / "s.yaml", 2)
    assert _eval(monkeypatch, script, str(source), "--out", str(out), "--limit", "2").exit_code == 0
    conversations = source / CONVERSATIONS
    conversations.write_text(conversations.read_text().splitlines()[0] + "\n")  # the data changed under the run
    changed = _eval(monkeypatch, script, str(source), "--out", str(out), "--limit", "2")
    assert isinstance(changed.exception, RunSettingsError) and "data.sha256:" in str(changed.exception)

    older = tmp_path / "older"  # a run from before settings were recorded: its attempts, no settings.json
    older.mkdir()
    shutil.copy(out / ATTEMPTS, older / ATTEMPTS)
    refused = _eval(monkeypatch, script, str(run_dir), "--out", str(older), "--limit", "2")
    assert isinstance(refused.exception, RunSettingsError), refused.output
    assert "did not record its settings" in str(refused.exception) and not (older / SETTINGS_FILE).exists()


def test_the_library_checks_too(run_dir: Path, tmp_path: Path) -> None:
    """`run_eval` itself records and checks: a caller that resumes with another k is refused before any attempt."""
    pool = EnvPool(Settings(root=ROOT, bfcl=False))
    items = items_from_conversations(load_conversations(run_dir), pool)[:2]
    runner = turn_runner(pool, AgentLimits())
    run_eval(items, lambda: ScriptedChatModel(script=["no"] * 2), runner, tmp_path, EvalSettings())
    records = done_attempts(tmp_path)
    assert [(r.tools, r.mode, r.model) for r in records] == [("direct", "turn", "ScriptedChatModel:-")] * 2
    with pytest.raises(RunSettingsError, match=r"attempts: 1 → 3"):
        run_eval(items, lambda: ScriptedChatModel(script=[]), runner, tmp_path, EvalSettings(attempts=3))
    with pytest.raises(RunSettingsError, match=r"max_steps: 8 → 2"):
        limits = AgentLimits(max_steps=2)
        run_eval(
            items,
            lambda: ScriptedChatModel(script=[]),
            turn_runner(pool, limits),
            tmp_path,
            EvalSettings(limits=limits),
        )
    assert len(done_attempts(tmp_path)) == 2


# ---- synth -----------------------------------------------------------------------------------------------------


def _synth(monkeypatch: pytest.MonkeyPatch, config: Path) -> Any:
    from graphs.cli.synth import app

    monkeypatch.setenv("ENVFACTORY_ROOT", str(ROOT))
    monkeypatch.setenv("ENVFACTORY_BFCL", "false")
    return CliRunner().invoke(app, ["--config", str(config)])


def test_synth_records_its_settings_and_refuses_another_plan(
    graph: ToolGraph, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_graph(graph, tmp_path / "graph.json")
    out = tmp_path / "run"
    plan: dict[str, Any] = {"envs": ["hotels"], "T": 1, "S": 1, "seed": 3, "graph": str(tmp_path / "graph.json")}
    config = tmp_path / "synth.yaml"
    config.write_text(yaml.safe_dump({**plan, "out": str(out), "plot": False}))
    first = _synth(monkeypatch, config)
    assert first.exit_code == 0, (first.output, first.exception)
    recorded = json.loads((out / SETTINGS_FILE).read_text())
    assert recorded["command"] == "synth" and recorded["settings"]["seed"] == 3 and "out" not in recorded["settings"]
    assert recorded["context"]["config_sha256"] == hashlib.sha256(config.read_bytes()).hexdigest()
    kept = (out / CONVERSATIONS).read_text()

    config.write_text(yaml.safe_dump({**plan, "out": str(out), "plot": False, "concurrency": 1}))
    again = _synth(monkeypatch, config)  # concurrency and plot say how fast and what is drawn: same run
    assert again.exit_code == 0, (again.output, again.exception)
    assert (out / CONVERSATIONS).read_text() == kept

    config.write_text(yaml.safe_dump({**plan, "seed": 4, "T": 2, "out": str(out), "plot": False}))
    other = _synth(monkeypatch, config)
    assert isinstance(other.exception, RunSettingsError), (other.output, other.exception)
    assert "tasks: 1 → 2" in str(other.exception) and "seed: 3 → 4" in str(other.exception)
    assert (out / CONVERSATIONS).read_text() == kept


def test_synth_in_llm_mode_records_the_querygen_models(tmp_path: Path) -> None:
    config = SynthConfig.model_validate({"mode": "llm", "envs": ["hotels"], "out": tmp_path / "run"})
    scripted = Settings(root=ROOT, llm={"provider": "scripted", "script": tmp_path / "s.yaml"})
    record_synth_settings(config, scripted)
    models = json.loads((tmp_path / "run" / SETTINGS_FILE).read_text())["settings"]["models"]
    assert set(models) == {"query", "solver", "user"} and models["query"]["provider"] == "scripted"
    (tmp_path / "run" / CONVERSATIONS).write_text("{}\n")
    served = Settings(root=ROOT, llm={"provider": "openai", "model": "qwen3-8b", "temperature": 0.6})
    with pytest.raises(RunSettingsError, match=r"models\.query\.provider: scripted → openai"):
        record_synth_settings(config, served)


# ---- export ----------------------------------------------------------------------------------------------------


def test_export_records_its_source_and_refuses_to_mix_formats(run_dir: Path, tmp_path: Path) -> None:
    from envfactory.cli.export import app

    out = tmp_path / "export"
    args = [str(run_dir), "--out", str(out), "--format"]
    first = CliRunner().invoke(app, [*args, "llamafactory"])
    assert first.exit_code == 0, (first.output, first.exception)
    report = json.loads((out / "export.json").read_text())
    assert report["source"]["sha256"] == hashlib.sha256((run_dir / CONVERSATIONS).read_bytes()).hexdigest()
    assert report["format"] == "llamafactory" and report["envfactory_version"]
    rows = (out / "train.jsonl").read_text()
    other = CliRunner().invoke(app, [*args, "trl-sft"])  # would leave LlamaFactory's dataset_info.json behind
    assert isinstance(other.exception, ExportError) and "earlier llamafactory export" in str(other.exception)
    assert (out / "train.jsonl").read_text() == rows
    again = CliRunner().invoke(app, [*args, "llamafactory", "--per", "conversation"])  # same format: replaced
    assert again.exit_code == 0 and json.loads((out / "export.json").read_text())["options"]["per"] == "conversation"


# ---- the comparison ----------------------------------------------------------------------------------------------

_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["direct", "meta", "a" * 70]))
_settings = st.dictionaries(
    st.sampled_from(["tools", "mode", "attempts", "model", "data"]),
    st.one_of(_leaf, st.dictionaries(st.sampled_from(["provider", "temperature", "sha256"]), _leaf, max_size=3)),
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(_settings, _settings)
def test_a_resume_is_refused_exactly_when_a_setting_differs(before: dict[str, Any], now: dict[str, Any]) -> None:
    """Property: over random (nested) settings, the check passes exactly when every setting is the same, and
    its line names exactly the settings that differ."""
    import tempfile

    def leaves(value: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(value, dict) and (value or not prefix):
            return {k: v for key, item in value.items() for k, v in leaves(item, f"{prefix}{key}.").items()}
        return {prefix.rstrip("."): value}

    flat_before, flat_now = leaves(before), leaves(now)
    differ = {k for k in {*flat_before, *flat_now} if flat_before.get(k, None) != flat_now.get(k, None)}
    assert {line.split(": ", 1)[0] for line in differences(before, now)} == differ
    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder)
        record_or_check(run, RunRecord(command="eval", settings=before), holds_results=False)
        (run / ATTEMPTS).write_text("{}\n")
        if differ:
            with pytest.raises(RunSettingsError) as caught:
                record_or_check(run, RunRecord(command="eval", settings=now), holds_results=True)
            assert "\n" not in str(caught.value) and all(f"{key}: " in str(caught.value) for key in differ)
        else:
            record_or_check(run, RunRecord(command="eval", settings=now), holds_results=True)
