"""`envfactory graph build|stats|show|sample|export` on the real pool, run through the CLI's `main()` in this
process (the embedding model and the pool load once; `tests/cli/test_main.py` starts the CLI as a program)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import networkx as nx
import pytest

from envfactory.toolgraph import ToolChain
from tests.support.cli import CliRun, run_cli
from tests.support.paths import ROOT, TEST_DATA

SCRIPT = TEST_DATA / "toolgraph" / "hotels_script.json"


def run(data: Path, *args: str, extra_env: dict[str, str] | None = None) -> CliRun:
    with pytest.MonkeyPatch.context() as mp:
        for name in [k for k in os.environ if k.startswith("ENVFACTORY_")]:
            mp.delenv(name)
        values = {"ENVFACTORY_ROOT": str(ROOT), "ENVFACTORY_DATA_DIR": str(data), "COLUMNS": "200", **(extra_env or {})}
        for name, value in values.items():
            mp.setenv(name, value)
        mp.chdir(ROOT)
        return run_cli(["graph", *args])


def one_line_error(res: CliRun, needle: str) -> None:
    assert res.code == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tg-cli")
    res = run(folder, "build", "--graphml", str(folder / "built.graphml"))
    assert res.code == 0, res.stdout + res.stderr
    assert "209" in res.stdout and "classification: heuristic" in res.stdout
    assert "embedding parameter texts" in res.stderr  # the progress bar
    return folder


def test_build_writes_to_the_data_dir(data: Path) -> None:
    saved = json.loads((data / "toolgraph" / "graph.json").read_text())
    assert saved["format"] == "envfactory-toolgraph" and saved["format_version"] == 1
    assert (data / "toolgraph" / "embeddings").is_dir()  # the embedding cache
    g = nx.read_graphml(data / "built.graphml")
    assert g.nodes["hotels.book_room:in:hotel_id"]["user_provided"] is False


def test_rebuild_hits_the_embedding_cache(data: Path, tmp_path: Path) -> None:
    res = run(data, "build", "--out", str(tmp_path / "again.json"), "--env", "hotels", "--env", "flights")
    assert res.code == 0, res.stderr
    assert "model ran on 0" in res.stdout  # every text was cached by the first build
    assert (tmp_path / "again.json").is_file()


def test_stats(data: Path) -> None:
    res = run(data, "stats")
    assert res.code == 0, res.stderr
    assert "hotels" in res.stdout and "bfcl_travel" in res.stdout and "all" in res.stdout
    assert "Parameter_Relate pairs" in res.stdout


def test_show_writes_html(data: Path, tmp_path: Path) -> None:
    res = run(data, "show", "hotels")
    assert res.code == 0, res.stderr
    assert "book_room" in res.stdout and "hotel_id* (internal)" in res.stdout
    page = (data / "toolgraph" / "hotels.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<script" not in page
    res = run(data, "show", "bfcl_travel", "--html", str(tmp_path / "travel.html"))
    assert res.code == 0 and "authenticate_travel" in (tmp_path / "travel.html").read_text()


def test_sample_writes_reproducible_jsonl(data: Path, tmp_path: Path) -> None:
    res = run(data, "sample", "--n", "100", "--length", "3..6", "--seed", "0")
    assert res.code == 0, res.stderr
    default = data / "toolgraph" / "chains.jsonl"
    lines = default.read_text().splitlines()
    assert len(lines) == 100 and "wrote 100 chains" in res.stderr
    chains = [ToolChain.model_validate_json(line) for line in lines]
    assert all(3 <= c.length <= 6 for c in chains)
    again = run(data, "sample", "--n", "100", "--length", "3..6", "--seed", "0", "--out", str(tmp_path / "b.jsonl"))
    assert again.code == 0 and (tmp_path / "b.jsonl").read_text() == default.read_text()
    other = run(data, "sample", "--n", "5", "--length", "4", "--seed", "1", "--out", "-")
    assert other.code == 0
    assert [ToolChain.model_validate_json(line).length for line in other.stdout.splitlines()] == [4] * 5


def test_export_graphml(data: Path, tmp_path: Path) -> None:
    res = run(data, "export", "--graphml", str(tmp_path / "g.graphml"))
    assert res.code == 0 and nx.read_graphml(tmp_path / "g.graphml").number_of_nodes() > 1000


def test_errors_are_one_line(data: Path, tmp_path: Path) -> None:
    one_line_error(run(data, "show", "nope"), "no environment 'nope'")
    one_line_error(run(data, "sample", "--length", "5..2"), "--length 5..2")
    one_line_error(run(data, "sample", "--length", "x"), "MIN..MAX")
    one_line_error(run(tmp_path, "stats"), "envfactory graph build")  # no graph built in this data dir
    wrong = tmp_path / "v9.json"
    wrong.write_text(json.dumps({"format": "envfactory-toolgraph", "format_version": 9, "graph": {}}))
    one_line_error(run(data, "stats", "--graph", str(wrong)), "format version 9")


def test_without_the_data_dirs_graph_the_error_names_the_graphs_synth_runs_kept(data: Path, tmp_path: Path) -> None:
    """A synth run keeps the graph of its environments (`graph-<digest>.json`) and writes no graph.json: `graph
    stats` says where those are, newest first, and reads one given with --graph."""
    kept = tmp_path / "toolgraph"
    kept.mkdir()
    for i, name in enumerate(["graph-aaaa.json", "graph-bbbb.json"]):
        (kept / name).write_bytes((data / "toolgraph" / "graph.json").read_bytes())
        os.utime(kept / name, ns=(i * 10**9, i * 10**9))
    one_line_error(run(tmp_path, "stats"), "newest first: graph-bbbb.json, graph-aaaa.json")
    res = run(tmp_path, "stats", "--graph", str(kept / "graph-aaaa.json"))
    assert res.code == 0 and "209" in res.stdout, res.stdout + res.stderr


def test_build_with_the_scripted_llm(data: Path, tmp_path: Path) -> None:
    llm = {"ENVFACTORY_LLM__PROVIDER": "scripted", "ENVFACTORY_LLM__SCRIPT": str(SCRIPT)}
    out = tmp_path / "llm.json"
    for _ in range(2):  # each run replays the script from its top, as a new process would
        res = run(data, "build", "--env", "hotels", "--out", str(out), extra_env=llm)
        assert res.code == 0, res.stdout + res.stderr
    assert "classification: llm" in res.stdout, res.stdout
    assert "refine hotels: remove cancel_booking -> book_room" in res.stdout and "[applied]" in res.stdout, res.stdout
    assert "skipped: names a tool the environment does not have" in res.stdout, res.stdout
    node = json.loads(out.read_text())["graph"]["nodes"]
    guest = next(n for n in node if n["id"] == "hotels.book_room:in:guest_name")
    assert guest["user_provided_source"] == "llm" and guest["user_provided"] is False, guest
    heuristic = run(data, "build", "--env", "hotels", "--out", str(tmp_path / "h.json"), "--no-llm", extra_env=llm)
    assert heuristic.code == 0 and "classification: heuristic" in heuristic.stdout, heuristic.stdout
