"""Where the tool graph's files live. Its settings are `ToolGraphSettings` in the one settings root
(`envfactory.config`: `Settings().toolgraph`, `ENVFACTORY_TOOLGRAPH__*` environment variables)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envfactory.config import Settings


def graph_path(settings: Settings) -> Path:
    """Where `envfactory graph build` writes and the other commands read by default."""
    return settings.data_path / "toolgraph" / "graph.json"


def envs_graph_path(settings: Settings, envs: Iterable[str]) -> Path:
    """Where a synth run keeps the graph of its environments alone when the data dir has no `graph_path` graph:
    one file per set of environments (`graph-<digest of their sorted names>.json`)."""
    digest = hashlib.sha256("\n".join(sorted(set(envs))).encode("utf-8")).hexdigest()[:12]
    return settings.data_path / "toolgraph" / f"graph-{digest}.json"


def cache_path(settings: Settings) -> Path:
    """The embedding cache of parameter texts (a folder holding one SQLite file)."""
    return settings.data_path / "toolgraph" / "embeddings"


def onnx_path(settings: Settings) -> Path:
    """Where embedding models exported to ONNX are kept, one folder per model files' hash."""
    return settings.data_path / "models" / "onnx"
