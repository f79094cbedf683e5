"""`envfactory synth` in LLM mode: the batch runner drives the QueryGen graph (scripted model), writes
the kept conversation like the offline mode, and a second run skips it without calling the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from envfactory.config import get_settings
from envfactory.tasks.plan import SynthConfig, Unit, load_conversations, read_jsonl, run_units
from graphs.querygen.batch import querygen_runner
from tests.querygen_helpers import SEED, base_script, call, hotels_chain, model_calls, pi_star, setup, sqlite_saver


def test_llm_mode_runs_querygen_per_unit_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = setup(tmp_path / "probe", monkeypatch, {})
    script = base_script(pi_star(probe))
    pool = setup(tmp_path, monkeypatch, script)
    out = tmp_path / "run"
    config = SynthConfig.model_validate(
        {"mode": "llm", "out": str(out), "preset": "SFT_NON_CONV", "querygen": {"pass_k": 1}, "S": 1}
    )
    unit = Unit(key="hotels/t0/s0", env="hotels", task=0, state_variant=0, depth=1, seed=SEED, chain=hotels_chain())
    with sqlite_saver(tmp_path / "cp.sqlite") as saver:
        runner = querygen_runner(pool, get_settings(), config, saver)
        assert run_units([unit], runner, out, concurrency=1) == (0, 1)
        [conv] = load_conversations(out)
        assert conv.id == unit.key and conv.provenance.generator == "llm"
        assert [n.generator for n in conv.nodes] == ["llm", "llm"] and all(n.refined for n in conv.nodes)
        assert read_jsonl(out / "dropped.jsonl") == []
        calls = len(model_calls("solver/solve"))
        assert run_units([unit], runner, out, concurrency=1) == (1, 0)  # done: skipped, the model not asked
        assert len(model_calls("solver/solve")) == calls


def test_llm_mode_records_a_dropped_chain_with_the_graph_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = setup(tmp_path / "probe", monkeypatch, {})
    p = pi_star(probe)
    wrong = [call("search_hotels", p.search), call("book_room", p.wrong_book), "Booked Alfama Lodge."]
    pool = setup(tmp_path, monkeypatch, base_script(p, {"solver/solve": wrong}))
    out = tmp_path / "run"
    config = SynthConfig.model_validate({"mode": "llm", "out": str(out), "querygen": {"pass_k": 1}})
    unit = Unit(key="hotels/t0/s0", env="hotels", task=0, state_variant=0, depth=1, seed=SEED, chain=hotels_chain())
    with sqlite_saver(tmp_path / "cp.sqlite") as saver:
        run_units([unit], querygen_runner(pool, get_settings(), config, saver), out, concurrency=1)
    assert load_conversations(out) == []
    [drop] = read_jsonl(out / "dropped.jsonl")
    assert drop["key"] == unit.key and drop["code"] == "querygen" and drop["tools"] == unit.chain.tools
    assert "verif" in drop["reason"]  # every branch's reason for failing the turn's goal
