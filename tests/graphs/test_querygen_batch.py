"""`envfactory synth` in LLM mode: the batch runner drives the QueryGen graph (scripted model), writes
the kept conversation like the offline mode, and a second run skips it without calling the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from envfactory.config import get_settings
from envfactory.tasks.plan import SynthConfig, Unit, load_conversations, read_jsonl, run_units
from graphs.querygen.batch import querygen_runner
from tests.support.querygen import SEED, base_script, call, hotels_chain, model_calls, pi_star, setup, sqlite_saver


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


def test_a_new_run_in_the_same_folder_gets_new_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A unit's thread was named by the folder alone: after the folder was removed, a run with other settings into
    it got the old run's finished threads back, and wrote their conversations as its own without asking the model.
    The threads are named by the run too (`run_id`, made when settings.json is first written, kept by a resume)."""
    import shutil
    import zlib

    from envfactory.llm.scripted import reset_scripted_models
    from envfactory.tasks.synth_settings import record_synth_settings
    from envfactory_agents.common import reset_model_cache
    from graphs.querygen.batch import thread_tag

    probe = setup(tmp_path / "probe", monkeypatch, {})
    script = base_script(pi_star(probe))
    pool = setup(tmp_path, monkeypatch, script)
    out = tmp_path / "run"
    unit = Unit(key="hotels/t0/s0", env="hotels", task=0, state_variant=0, depth=1, seed=SEED, chain=hotels_chain())
    first = SynthConfig.model_validate({"mode": "llm", "out": str(out), "querygen": {"pass_k": 1}, "S": 1})
    assert thread_tag(first) == f"{zlib.crc32(str(out.resolve()).encode()):08x}"  # no record: as before
    with sqlite_saver(tmp_path / "cp.sqlite") as saver:
        record_synth_settings(first, get_settings(), envs=["hotels"], pool=pool)
        tag = thread_tag(first)
        assert run_units([unit], querygen_runner(pool, get_settings(), first, saver), out, concurrency=1) == (0, 1)
        record_synth_settings(first, get_settings(), envs=["hotels"], pool=pool)  # a resume: the same run
        assert thread_tag(first) == tag
        shutil.rmtree(out)
        reset_model_cache()  # the model's script from the top, its calls counted from zero
        reset_scripted_models()
        second = first.model_copy(update={"querygen": {"pass_k": 2}})
        record_synth_settings(second, get_settings(), envs=["hotels"], pool=pool)
        assert thread_tag(second) != tag
        assert run_units([unit], querygen_runner(pool, get_settings(), second, saver), out, concurrency=1) == (0, 1)
        assert model_calls("solver/solve")  # a new thread: the model was asked
