"""The tool graph a synth run reads: with no graph in the data dir, the graph of the run's environments alone is
built once and kept for that set (a pool holding a compiled corpus has ~140k texts to embed for the whole graph);
each environment's own part is the whole pool graph's, so the plan is the same; the run's record names that file."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.tasks.plan import SynthConfig, plan_units
from envfactory.tasks.run import plan_batch
from envfactory.tasks.synth_settings import graph_file, record_synth_settings
from envfactory.terminal import SafeConsole
from envfactory.toolgraph import ToolGraph, load_graph, save_graph
from envfactory.toolgraph.settings import envs_graph_path, graph_path
from tests.support.paths import ROOT


@pytest.fixture
def run(tmp_path: Path) -> tuple[Settings, SynthConfig, EnvPool]:
    settings = Settings(root=ROOT, bfcl=False, data_dir=tmp_path / "data")
    config = SynthConfig.model_validate(
        {"envs": ["hotels", "banking"], "T": 3, "S": 1, "D": 2, "seed": 5, "out": tmp_path / "run", "plot": False}
    )
    return settings, config, EnvPool(settings)


def test_a_run_without_a_graph_builds_one_over_its_environments_and_keeps_it(
    run: tuple[Settings, SynthConfig, EnvPool], graph: ToolGraph
) -> None:
    settings, config, pool = run
    said = io.StringIO()
    plan = plan_batch(config, settings, pool, SafeConsole(file=said, width=300))
    kept = envs_graph_path(settings, ["hotels", "banking"], pool)
    assert kept == envs_graph_path(settings, ["banking", "hotels", "hotels"], pool)  # the set, not the order
    assert f"no tool graph at {kept}" in said.getvalue() and "the run's 2 environment(s)" in said.getvalue()
    assert kept.is_file() and not graph_path(settings).exists()  # the data dir's pool graph is not written
    assert sorted(load_graph(kept).envs()) == ["banking", "hotels"]
    # each environment's part is the pool graph's: the very same plan as over the whole pool's graph
    assert plan.units == plan_units(config, pool, graph).units
    # kept: the next run over the same environments reads it, and builds nothing
    again = io.StringIO()
    stamp = kept.stat().st_mtime_ns
    assert plan_batch(config, settings, pool, SafeConsole(file=again, width=300)).units == plan.units
    assert "no tool graph" not in again.getvalue() and kept.stat().st_mtime_ns == stamp
    # the run's record names the graph it read, with its digest
    folder = record_synth_settings(config, settings, envs=plan.envs)
    context = json.loads((folder / "settings.json").read_text())["context"]
    assert context["tool_graph"] == str(kept) and context["tool_graph_sha256"]


def test_a_resume_reads_the_graph_its_first_part_read(
    run: tuple[Settings, SynthConfig, EnvPool], graph: ToolGraph
) -> None:
    """A graph built since (`envfactory graph build`'s graph.json) does not change what a resumed run plans over;
    and a run over the same environments keeps reading their own graph rather than the data dir's."""
    settings, config, pool = run
    plan = plan_batch(config, settings, pool, SafeConsole(file=io.StringIO()))
    record_synth_settings(config, settings, envs=plan.envs)
    own = envs_graph_path(settings, plan.envs, pool)
    save_graph(ToolGraph(), graph_path(settings))  # an empty graph.json: planning over it would fail
    assert graph_file(settings, config, plan.envs) == own
    assert plan_batch(config, settings, pool, SafeConsole(file=io.StringIO())).units == plan.units
    fresh = config.model_copy(update={"out": config.out.parent / "another"})  # a new run, the same environments
    assert graph_file(settings, fresh, plan.envs) == own
    # a run that read the data dir's graph reads it again on a resume, though its environments' own exists now
    save_graph(graph, graph_path(settings))
    own.unlink()
    assert graph_file(settings, fresh, plan.envs) == graph_path(settings)
    record_synth_settings(fresh, settings, envs=plan.envs)
    save_graph(graph.subgraph("hotels"), own)
    assert graph_file(settings, fresh, plan.envs) == graph_path(settings)


def test_the_data_dirs_graph_and_the_configs_come_first(
    run: tuple[Settings, SynthConfig, EnvPool], graph: ToolGraph
) -> None:
    settings, config, pool = run
    envs = ["banking", "hotels"]
    assert graph_file(settings, config, envs) == envs_graph_path(settings, envs, pool)
    assert graph_file(settings, config) == graph_path(settings)  # no environments named: the pool's
    save_graph(graph, graph_path(settings))
    assert graph_file(settings, config, envs) == graph_path(settings)  # `graph build`'s, once it is there
    own = config.model_copy(update={"graph": Path("g.json")})
    assert graph_file(settings, own, envs) == Path.cwd().resolve() / "g.json"  # as choose_envs checks it, as `out`
    home = config.model_copy(update={"graph": Path("~/g.json")})
    assert graph_file(settings, home, envs) == Path.home().resolve() / "g.json"


def test_an_environments_graph_is_named_by_what_it_is_built_from(tmp_path: Path) -> None:
    """A changed tool, or a setting that shapes the graph, names another file, so the next run builds the graph
    afresh rather than planning over a stale one; settings that only say how fast it embeds, or how chains are
    sampled from it, do not. A resume reads the file its first part recorded."""
    for env in ("hotels", "banking"):
        shutil.copytree(ROOT / "envs" / env, tmp_path / "envs" / env)
    settings = Settings(root=ROOT, bfcl=False, envs_dir=tmp_path / "envs", data_dir=tmp_path / "data")
    envs = ["hotels", "banking"]
    first = envs_graph_path(settings, envs, EnvPool(settings))
    speed = {"embed_threads": 1, "embed_batch": 7, "block_cells": 1000, "embed_backend": "torch"}
    sampling = {"skip_optional_p": 0.1, "max_servers": 1}
    no_llm = {"use_llm": False, "llm_role": "solver"}  # no LLM is configured: the graph is the same either way
    for same in (speed, sampling, no_llm):
        other = settings.model_copy(update={"toolgraph": settings.toolgraph.model_copy(update=same)})
        assert envs_graph_path(other, envs, EnvPool(other)) == first, same
    shapes = ({"build_edge_threshold": 0.8}, {"cross_env_edges": "none"}, {"schema_edges": False})
    for shaping in (*shapes, {"embed_backend": "onnx-int8"}):  # int8 vectors move edges
        other = settings.model_copy(update={"toolgraph": settings.toolgraph.model_copy(update=shaping)})
        assert envs_graph_path(other, envs, EnvPool(other)) != first, shaping
    model = settings.model_copy(update={"embedding_model": "another/model"})
    assert envs_graph_path(model, envs, EnvPool(model)) != first

    config = SynthConfig.model_validate({"envs": envs, "T": 3, "S": 1, "D": 2, "seed": 5, "out": tmp_path / "run"})
    save_graph(ToolGraph(), first)
    record_synth_settings(config, settings, envs=envs, pool=EnvPool(settings))
    # one tool's description changes (the copy is no longer the trusted one: its metadata comes from the sandbox)
    for name in ("env.py", "metadata.json"):
        path = tmp_path / "envs" / "hotels" / name
        path.write_text(path.read_text().replace("Search hotels in a city, optionally", "Find hotels in a city, if"))
    changed = EnvPool(settings)
    assert "Find hotels" in changed.get("hotels").metadata.tool("search_hotels").description
    now = envs_graph_path(settings, envs, changed)
    assert now != first and not now.exists()
    fresh = config.model_copy(update={"out": tmp_path / "another"})
    assert graph_file(settings, fresh, envs, changed) == now  # built afresh by the next run
    assert graph_file(settings, config, envs, changed) == first  # the resume: what its first part planned over


def test_where_an_llm_classifies_its_model_server_retries_and_prompts_name_the_graph(tmp_path: Path) -> None:
    """A graph an LLM classified and refined differs with the model, where it is served, its retries and the prompts
    it read: each names another file (with no LLM configured none of them counts, the test above)."""
    shutil.copytree(ROOT / "prompts", tmp_path / "prompts")
    script = tmp_path / "script.json"
    script.write_text("[]")
    search = {"provider": "scripted", "script": str(script)}

    def named(**changes: Any) -> Path:
        base: dict[str, Any] = {"root": ROOT, "bfcl": False, "data_dir": tmp_path / "data"}
        settings = Settings(**{**base, "prompts_dir": tmp_path / "prompts", "llm_roles": {"search": search}, **changes})
        return envs_graph_path(settings, ["hotels"], EnvPool(settings))

    first = named()
    assert named() == first
    assert named(llm_roles={}) != first  # no LLM: the heuristic graph
    assert named(structured_retries=7) != first
    assert named(llm_roles={"search": {**search, "base_url": "http://127.0.0.1:9/v1"}}) != first
    prompt = tmp_path / "prompts" / "toolgraph" / "refine.yaml"
    prompt.write_text(prompt.read_text() + "\n# edited\n")
    assert named() != first
