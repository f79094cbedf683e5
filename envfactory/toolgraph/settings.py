"""Where the tool graph's files live. Its settings are `ToolGraphSettings` in the one settings root
(`envfactory.config`: `Settings().toolgraph`, `ENVFACTORY_TOOLGRAPH__*` environment variables)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envfactory.config import Settings
    from envfactory.env.pool import EnvPool

# the `ToolGraphSettings` a build reads that change the graph (the rest say how fast it embeds, or shape sampling)
GRAPH_SHAPING = (
    "build_edge_threshold",
    "name_type_weight",
    "name_share",
    "cross_env_edges",
    "cross_env_top_k",
    "schema_edges",
    "lean_internal_threshold",
    "use_llm",
    "llm_role",
)


def graph_path(settings: Settings) -> Path:
    """Where `envfactory graph build` writes and the other commands read by default."""
    return settings.data_path / "toolgraph" / "graph.json"


def envs_graph_path(settings: Settings, envs: Iterable[str], pool: EnvPool) -> Path:
    """Where a synth run keeps the graph of its environments alone when the data dir has no `graph_path` graph:
    `graph-<digest>.json`, the digest of what the graph is built from (`graph_inputs`). An environment whose tools
    changed, or settings that shape the graph otherwise, name another file: that graph is built afresh (the
    embeddings of unchanged texts are cached), and a resume still reads the file its first part recorded."""
    digest = hashlib.sha256(graph_inputs(settings, envs, pool).encode("utf-8")).hexdigest()[:12]
    return settings.data_path / "toolgraph" / f"graph-{digest}.json"


def graph_inputs(settings: Settings, envs: Iterable[str], pool: EnvPool) -> str:
    """What a graph of `envs` is built from, as canonical JSON: the set of environments, their tools as the builder
    sees them (`pool_sources`), the embedding model, the settings that shape the graph (`GRAPH_SHAPING`) and, where
    the build asks an LLM, that model."""
    from envfactory.run_settings import model_identity
    from envfactory.toolgraph.collect import pool_sources

    names = sorted(set(envs))
    tg = settings.toolgraph
    llm = model_identity(settings, tg.llm_role).model_dump() if tg.use_llm else None
    what = {
        "envs": names,
        "tools": [source.model_dump(mode="json") for source in pool_sources(pool, names)],
        "embedding_model": str(settings.embedding_model),
        "settings": tg.model_dump(mode="json", include=set(GRAPH_SHAPING)),
        "llm": llm if llm is not None and llm["provider"] != "none" else None,
    }
    return json.dumps(what, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def cache_path(settings: Settings) -> Path:
    """The embedding cache of parameter texts (a folder holding one SQLite file)."""
    return settings.data_path / "toolgraph" / "embeddings"


def onnx_path(settings: Settings) -> Path:
    """Where embedding models exported to ONNX are kept, one folder per model files' hash."""
    return settings.data_path / "models" / "onnx"
