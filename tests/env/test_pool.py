"""The bundled pool as a whole: coverage, size, dependency chains, validation, registry in sync."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from envfactory.config import Settings
from envfactory.env import DOMAINS, Environment
from envfactory.env.metadata import ToolSpec
from envfactory.env.pool import EnvPool
from envfactory.env.registry import Registry
from envfactory.envgen.validate import sync_registry, validate_env
from tests.support.paths import ROOT


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _produced_ids(spec: ToolSpec) -> set[str]:
    """Id-like names a tool's output carries: `x_id` fields, and `id` of a record named X as `x_id`."""
    schema = spec.output_schema or {}
    out: set[str] = set()

    def walk(node: Any, record: str | None) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                for key in props:
                    if key.endswith("_id"):
                        out.add(key)
                    if key == "id" and record:
                        out.add(f"{record}_id")
            for value in node.values():
                walk(value, record)
        elif isinstance(node, list):
            for value in node:
                walk(value, record)

    for name, d in schema.get("$defs", {}).items():
        walk(d, _snake(name))
    walk({k: v for k, v in schema.items() if k != "$defs"}, None)
    return out


def _id_edges(tools: list[ToolSpec]) -> set[tuple[str, str, str]]:
    """(producer, consumer, parameter): a required `*_id` input of one tool produced by another."""
    edges = set()
    for consumer in tools:
        for param in consumer.required:
            if not param.endswith("_id"):
                continue
            for producer in tools:
                if producer.name != consumer.name and param in _produced_ids(producer):
                    edges.add((producer.name, consumer.name, param))
    return edges


def native(pool: EnvPool) -> list[Environment]:
    envs = [pool.get(n) for n in pool.native_names()]
    return [e for e in envs if isinstance(e, Environment)]


def test_pool_size_and_domains(pool: EnvPool) -> None:
    envs = native(pool)
    assert len(envs) >= 8
    assert {e.metadata.domain for e in envs} == set(DOMAINS)
    for e in envs:
        kinds = [t.kind for t in e.metadata.tools]
        assert len(kinds) >= 6, f"{e.name}: {len(kinds)} tools"
        assert kinds.count("write") >= 2, f"{e.name}: {kinds.count('write')} write tools"


def test_every_env_has_dependency_chains(pool: EnvPool) -> None:
    for e in native(pool):
        edges = _id_edges(e.metadata.tools)
        consumers = {c for _, c, _ in edges}
        writes = {t.name for t in e.metadata.tools if t.kind == "write"}
        assert len(consumers) >= 2, f"{e.name}: id chains {sorted(edges)}"
        assert consumers & writes, f"{e.name}: no write tool consumes a produced id"
        # a chain of length 3: A produces an id B needs, and B produces an id C needs
        produced_by_consumer = {(p, c) for p, c, _ in edges}
        assert any((b, c) in produced_by_consumer for (_, b) in produced_by_consumer for c in consumers), e.name


def test_every_env_validates_and_its_scenarios_load(pool: EnvPool) -> None:
    for name in pool.native_names():
        report = validate_env(pool, name)
        assert report.ok, report.problems
        assert "default" in report.scenarios and len(report.scenarios) >= 2


def test_committed_registry_is_in_sync(tmp_path: Path) -> None:
    """configs/mcp_server.json is what `envfactory envs validate` writes for the pool (BFCL included)."""
    settings = Settings(root=ROOT, registry_path=tmp_path / "mcp_server.json")
    pool = EnvPool(settings)
    sync_registry(pool, [validate_env(pool, n) for n in pool.names()])
    fresh = Registry.model_validate(json.loads((tmp_path / "mcp_server.json").read_text()))
    committed = Registry.model_validate(json.loads((ROOT / "configs" / "mcp_server.json").read_text()))
    assert fresh == committed, "run `envfactory envs validate` and commit configs/mcp_server.json"
