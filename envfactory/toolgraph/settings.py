"""Where the tool graph's files live. Its settings are `ToolGraphSettings` in the one settings root
(`envfactory.config`: `Settings().toolgraph`, `ENVFACTORY_TOOLGRAPH__*` environment variables)."""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envfactory.config import Settings, ToolGraphSettings
    from envfactory.env.pool import EnvPool
    from envfactory.toolgraph.graph import ToolGraph

# the `ToolGraphSettings` a build reads that change the graph (the rest say how fast it embeds, or shape sampling);
# `use_llm` and `llm_role` count only where an LLM is configured (`graph_inputs`)
GRAPH_SHAPING = (
    "build_edge_threshold",
    "name_type_weight",
    "name_share",
    "cross_env_edges",
    "cross_env_top_k",
    "schema_edges",
    "lean_internal_threshold",
)
# the `ToolGraphSettings` that shape sampled chains, not the graph: a sampler takes them from its caller's settings,
# not from the ones the graph was built with (`sampling_for`), so a kept graph does not fix them
SAMPLING = (
    "skip_optional_p",
    "skip_satisfied_p",
    "max_servers",
    "max_depth",
    "turn_min",
    "turn_max",
    "attempts_per_chain",
)


def sampling_for(graph: ToolGraph, settings: ToolGraphSettings) -> ToolGraphSettings:
    """The settings a sampler of `graph` runs with: those the graph was built with, its sampling ones (`SAMPLING`)
    the caller's (`ENVFACTORY_TOOLGRAPH__MAX_SERVERS` set now counts, whenever the graph was built)."""
    return graph.settings.model_copy(update={key: getattr(settings, key) for key in SAMPLING})


# the prompt folders an LLM-made graph reads (classification, refinement, the structured answers' repair)
GRAPH_PROMPTS = ("toolgraph", "common")
# a pool's environments' tools as the builder sees them, digested once per pool and set of environments: a synth run
# names its graph twice (planning, then its record), and with a compiled corpus that is a minute of reading
_TOOLS: weakref.WeakKeyDictionary[EnvPool, dict[tuple[str, ...], str]] = weakref.WeakKeyDictionary()


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
    """What a graph of `envs` is built from, as canonical JSON: the set of environments, a digest of their tools as the
    builder sees them (`pool_sources`), the embedding model (and the files of a local one) in the precision its vectors
    have (`onnx-int8` moves edges), the settings that shape the graph (`GRAPH_SHAPING`) and, where the build asks an
    LLM, that model, where it is served, its retries and its prompts."""
    from envfactory.run_settings import model_identity

    names = tuple(sorted(set(envs)))
    tg = settings.toolgraph
    llm: dict[str, Any] | None = None
    if tg.use_llm and settings.llm_for(tg.llm_role).provider != "none":  # as `build_pool_graph` decides
        llm = {
            "role": tg.llm_role,
            "model": model_identity(settings, tg.llm_role).model_dump(),
            "base_url": settings.llm_for(tg.llm_role).base_url,
            "structured_retries": settings.structured_retries,
            "prompts": _files_digest([settings.prompts_path / folder for folder in GRAPH_PROMPTS], contents=True),
        }
    model = Path(str(settings.embedding_model)).expanduser()
    what = {
        "envs": list(names),
        "tools": _tools_digest(pool, names),
        "embedding_model": str(settings.embedding_model),
        "embedding_files": _files_digest([model], contents=False) if model.is_dir() else None,
        "precision": "int8" if tg.embed_backend == "onnx-int8" else "fp32",
        "settings": tg.model_dump(mode="json", include=set(GRAPH_SHAPING)),
        "llm": llm,
    }
    return json.dumps(what, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _tools_digest(pool: EnvPool, names: tuple[str, ...]) -> str:
    from envfactory.toolgraph.collect import pool_sources

    kept = _TOOLS.setdefault(pool, {})
    if names not in kept:
        digest = hashlib.sha256()
        for source in pool_sources(pool, names):
            digest.update(source.model_dump_json().encode("utf-8") + b"\0")
        kept[names] = digest.hexdigest()
    return kept[names]


def _files_digest(folders: list[Path], *, contents: bool) -> str:
    """The files under `folders`, by name and bytes (`contents`), else by name, size and time (a model's weights:
    large, and replaced whole when they change)."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
            if not path.is_file():
                continue
            digest.update(path.relative_to(folder).as_posix().encode("utf-8") + b"\0")
            if contents:
                digest.update(path.read_bytes() + b"\0")
            else:
                st = path.stat()
                digest.update(f"{st.st_size}:{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def cache_path(settings: Settings) -> Path:
    """The embedding cache of parameter texts (a folder holding one SQLite file)."""
    return settings.data_path / "toolgraph" / "embeddings"


def onnx_path(settings: Settings) -> Path:
    """Where embedding models exported to ONNX are kept, one folder per model files' hash."""
    return settings.data_path / "models" / "onnx"
