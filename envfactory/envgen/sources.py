"""Authentic sources for the Search Agent: API docs found on the web (Tavily) or in a local folder.

EnvGen grounds a proposed environment in real API documentation. With a Tavily key the Search
Agent searches the web; without one (the offline path) it searches a local folder of documents
(markdown, text, OpenAPI JSON/YAML), chunked and embedded in a persistent chroma collection that
re-indexes only files whose content changed and forgets files that were removed.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ValidationError

from envfactory.config import Settings
from envfactory.errors import ServiceError
from envfactory.inputs import InputError, parse_json, parse_yaml, read_file_bytes, read_text
from envfactory.llm.embeddings import Embedder, IndexSync, TextEmbedder, max_batch, open_collection, text_hash

if TYPE_CHECKING:
    from chromadb.api.types import Metadata

log = logging.getLogger(__name__)

SourceKind = Literal["openapi", "markdown", "text", "web"]
TAVILY_URL = "https://api.tavily.com"
_TEXT_SUFFIXES = {".md": "markdown", ".markdown": "markdown", ".txt": "text", ".rst": "text"}
_SPEC_SUFFIXES = {".json", ".yaml", ".yml"}
_LOCAL_KINDS: dict[str, SourceKind] = {"openapi": "openapi", "markdown": "markdown", "text": "text"}
_HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


class SourceSearchError(ServiceError):
    """A source search failed: web search refused or unreachable, or no source configured."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class SourceDoc(BaseModel):
    """One retrieved source: a web page or a chunk of a local document."""

    title: str
    location: str
    text: str
    kind: SourceKind
    score: float | None = None


# ---- reading and chunking local documents ---------------------------------------------------------


def chunk_text(text: str, size: int = 1500, overlap: int = 200) -> list[str]:
    """Pieces of about `size` characters, cut at paragraph, line, sentence or word boundaries,
    each repeating the last ~`overlap` characters of the one before (context across the cut)."""
    text = text.strip()
    if len(text) <= size:
        return [text] if text else []
    chunks: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            for sep in ("\n\n", "\n", ". ", " "):
                cut = text.rfind(sep, start + size // 2, end)
                if cut != -1:
                    end = cut + len(sep)
                    break
        piece = text[start:end].strip()
        if piece:
            chunks.append(piece)
        if end >= len(text):
            break
        nxt = max(end - overlap, start + 1)
        space = text.find(" ", nxt, end)
        start = space + 1 if space != -1 else nxt
    return chunks


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _seq(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def render_openapi(doc: dict[str, Any]) -> str:
    """A readable text of an OpenAPI document (what embeds well): title, description, operations."""
    info = _obj(doc.get("info"))
    lines = [str(info.get("title") or "API"), str(info.get("description") or "").strip(), ""]
    paths = _obj(doc.get("paths"))
    for route, item in paths.items():
        if not isinstance(item, dict):
            continue
        for method in _HTTP_METHODS:
            op = item.get(method)
            if not isinstance(op, dict):
                continue
            head = f"{method.upper()} {route}"
            if op.get("operationId"):
                head += f" ({op['operationId']})"
            about = " ".join(str(op.get(k) or "").strip() for k in ("summary", "description")).strip()
            params = [p for p in [*_seq(item.get("parameters")), *_seq(op.get("parameters"))] if isinstance(p, dict)]
            names = [
                str(p["name"]) + (f": {p['description']}" if p.get("description") else "")
                for p in params
                if "name" in p
            ]
            lines.append(f"{head}: {about}" if about else head)
            if names:
                lines.append("  parameters: " + "; ".join(names))
        lines.append("")
    return "\n".join(lines).strip()


def _markdown_title(text: str, fallback: str) -> str:
    for line in text.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return fallback


def _text_title(text: str, fallback: str) -> str:
    """The first line when it reads like a title (short), else the file name."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first if 0 < len(first) <= 120 else fallback


def read_source(path: Path) -> tuple[str, SourceKind, str] | None:
    """(title, kind, text) of a document, or None if it is not a source (e.g. JSON that is not OpenAPI)."""
    suffix = path.suffix.lower()
    try:
        raw = read_text(path, what="source document")
    except InputError as e:
        log.warning("skipping %s", e)
        return None
    if suffix in _TEXT_SUFFIXES:
        kind: SourceKind = "markdown" if _TEXT_SUFFIXES[suffix] == "markdown" else "text"
        fallback = path.stem.replace("_", " ").replace("-", " ")
        title = _markdown_title(raw, fallback) if kind == "markdown" else _text_title(raw, fallback)
        return title, kind, raw
    if suffix in _SPEC_SUFFIXES:
        try:
            doc = parse_json(raw, str(path)) if suffix == ".json" else parse_yaml(raw, str(path))
        except InputError as e:
            log.warning("skipping %s", e)
            return None
        if not isinstance(doc, dict) or not ({"openapi", "swagger"} & doc.keys()):
            return None
        info = _obj(doc.get("info"))
        return str(info.get("title") or path.stem), "openapi", render_openapi(doc)
    return None


# ---- the local index ----------------------------------------------------------------------------------


class LocalSourceIndex:
    """Chunks of the documents under `docs_dir`, embedded in a persistent chroma collection at `path`.

    Each chunk is embedded with its document's title in front. Note that the model truncates its input
    (MiniLM: 256 tokens, roughly 1000 characters), so the tail of a 1500-character chunk is only found
    through the overlap with the next chunk; pass a smaller `chunk_size` for finer retrieval.
    """

    def __init__(
        self,
        docs_dir: str | Path,
        embedder: TextEmbedder,
        path: str | Path,
        *,
        chunk_size: int = 1500,
        overlap: int = 200,
    ) -> None:
        self.docs_dir = Path(docs_dir).resolve()
        if not self.docs_dir.is_dir():
            raise SourceSearchError(f"sources folder {self.docs_dir} does not exist")
        self.embedder = embedder
        self.chunk_size, self.overlap = chunk_size, overlap
        # one collection per folder: refreshing one folder must not drop another's documents
        self.collection = open_collection(path, f"sources-{text_hash(str(self.docs_dir))[:8]}", embedder)
        self._synced = False

    def files(self) -> list[Path]:
        suffixes = _TEXT_SUFFIXES.keys() | _SPEC_SUFFIXES
        return sorted(
            p
            for p in self.docs_dir.rglob("*")
            if p.is_file()
            and p.suffix.lower() in suffixes
            and not any(part.startswith(".") for part in p.relative_to(self.docs_dir).parts)
        )

    def refresh(self) -> IndexSync:
        """Index new and changed files (by content hash), drop removed ones. Counts are files."""
        got = self.collection.get(include=["metadatas"])
        indexed: dict[str, str] = {}
        chunk_ids: dict[str, list[str]] = {}
        for id_, meta in zip(got["ids"], got["metadatas"] or [], strict=True):
            indexed[str(meta["path"])] = str(meta["hash"])
            chunk_ids.setdefault(str(meta["path"]), []).append(id_)
        sync = IndexSync()
        drop: list[str] = []
        ids: list[str] = []
        texts: list[str] = []
        docs: list[str] = []
        metas: list[Metadata] = []
        seen: set[str] = set()
        for file in self.files():
            rel = file.relative_to(self.docs_dir).as_posix()
            seen.add(rel)
            try:
                content = read_file_bytes(file, what="source document")
            except InputError as e:
                log.warning("skipping %s", e)
                continue
            # the chunking parameters are part of the key: changing them re-chunks every file
            digest = hashlib.sha256(f"{self.chunk_size}:{self.overlap}:".encode() + content).hexdigest()
            if indexed.get(rel) == digest:
                sync.unchanged += 1
                continue
            drop += chunk_ids.get(rel, [])
            parsed = read_source(file)
            if parsed is None:
                sync.removed += rel in indexed
                continue
            if rel in indexed:
                sync.updated += 1
            else:
                sync.added += 1
            title, kind, text = parsed
            for i, piece in enumerate(chunk_text(text, self.chunk_size, self.overlap)):
                ids.append(f"{rel}#{i}")
                texts.append(f"{title}\n{piece}")  # the title gives every chunk its document's context
                docs.append(piece)
                metas.append({"path": rel, "title": title, "kind": kind, "hash": digest, "chunk": i})
        for rel in sorted(indexed.keys() - seen):
            drop += chunk_ids[rel]
            sync.removed += 1
        if drop:
            self.collection.delete(ids=drop)
        if ids:
            vectors = self.embedder.embed(texts)
            step = max_batch(self.collection)
            for start in range(0, len(ids), step):
                end = start + step
                self.collection.add(
                    ids=ids[start:end],
                    embeddings=vectors[start:end],
                    documents=docs[start:end],
                    metadatas=metas[start:end],
                )
        sync.embedded = len(ids)
        self._synced = True
        return sync

    def search(self, query: str, k: int = 5, *, distinct: bool = True) -> list[SourceDoc]:
        """The `k` chunks most similar to `query`; with `distinct`, at most one (the best) per file."""
        if not self._synced:
            self.refresh()
        count = self.collection.count()
        if count == 0 or k <= 0:
            return []
        res = self.collection.query(
            query_embeddings=self.embedder.embed([query]),
            n_results=min(count, k * 4 if distinct else k),
            include=["documents", "metadatas", "distances"],
        )
        documents, metadatas, distances = res["documents"], res["metadatas"], res["distances"]
        assert documents is not None and metadatas is not None and distances is not None
        out: list[SourceDoc] = []
        seen: set[str] = set()
        for doc, meta, dist in zip(documents[0], metadatas[0], distances[0], strict=True):
            rel = str(meta["path"])
            if distinct and rel in seen:
                continue
            seen.add(rel)
            out.append(
                SourceDoc(
                    title=str(meta["title"]),
                    location=str(self.docs_dir / rel),
                    text=doc,
                    kind=_LOCAL_KINDS.get(str(meta["kind"]), "text"),
                    score=round(1.0 - float(dist), 6),
                )
            )
            if len(out) == k:
                break
        return out


# ---- web search (Tavily) ----------------------------------------------------------------------------------


class _TavilyResult(BaseModel):
    title: str = ""
    url: str
    content: str = ""
    score: float | None = None
    raw_content: str | None = None


class _TavilyResponse(BaseModel):
    results: list[_TavilyResult]


class TavilySearch:
    """Tavily web search through the official client (`tavily-python`'s `TavilyClient`; `base_url` is its
    `api_base_url`, so a local stand-in server works too); failures become `SourceSearchError`."""

    def __init__(
        self,
        api_key: str,
        base_url: str = TAVILY_URL,
        timeout: float = 30.0,
        *,
        search_depth: Literal["basic", "advanced"] = "basic",
    ) -> None:
        if not api_key:
            raise SourceSearchError("Tavily needs an API key (TAVILY_API_KEY or ENVFACTORY_TAVILY_API_KEY)")
        from tavily import TavilyClient

        self.base_url, self.timeout, self.search_depth = base_url.rstrip("/"), timeout, search_depth
        self.client = TavilyClient(api_key=api_key, api_base_url=self.base_url)

    def search(self, query: str, k: int = 5) -> list[SourceDoc]:
        import requests
        from tavily import errors

        url = f"{self.base_url}/search"
        try:  # Tavily accepts 1..20 results per request
            raw = self.client.search(
                query, max_results=max(1, min(k, 20)), search_depth=self.search_depth, timeout=self.timeout
            )
        except errors.TimeoutError:
            raise SourceSearchError(f"Tavily search timed out after {self.timeout:g}s ({url})") from None
        except (errors.InvalidAPIKeyError, errors.ForbiddenError) as e:
            raise SourceSearchError(_problem("rejected the API key", 401, e), status=401) from None
        except errors.UsageLimitExceededError as e:
            raise SourceSearchError(
                _problem("rate limit or credits exhausted; retry later", 429, e), status=429
            ) from None
        except errors.BadRequestError as e:
            raise SourceSearchError(_problem("rejected the request", 400, e), status=400) from None
        except requests.HTTPError as e:
            status = e.response.status_code if e.response is not None else 0
            what = "server error; retry later" if status >= 500 else "rejected the request"
            raise SourceSearchError(_problem(what, status, e), status=status) from None
        except requests.RequestException as e:
            raise SourceSearchError(f"Tavily search failed: cannot reach {url}: {type(e).__name__}: {e}") from None
        try:
            parsed = _TavilyResponse.model_validate(raw)
        except ValidationError as e:
            raise SourceSearchError(f"Tavily search returned an unexpected response: {e}", status=200) from None
        return [
            SourceDoc(
                title=r.title or r.url, location=r.url, text=r.raw_content or r.content, kind="web", score=r.score
            )
            for r in parsed.results
        ]


def _problem(what: str, status: int, e: Exception) -> str:
    return f"Tavily search {what} (HTTP {status}): {e}"


# ---- the Search Agent's entry point ----------------------------------------------------------------------


def search_sources(
    query: str,
    settings: Settings,
    k: int = 5,
    *,
    embedder: TextEmbedder | None = None,
    tavily_base_url: str = TAVILY_URL,
) -> list[SourceDoc]:
    """Sources for `query`: Tavily when a key is set (settings or TAVILY_API_KEY), else the local docs folder."""
    key = settings.tavily_api_key or os.environ.get("TAVILY_API_KEY")
    if key:
        return TavilySearch(key, tavily_base_url).search(query, k)
    if settings.docs_dir is None:
        raise SourceSearchError(
            "no source to search: set TAVILY_API_KEY (or ENVFACTORY_TAVILY_API_KEY) for web search, "
            "or ENVFACTORY_DOCS_DIR to a folder of API docs (the repository ships one: sources/)"
        )
    docs_dir = settings.docs_dir if settings.docs_dir.is_absolute() else settings.root / settings.docs_dir
    index = LocalSourceIndex(docs_dir, embedder or Embedder(settings.embedding_model), settings.data_path / "chroma")
    return index.search(query, k)
