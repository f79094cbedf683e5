"""EnvGen checkpoints in a real Postgres server (an embedded one from `pgserver`), then resumed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from envfactory.config import get_settings
from graphs.checkpoint import open_checkpointer
from graphs.envgen import build
from tests.support.envgen import SCENARIOS, code, fenced, metadata_request, node_sequence, run_graph, setup_project

pgserver = pytest.importorskip("pgserver", reason="the `postgres` extra is not installed")


@pytest.fixture()
def postgres_dsn(tmp_path: Path) -> Iterator[str]:
    server = pgserver.get_server(tmp_path / "pg", cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


def test_envgen_checkpoints_in_postgres_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres_dsn: str
) -> None:
    root = setup_project(
        tmp_path,
        monkeypatch,
        {"code/generate": [fenced(code("bug"))], "test/scenarios": [SCENARIOS], "code/revise": [fenced(code("good"))]},
    )
    monkeypatch.setenv("ENVFACTORY_POSTGRES_DSN", postgres_dsn)
    values, ran = run_graph(metadata_request(), thread="pg-1", interrupt_before=["revise"])
    assert ran == ["search", "code", "test"] and not (root / ".envfactory" / "checkpoints.sqlite").exists()
    values, ran = run_graph(None, thread="pg-1")  # a new connection and saver: state comes from Postgres
    assert values["status"] == "registered"
    with open_checkpointer(get_settings()) as saver:
        graph = build(saver)
        assert node_sequence(graph, "pg-1") == ["search", "code", "test", "revise", "test", "register"]
