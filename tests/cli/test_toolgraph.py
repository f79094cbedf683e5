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
    # an environment named twice is built once (it was "tool 'hotels.search_hotels' is given twice")
    res = run(
        data, "build", "--out", str(tmp_path / "again.json"), "--env", "hotels", "--env", "flights", "--env", "hotels"
    )
    assert res.code == 0, res.stderr
    assert "model ran on 0" in res.stdout  # every text was cached by the first build
    assert (tmp_path / "again.json").is_file()


def test_a_damaged_embedding_cache_is_set_aside_and_the_build_goes_on(data: Path, tmp_path: Path) -> None:
    """A reviewer's `--out` over the cache replaced its SQLite file, and every later build was a 43-line
    traceback ("file is not a database"): `--out` into the caches is refused now, and a cache that is damaged
    anyway (a truncated copy, another program's file) is moved aside and filled again: a cache is disposable."""
    cache = data / "toolgraph" / "embeddings" / "vectors.sqlite"
    one_line_error(run(data, "build", "--env", "hotels", "--out", str(cache)), "would overwrite")
    one_line_error(run(data, "build", "--env", "hotels", "--graphml", str(cache)), "would overwrite")
    copy = tmp_path / "data"
    (copy / "toolgraph" / "embeddings").mkdir(parents=True)
    (copy / "toolgraph" / "embeddings" / "vectors.sqlite").write_bytes(cache.read_bytes()[:100_000])  # truncated
    for damage in (None, b"garbage\n"):  # (what a truncated copy still holds is read; the rest is embedded)
        if damage is not None:
            (copy / "toolgraph" / "embeddings" / "vectors.sqlite").write_bytes(damage)
        res = run(copy, "build", "--env", "hotels", "--out", str(tmp_path / "g.json"))
        assert res.code == 0 and "Traceback" not in res.stderr, res.stderr
    assert "model ran on 0" not in res.stdout  # the garbage's texts were embedded again
    again = run(copy, "build", "--env", "hotels", "--out", str(tmp_path / "g2.json"))
    assert again.code == 0 and "model ran on 0" in again.stdout  # and the new cache keeps them
    graphs = [json.loads((tmp_path / name).read_text())["graph"] for name in ("g.json", "g2.json")]
    for g in graphs:
        g["graph"].pop("build")  # (what was embedded this time)
    assert graphs[0] == graphs[1]  # the same graph from the new cache
    assert len(list((copy / "toolgraph" / "embeddings").glob("vectors.sqlite.damaged-*"))) >= 1


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
    for length, needle in (("5..2", "5..2: needs 1 <= MIN <= MAX"), ("x", "MIN..MAX"), ("0..2", "needs 1 <=")):
        bad = run(data, "sample", "--length", length)  # a usage error, as any other option's (it exited 1)
        assert bad.code == 2 and needle in bad.stderr and "--length" in bad.stderr, bad.stderr
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


def test_show_never_writes_over_the_graph_it_reads(data: Path, tmp_path: Path) -> None:
    """`graph show ENV --graph g.json --html g.json` wrote the HTML over the graph (and through a link to it)."""
    graph = tmp_path / "g.json"
    graph.write_bytes((data / "toolgraph" / "graph.json").read_bytes())
    link = tmp_path / "link.json"
    link.symlink_to(graph)
    for html in (graph, link):
        one_line_error(run(data, "show", "banking", "--graph", str(graph), "--html", str(html)), "--html")
    assert graph.read_bytes() == (data / "toolgraph" / "graph.json").read_bytes()
    one_line_error(run(data, "show", "banking", "--html", str(data / "toolgraph" / "graph.json")), "--html")


def _edited(data: Path, tmp_path: Path, edit: str) -> Path:
    saved = json.loads((data / "toolgraph" / "graph.json").read_text())
    nodes, edges = saved["graph"]["nodes"], saved["graph"]["edges"]
    tool = next(n for n in nodes if n.get("type") == "tool")
    depend = next(e for e in edges if e.get("type") == "Tool_Depend")
    if edit == "no env":
        del tool["env"]
    elif edit == "no kind":
        del tool["kind"]
    elif edit == "env a list":
        tool["env"] = ["a", "b"]
    elif edit == "no cross_env":
        del depend["cross_env"]
    elif edit == "no type":
        del depend["type"]
    elif edit == "dangling":
        edges.append({**depend, "target": "ghost.tool"})
    elif edit == "relate between tools":
        edges.append({"source": depend["source"], "target": depend["target"], "type": "Parameter_Relate"})
    path = tmp_path / f"{edit.replace(' ', '_')}.json"
    path.write_text(json.dumps(saved))
    return path


@pytest.mark.parametrize(
    "edit", ["no env", "no kind", "env a list", "no cross_env", "no type", "dangling", "relate between tools"]
)
def test_a_hand_edited_graph_is_one_line_not_a_traceback(data: Path, tmp_path: Path, edit: str) -> None:
    """A graph file whose node lacks its env or kind, or an edge its type, or one pointing at a node the file does not
    hold, loaded, then `stats`, `sample` and `show` died in KeyError/TypeError tracebacks (or counted it silently)."""
    path = _edited(data, tmp_path, edit)
    for command in (["stats"], ["sample", "--n", "5", "--out", str(tmp_path / "c.jsonl")], ["show", "banking"]):
        one_line_error(run(data, *command, "--graph", str(path)), "malformed graph data")


def test_stats_counts_a_tool_linked_across_environments_as_linked(data: Path) -> None:
    """Per environment, a tool whose only dependencies cross environments was counted isolated (its subgraph drops
    those edges), so the rows summed to more than the whole graph's count."""
    from envfactory.toolgraph.io import load_graph

    graph = load_graph(data / "toolgraph" / "graph.json")
    res = run(data, "stats")
    rows = {
        cells[0]: cells[1:]
        for line in res.stdout.splitlines()
        if len(cells := [c.strip() for c in line.strip("│┃ ").split("│")]) == 10
    }
    depend = graph.depend_edges()
    linked = {a for a, _, _ in depend} | {b for _, b, _ in depend}
    for env in graph.envs():
        assert int(rows[env][-1]) == sum(t not in linked for t in graph.tools(env)), env
    assert sum(int(rows[env][-1]) for env in graph.envs()) == graph.stats().isolated_tools


def test_sampling_settings_set_now_count_whatever_the_graph_was_built_with(data: Path, tmp_path: Path) -> None:
    """ENVFACTORY_TOOLGRAPH__MAX_SERVERS=1 sampled chains over 2-3 environments: the sampler took the settings the
    graph was built with, frozen in graph.json."""
    out = tmp_path / "one.jsonl"
    res = run(data, "sample", "--n", "200", "--seed", "3", "--out", str(out),
              extra_env={"ENVFACTORY_TOOLGRAPH__MAX_SERVERS": "1"})  # fmt: skip
    assert res.code == 0, res.stderr
    chains = [ToolChain.model_validate_json(line) for line in out.read_text().splitlines()]
    assert chains and all(len(c.servers) == 1 for c in chains)
    free = run(data, "sample", "--n", "200", "--seed", "3", "--out", str(tmp_path / "free.jsonl"))
    assert free.code == 0
    assert any(len(ToolChain.model_validate_json(line).servers) > 1 for line in (tmp_path / "free.jsonl").open())
