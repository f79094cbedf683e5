"""Shared fixtures: the real bundled pool and its tool graph (real MiniLM embeddings), built once per test run (once
for all pytest-xdist workers), and llama.cpp's OpenAI-compatible server on SmolLM2, started once per test run by
the first test that asks for it."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator

import pytest
from filelock import FileLock

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.llm.embeddings import EmbeddingCache
from envfactory.toolgraph import ToolGraph, ToolGraphSettings, ToolSource, build_tool_graph, pool_sources
from envfactory.toolgraph.build import BuildReport
from tests.support.embeddings import packaged_embedder
from tests.support.paths import ROOT

pytest_plugins = ["tests.support.slow_first"]


@pytest.fixture(scope="session")
def pool() -> EnvPool:
    return EnvPool(Settings(root=ROOT))


@pytest.fixture(scope="session")
def sources(pool: EnvPool) -> list[ToolSource]:
    return pool_sources(pool)


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> EmbeddingCache:
    """The embedding cache of the shared tool graph, over the suite's embedder (`packaged_embedder`: ONNX)."""
    return EmbeddingCache(tmp_path_factory.mktemp("tg-embeddings"), packaged_embedder())


@pytest.fixture(scope="session")
def built(
    sources: list[ToolSource], cache: EmbeddingCache, tmp_path_factory: pytest.TempPathFactory
) -> tuple[ToolGraph, BuildReport]:
    """Built once per run: under pytest-xdist the first worker builds it and the others read its pickle."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return build_tool_graph(sources, cache, ToolGraphSettings())
    shared = tmp_path_factory.getbasetemp().parent / "pool-tool-graph.pickle"
    with FileLock(f"{shared}.lock"):
        if shared.is_file():
            out: tuple[ToolGraph, BuildReport] = pickle.loads(shared.read_bytes())
            return out
        out = build_tool_graph(sources, cache, ToolGraphSettings())
        shared.write_bytes(pickle.dumps(out))
        return out


@pytest.fixture(scope="session")
def graph(built: tuple[ToolGraph, BuildReport]) -> ToolGraph:
    return built[0]


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """llama.cpp's server on SmolLM2-135M-Instruct: (base URL, model id); skips where it is not installed."""
    from tests.support.llama_server import llama_server as start

    with start(tmp_path_factory.mktemp("llama")) as running:
        yield running
