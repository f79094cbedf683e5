"""Pool coverage for the Search Agent: which domains are thin, what a proposal is closest to, is it new.

EnvGen's Search Agent proposes environments where the pool is thin and rejects proposals that
duplicate an existing environment. `PoolIndex` keeps, per environment, one vector for its
description and one per tool (name and description) in a persistent chroma collection; an
environment's similarity to a text is the best match over its vectors, so a query phrased like
one tool ("reserve a table") finds the environment that has it. Entries are keyed by a hash of
their text, so a refresh re-embeds only what changed and drops what left the pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from envfactory.env.metadata import DOMAINS, EnvMetadata
from envfactory.env.pool import EnvPool, read_metadata
from envfactory.llm.embeddings import IndexSync, TextEmbedder, max_batch, open_collection, text_hash


class DomainGap(BaseModel):
    """How well one domain is covered by the pool."""

    domain: str
    env_count: int
    tool_count: int
    envs: list[str] = Field(default_factory=list)


class Neighbor(BaseModel):
    """A pool environment near a text; `matched` is what matched best: 'description' or a tool name."""

    env: str
    domain: str
    similarity: float
    matched: str


class NoveltyVerdict(BaseModel):
    """Whether a proposal duplicates a pool environment (similarity at or above the threshold)."""

    is_duplicate: bool
    nearest: Neighbor | None
    similarity: float
    threshold: float


def _envs_of(ids: Any) -> set[str]:
    return {str(i).split(":", 1)[0] for i in ids}


def _human(name: str) -> str:
    return name.replace("_", " ")


def entry_texts(meta: EnvMetadata) -> dict[str, str]:
    """What is embedded for one environment: its description, and each tool in its context."""
    title = _human(meta.name)
    texts = {"description": f"{title}: {meta.description}"}
    for tool in meta.tools:
        texts[tool.name] = f"{title} - {_human(tool.name)}: {tool.description}"
    return texts


class PoolIndex:
    """Embeddings of the pool's environments in a persistent chroma collection at `path`."""

    def __init__(self, pool: EnvPool, embedder: TextEmbedder, path: str | Path) -> None:
        self.pool = pool
        self.embedder = embedder
        self.collection = open_collection(path, "pool", embedder)
        self._synced = False
        self._max_entries = 1

    # ---- pool contents -----------------------------------------------------------------------------
    def metadata(self) -> dict[str, EnvMetadata]:
        """Metadata of every pool environment, read afresh (native ones from metadata.json, without importing code)."""
        native = set(self.pool.native_names())
        return {
            name: read_metadata(self.pool.folder / name) if name in native else self.pool.get(name).metadata
            for name in self.pool.names()
        }

    def domain_gaps(self) -> list[DomainGap]:
        """Every domain, least covered first (fewest environments, then fewest tools)."""
        gaps = {d: DomainGap(domain=d, env_count=0, tool_count=0) for d in DOMAINS}
        for name, meta in sorted(self.metadata().items()):
            gap = gaps[meta.domain]
            gap.env_count += 1
            gap.tool_count += len(meta.tools)
            gap.envs.append(name)
        order = {d: i for i, d in enumerate(DOMAINS)}
        return sorted(gaps.values(), key=lambda g: (g.env_count, g.tool_count, order[g.domain]))

    # ---- the vector index ----------------------------------------------------------------------------
    def refresh(self) -> IndexSync:
        """Bring the collection in line with the pool: embed new or changed entries, drop stale ones."""
        wanted: dict[str, tuple[str, dict[str, Any]]] = {}
        for name, meta in self.metadata().items():
            for matched, text in entry_texts(meta).items():
                key = text_hash(f"{meta.domain}\n{text}")[:24]
                wanted[f"{name}:{key}"] = (text, {"env": name, "domain": meta.domain, "matched": matched})
            self._max_entries = max(self._max_entries, len(meta.tools) + 1)
        existing = set(self.collection.get(include=[])["ids"])
        new = [i for i in wanted if i not in existing]
        stale = sorted(existing - wanted.keys())
        if stale:
            self.collection.delete(ids=stale)
        if new:
            vectors = self.embedder.embed([wanted[i][0] for i in new])
            step = max_batch(self.collection)
            for start in range(0, len(new), step):
                ids = new[start : start + step]
                self.collection.add(
                    ids=ids,
                    embeddings=vectors[start : start + step],
                    documents=[wanted[i][0] for i in ids],
                    metadatas=[wanted[i][1] for i in ids],
                )
        touched, gone = _envs_of(new), _envs_of(stale) - _envs_of(wanted)
        before = _envs_of(existing)
        self._synced = True
        return IndexSync(
            added=len(touched - before),
            updated=len(touched & before),
            removed=len(gone),
            unchanged=len(_envs_of(wanted) - touched),
            embedded=len(new),
        )

    def nearest(self, text: str, k: int = 5) -> list[Neighbor]:
        """The `k` environments most similar to `text` (cosine similarity, best first)."""
        if not self._synced:
            self.refresh()
        count = self.collection.count()
        if count == 0 or k <= 0:
            return []
        vector = self.embedder.embed([text])
        # the best entries of the top-k environments are all among the top k × (entries per env) entries
        res = self.collection.query(
            query_embeddings=vector, n_results=min(count, k * self._max_entries), include=["metadatas", "distances"]
        )
        metadatas, distances = res["metadatas"], res["distances"]
        assert metadatas is not None and distances is not None
        best: dict[str, Neighbor] = {}
        for meta, dist in zip(metadatas[0], distances[0], strict=True):
            env = str(meta["env"])
            if env not in best:  # results come best first
                best[env] = Neighbor(
                    env=env,
                    domain=str(meta["domain"]),
                    similarity=round(1.0 - float(dist), 6),
                    matched=str(meta["matched"]),
                )
        return list(best.values())[:k]

    def novelty(self, text: str, threshold: float | None = None) -> NoveltyVerdict:
        """Is `text` (a proposed environment's description) a near-duplicate of a pool environment?

        `threshold` defaults to the pool settings' `similarity_threshold`.
        """
        limit = self.pool.settings.similarity_threshold if threshold is None else threshold
        top = self.nearest(text, k=1)
        if not top:
            return NoveltyVerdict(is_duplicate=False, nearest=None, similarity=0.0, threshold=limit)
        return NoveltyVerdict(
            is_duplicate=top[0].similarity >= limit, nearest=top[0], similarity=top[0].similarity, threshold=limit
        )
