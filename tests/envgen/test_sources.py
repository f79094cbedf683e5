"""Authentic sources: the local index over the shipped sources/ folder, and Tavily against a local server."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from envfactory.config import Settings
from envfactory.envgen.sources import LocalSourceIndex, SourceSearchError, TavilySearch, chunk_text, search_sources
from envfactory.errors import EnvFactoryError
from tests.support.embeddings import CountingEmbedder
from tests.support.paths import ROOT
from tests.support.serve import serving_on_socket

SOURCES = ROOT / "sources"
KEY = "tvly-test-key"


@pytest.fixture(scope="session")
def embedder() -> CountingEmbedder:
    return CountingEmbedder()


@pytest.fixture(scope="module")
def shipped(embedder: CountingEmbedder, tmp_path_factory: pytest.TempPathFactory) -> LocalSourceIndex:
    return LocalSourceIndex(SOURCES, embedder, tmp_path_factory.mktemp("sources-index"))


# ---- the local index ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("rent a car at the airport and add a child seat", "car_rental_api.md"),
        ("refill my prescription at the pharmacy", "pharmacy_prescriptions.openapi.yaml"),
        ("renew a borrowed library book", "library_loans_api.md"),
        ("where is my parcel, show its tracking events", "parcel_tracking.openapi.json"),
        ("book a spin class at the gym", "gym_classes_booking.txt"),
        ("send an invoice and record a payment", "invoicing_api.md"),
    ],
)
def test_finds_the_right_document(shipped: LocalSourceIndex, query: str, expected: str) -> None:
    hits = shipped.search(query, k=3)
    assert Path(hits[0].location).name == expected
    assert len({h.location for h in hits}) == len(hits) == 3  # distinct files by default
    assert hits[0].score is not None and hits[0].score > (hits[1].score or 0)


def test_documents_keep_title_kind_and_location(shipped: LocalSourceIndex) -> None:
    by_file = {Path(d.location).name: d for d in shipped.search("API", k=10)}
    assert set(by_file) == {p.name for p in SOURCES.iterdir()}
    assert by_file["pharmacy_prescriptions.openapi.yaml"].kind == "openapi"
    assert by_file["pharmacy_prescriptions.openapi.yaml"].title == "Corner Pharmacy Prescriptions API"
    assert by_file["parcel_tracking.openapi.json"].kind == "openapi"
    assert by_file["car_rental_api.md"].kind == "markdown"
    assert by_file["car_rental_api.md"].title == "Roadrunner Car Rental API"
    assert by_file["gym_classes_booking.txt"].kind == "text"
    assert by_file["gym_classes_booking.txt"].title == "PulseFit Studios - Class Booking API (v1) developer notes"
    assert all(Path(d.location).is_file() and d.text for d in by_file.values())
    # an OpenAPI document is indexed as readable operations, not as raw YAML
    pharmacy = shipped.search("request a refill for pickup at a store", k=1)[0]
    assert "requestRefill" in pharmacy.text or "refill" in pharmacy.text.lower()


def test_reindexes_only_changed_files_and_drops_deleted_ones(tmp_path: Path, embedder: CountingEmbedder) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(SOURCES, docs)
    (docs / "package.json").write_text(json.dumps({"name": "not-an-api", "version": "1.0.0"}))
    (docs / "notes.yaml").write_text("just: [a, config, file]\n")
    store = tmp_path / "index"
    idx = LocalSourceIndex(docs, embedder, store)
    before = embedder.texts
    first = idx.refresh()
    shipped_files = len(list(SOURCES.iterdir()))
    assert (first.added, first.unchanged, first.removed) == (shipped_files, 0, 0)  # non-OpenAPI JSON/YAML skipped
    assert embedder.texts - before == first.embedded == idx.collection.count()

    before = embedder.texts
    assert LocalSourceIndex(docs, embedder, store).refresh().unchanged == shipped_files  # persisted
    assert embedder.texts == before

    gym = docs / "gym_classes_booking.txt"
    gym.write_text(gym.read_text() + "\nSaunas\nGET /saunas lists sauna slots; POST /sauna-bookings reserves one.\n")
    (docs / "car_rental_api.md").unlink()
    before = embedder.texts
    sync = idx.refresh()
    assert (sync.added, sync.updated, sync.removed, sync.unchanged) == (0, 1, 1, shipped_files - 2)
    assert embedder.texts - before == sync.embedded == len(chunk_text(gym.read_text()))
    assert any("sauna" in d.text.lower() for d in idx.search("sauna slots", k=5, distinct=False))
    assert all(Path(d.location).name != "car_rental_api.md" for d in idx.search("rent a car", k=10))


def test_missing_folder_is_a_clear_error(tmp_path: Path, embedder: CountingEmbedder) -> None:
    with pytest.raises(SourceSearchError, match="does not exist"):
        LocalSourceIndex(tmp_path / "nope", embedder, tmp_path / "index")


def test_chunks_are_bounded_overlapping_and_complete() -> None:
    assert chunk_text("") == [] and chunk_text("short text") == ["short text"]
    paragraphs = [f"Paragraph {i}: " + " ".join(f"word{i}_{j}" for j in range(40)) for i in range(12)]
    text = "\n\n".join(paragraphs)
    chunks = chunk_text(text, size=1500, overlap=200)
    assert len(chunks) > 1 and all(len(c) <= 1500 for c in chunks)
    for a, b in itertools.pairwise(chunks):
        assert b[:40] in a  # each chunk starts inside the previous one's tail
    for p in paragraphs:
        assert p.split()[-1] in " ".join(chunks)


# ---- Tavily, against a real local server ----------------------------------------------------------------------

received: list[dict[str, Any]] = []


async def _search(request: Request) -> JSONResponse:
    if request.headers.get("authorization") != f"Bearer {KEY}":
        return JSONResponse({"detail": {"error": "Unauthorized: missing or invalid API key."}}, status_code=401)
    body = await request.json()
    received.append(body)
    query = body["query"]
    if query == "rate limit":
        return JSONResponse({"detail": {"error": "Too many requests"}}, status_code=429)
    if query == "crash":
        return JSONResponse({"detail": {"error": "Internal server error"}}, status_code=500)
    if query == "slow":
        await asyncio.sleep(1.5)
    if query == "garbage":  # results without a url (a response with no results at all reads as none found)
        return JSONResponse({"query": query, "results": [{"title": "no url"}]})
    results = [
        {
            "title": f"Result {i} for {query}",
            "url": f"https://docs.example.com/{i}",
            "content": f"API reference snippet {i} about {query}.",
            "score": round(0.9 - i / 10, 2),
            "raw_content": None,
        }
        for i in range(body["max_results"])
    ]
    return JSONResponse({"query": query, "answer": None, "results": results, "response_time": "0.01"})


@pytest.fixture(scope="module")
def tavily_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/search", _search, methods=["POST"])])
    with serving_on_socket(app, "the local Tavily server") as port:
        yield f"http://127.0.0.1:{port}"


def test_tavily_search_returns_web_sources(tavily_url: str) -> None:
    docs = TavilySearch(KEY, tavily_url, timeout=5).search("car rental API reservations", k=3)
    assert [d.kind for d in docs] == ["web"] * 3
    assert docs[0].title == "Result 0 for car rental API reservations"
    assert docs[0].location == "https://docs.example.com/0" and docs[0].score == 0.9
    assert docs[0].text == "API reference snippet 0 about car rental API reservations."
    assert received[-1] == {"query": "car rental API reservations", "max_results": 3, "search_depth": "basic"}
    TavilySearch(KEY, tavily_url, search_depth="advanced").search("x", k=50)
    assert received[-1]["max_results"] == 20 and received[-1]["search_depth"] == "advanced"


@pytest.mark.parametrize(
    ("key", "query", "status", "message"),
    [
        ("wrong-key", "x", 401, "rejected the API key"),
        (KEY, "rate limit", 429, "rate limit"),
        (KEY, "crash", 500, "server error"),
        (KEY, "garbage", 200, "unexpected response"),
    ],
)
def test_tavily_errors_are_clear(tavily_url: str, key: str, query: str, status: int, message: str) -> None:
    with pytest.raises(SourceSearchError, match=message) as err:
        TavilySearch(key, tavily_url, timeout=5).search(query)
    assert err.value.status == status and isinstance(err.value, EnvFactoryError)
    if status != 200:
        assert f"HTTP {status}" in str(err.value)


def test_tavily_timeout_and_unreachable(tavily_url: str) -> None:
    with pytest.raises(SourceSearchError, match=r"timed out after 0\.3s"):
        TavilySearch(KEY, tavily_url, timeout=0.3).search("slow")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens here once the socket closes
    with pytest.raises(SourceSearchError, match="cannot reach"):
        TavilySearch(KEY, f"http://127.0.0.1:{closed}", timeout=2).search("x")
    with pytest.raises(SourceSearchError, match="API key"):
        TavilySearch("")


# ---- search_sources: web when a key is set, else the local folder ---------------------------------------------------


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TAVILY_API_KEY", "ENVFACTORY_TAVILY_API_KEY", "ENVFACTORY_DOCS_DIR"):
        monkeypatch.delenv(var, raising=False)


def test_search_sources_prefers_tavily_when_a_key_is_set(
    no_keys: None, tmp_path: Path, tavily_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(root=tmp_path, tavily_api_key=KEY, docs_dir=SOURCES)
    assert search_sources("parcel tracking", settings, 2, tavily_base_url=tavily_url)[0].kind == "web"
    monkeypatch.setenv("TAVILY_API_KEY", KEY)  # the plain variable works too
    plain = Settings(root=tmp_path)
    assert len(search_sources("parcel tracking", plain, 4, tavily_base_url=tavily_url)) == 4


def test_search_sources_falls_back_to_the_local_folder(
    no_keys: None, tmp_path: Path, embedder: CountingEmbedder
) -> None:
    (tmp_path / "sources").symlink_to(SOURCES)
    settings = Settings(root=tmp_path, docs_dir=Path("sources"), data_dir=tmp_path / "data")  # relative to root
    docs = search_sources("refill my prescription", settings, 2, embedder=embedder)
    assert Path(docs[0].location).name == "pharmacy_prescriptions.openapi.yaml" and docs[0].kind == "openapi"
    assert (tmp_path / "data" / "chroma").is_dir()


def test_search_sources_without_any_source_says_what_to_set(no_keys: None, tmp_path: Path) -> None:
    with pytest.raises(SourceSearchError, match=r"TAVILY_API_KEY.*ENVFACTORY_DOCS_DIR"):
        search_sources("anything", Settings(root=tmp_path))
