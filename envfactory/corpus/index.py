"""Searching the corpus: a persistent chroma collection over its specs, embedded with the project's MiniLM.

Per spec: one vector for the API (title and description) and one per operation (the spec's title and the
operation's summary; the first `index_operations` distinct ones in document order). Each vector carries
the spec's domain (`envfactory.corpus.domains`), so a search can stay inside one domain. A spec's score
for a query is its best vector, so "refund a payment" finds the API that has that operation. Entries are
keyed by a hash of their text and domain: a refresh embeds only what is new and drops what left.

`corpus_gaps` ranks the specs that would fill the pool's least covered domains (`PoolIndex.domain_gaps`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel

from envfactory.config import Settings
from envfactory.corpus.models import Operation, SpecEntry
from envfactory.corpus.store import Corpus
from envfactory.envgen.coverage import PoolIndex
from envfactory.envgen.sources import SourceDoc, render_openapi
from envfactory.llm.embeddings import IndexSync, TextEmbedder, max_batch, open_collection, text_hash

Progress = Callable[[str, int, int], None]
_SOURCE_CHARS = 6000  # of a spec rendered as text, handed to the Search Agent's prompt
Kind = Literal["api", "operation"]


class SearchHit(BaseModel):
    """A spec near a query: `matched` is what matched best, `description` or an operation (`GET /path`)."""

    spec: str
    title: str
    domain: str
    similarity: float
    kind: Kind
    matched: str
    text: str


class GapPick(BaseModel):
    """A spec proposed for a thin domain of the pool, with why: its shape and how new it is to the pool."""

    domain: str
    pool_envs: int
    pool_tools: int
    spec: str
    title: str
    operations: int
    crud_resources: int
    licence: str | None
    nearest_env: str | None
    similarity: float  # to the nearest pool environment, as wholes (see corpus_gaps)


_API_DESCRIPTION_CHARS = 500  # MiniLM reads ~128 word pieces well; more only costs time


def api_text(entry: SpecEntry) -> str:
    """What is embedded for a spec's API: its title and the start of its description."""
    if not entry.description:
        return entry.title
    return f"{entry.title}: {entry.description[:_API_DESCRIPTION_CHARS]}"


def operation_text(entry: SpecEntry, op: Operation) -> str:
    """What is embedded for an operation: the spec's title and the operation's summary (else its id, else its route)."""
    what = op.summary or (op.operation_id or "").replace("_", " ") or f"{op.method} {op.path}"
    return f"{entry.title} - {what}"


class CorpusIndex:
    """The corpus's vectors in a persistent chroma collection (default `<corpus folder>/chroma`)."""

    def __init__(self, corpus: Corpus, embedder: TextEmbedder, path: str | Path | None = None) -> None:
        self.corpus = corpus
        self.embedder = embedder
        where = path or corpus.cs.index_path(corpus.settings)
        self.collection = open_collection(where, f"corpus-{corpus.cs.package}-{corpus.cs.version}", embedder)

    def wanted(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Every entry the index should hold: id → (text, metadata)."""
        per_spec = self.corpus.cs.index_operations
        operations = self.corpus.operations() if per_spec else {}
        out: dict[str, tuple[str, dict[str, Any]]] = {}

        def add(entry: SpecEntry, kind: Kind, matched: str, text: str) -> None:
            digest = text_hash(entry.domain + "\n" + text)[:20]
            key = f"{entry.id}::{kind}::{digest}"
            out[key] = (text, {"spec": entry.id, "kind": kind, "domain": entry.domain, "matched": matched})

        for entry in self.corpus.manifest().specs:
            add(entry, "api", "description", api_text(entry))
            seen: set[str] = set()
            for op in operations.get(entry.id, []):
                if len(seen) >= per_spec:
                    break
                text = operation_text(entry, op)
                if text not in seen:
                    seen.add(text)
                    add(entry, "operation", f"{op.method} {op.path}", text)
        return out

    def refresh(self, progress: Progress | None = None) -> IndexSync:
        """Bring the collection in line with the corpus: embed new entries, drop stale ones."""
        wanted = self.wanted()
        existing = set(self.collection.get(include=[])["ids"])
        new = [i for i in wanted if i not in existing]
        stale = sorted(existing - wanted.keys())
        if stale:
            step = max_batch(self.collection)
            for start in range(0, len(stale), step):
                self.collection.delete(ids=stale[start : start + step])
        batch = min(self.corpus.cs.embed_batch, max_batch(self.collection))
        for start in range(0, len(new), batch):
            ids = new[start : start + batch]
            texts = [wanted[i][0] for i in ids]
            self.collection.add(
                ids=ids, embeddings=self.embedder.embed(texts), documents=texts, metadatas=[wanted[i][1] for i in ids]
            )
            if progress is not None:
                progress("index (texts)", start + len(ids), len(new))

        def specs(ids: Any) -> set[str]:
            return {str(i).split("::", 1)[0] for i in ids}

        touched, before, now = specs(new), specs(existing), specs(wanted)
        return IndexSync(
            added=len(touched - before),
            updated=len(touched & before),
            removed=len(specs(stale) - now),
            unchanged=len(now - touched),
            embedded=len(new),
        )

    def search(self, query: str, k: int = 10, *, domain: str | None = None) -> list[SearchHit]:
        """The `k` specs most similar to `query` (cosine, best first), inside `domain` when given.

        An empty index is built first."""
        if self.collection.count() == 0:
            self.refresh()
        count = self.collection.count()
        if count == 0 or k <= 0:
            return []
        n = min(count, k * (self.corpus.cs.index_operations + 1))
        res = self.collection.query(
            query_embeddings=self.embedder.embed([query]),
            n_results=n,
            where={"domain": domain} if domain else None,
            include=["metadatas", "distances", "documents"],
        )
        metadatas, distances, documents = res["metadatas"], res["distances"], res["documents"]
        assert metadatas is not None and distances is not None and documents is not None
        best: dict[str, SearchHit] = {}
        for meta, dist, doc in zip(metadatas[0], distances[0], documents[0], strict=True):
            spec = str(meta["spec"])
            if spec in best:  # results come best first
                continue
            kind: Kind = "api" if meta["kind"] == "api" else "operation"
            best[spec] = SearchHit(
                spec=spec,
                title=self.corpus.entry(spec).title,
                domain=str(meta["domain"]),
                similarity=round(1.0 - float(dist), 6),
                kind=kind,
                matched=str(meta["matched"]),
                text=str(doc),
            )
        return list(best.values())[:k]

    def spec_vectors(self, domain: str) -> dict[str, np.ndarray]:
        """One vector per indexed spec of `domain`: the normalized mean of its API and operation vectors (what
        the whole API is about; many APIs of one provider share a boilerplate description)."""
        got = self.collection.get(where={"domain": domain}, include=["embeddings", "metadatas"])
        return _centroids(got["metadatas"], got["embeddings"], "spec")


def _centroids(metadatas: Any, embeddings: Any, key: str) -> dict[str, np.ndarray]:
    """Normalized mean vector per value of `key` in the entries' metadata."""
    if metadatas is None or embeddings is None or len(metadatas) == 0:
        return {}
    vectors = np.asarray(embeddings, dtype=np.float32)
    groups: dict[str, list[int]] = {}
    for i, meta in enumerate(metadatas):
        groups.setdefault(str(meta[key]), []).append(i)
    out: dict[str, np.ndarray] = {}
    for name, rows in groups.items():
        mean = vectors[rows].mean(axis=0)
        out[name] = mean / max(float(np.linalg.norm(mean)), 1e-12)
    return out


def corpus_gaps(
    index: CorpusIndex,
    pool_index: PoolIndex,
    *,
    domains: int = 3,
    per_domain: int = 5,
    threshold: float | None = None,
    licence: str | None = None,
) -> list[GapPick]:
    """Specs for the pool's `domains` least covered domains, `per_domain` each.

    Candidates have between `gap_min_operations` and `gap_max_operations` operations (a size an environment
    can have). They are ranked CRUD-shaped first (`crud_resources` > 0), then least similar to the pool. A
    spec and an environment are compared as wholes: the normalized mean of a spec's vectors (API and
    operations) against that of an environment's (description and tools). A spec at or above `threshold`
    (default: the pool settings' `similarity_threshold`) to a pool environment or to a spec already picked
    is passed over (a near-duplicate: the same API in another version, or one the pool has). `licence`
    keeps only the specs with that licence (as `Corpus.entries` reads it).
    """
    cs = index.corpus.cs
    limit = pool_index.pool.settings.similarity_threshold if threshold is None else threshold
    if index.collection.count() == 0:
        index.refresh()
    pool_index.refresh()
    pool = pool_index.collection.get(include=["embeddings", "metadatas"])
    envs = _centroids(pool["metadatas"], pool["embeddings"], "env")
    env_names = list(envs)
    pool_matrix = np.stack([envs[n] for n in env_names]) if envs else None
    picks: list[GapPick] = []
    for gap in pool_index.domain_gaps()[:domains]:
        vectors = index.spec_vectors(gap.domain)
        ranked: list[tuple[tuple[bool, float, str], SpecEntry, str | None, float]] = []
        for entry in index.corpus.entries(domain=gap.domain, licence=licence):
            if not cs.gap_min_operations <= entry.operations <= cs.gap_max_operations or entry.id not in vectors:
                continue
            nearest, similarity = None, 0.0
            if pool_matrix is not None:
                sims = pool_matrix @ vectors[entry.id]
                best = int(np.argmax(sims))
                nearest, similarity = env_names[best], float(sims[best])
            ranked.append(((entry.crud_resources == 0, similarity, entry.id), entry, nearest, similarity))
        ranked.sort(key=lambda r: r[0])
        chosen: list[np.ndarray] = []
        for _, entry, nearest, similarity in ranked:
            if len(chosen) >= per_domain:
                break
            vector = vectors[entry.id]
            if similarity >= limit or any(float(v @ vector) >= limit for v in chosen):
                continue
            chosen.append(vector)
            picks.append(
                GapPick(
                    domain=gap.domain,
                    pool_envs=gap.env_count,
                    pool_tools=gap.tool_count,
                    spec=entry.id,
                    title=entry.title,
                    operations=entry.operations,
                    crud_resources=entry.crud_resources,
                    licence=entry.licence_id or entry.licence,
                    nearest_env=nearest,
                    similarity=round(similarity, 4),
                )
            )
    return picks


def corpus_sources(
    settings: Settings, embedder: TextEmbedder, query: str, k: int = 2, *, domain: str | None = None
) -> list[SourceDoc]:
    """The `k` corpus specs nearest to `query` as sources for the Search Agent (the spec rendered as text,
    cut at 6,000 characters), or none when the corpus is not fetched and indexed (an agent never builds the index)."""
    corpus = Corpus(settings)
    if not corpus.manifest_path.is_file():
        return []
    index = CorpusIndex(corpus, embedder)
    if index.collection.count() == 0:
        return []
    docs: list[SourceDoc] = []
    for hit in index.search(query, k, domain=domain):
        entry = corpus.entry(hit.spec)
        text = render_openapi(corpus.document(hit.spec))
        docs.append(
            SourceDoc(
                title=entry.title,
                location=f"corpus:{entry.id}",
                text=text[:_SOURCE_CHARS],
                kind="openapi",
                score=hit.similarity,
            )
        )
    return docs
