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


@pytest.mark.parametrize(
    ("dsn", "says"),
    [
        ("postgresql://postgres@127.0.0.1:1/postgres", "Connection refused"),  # nothing listens there
        ("not a dsn", "missing"),  # psycopg: 'missing "=" after "not" in connection info string'
        ("postgresql://bob:s3cr%zzet@127.0.0.1:1/postgres", "percent"),  # psycopg quotes the password it cannot read
    ],
)
def test_a_checkpoint_database_that_cannot_be_used_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dsn: str, says: str
) -> None:
    """A bad DSN or a server that is not there: the saver and the CLI say so in one line (a 50-line psycopg
    traceback before), the Studio saver too."""
    import asyncio

    from envfactory.errors import EnvFactoryError
    from graphs.checkpoint import dev_checkpointer
    from tests.support.cli import run_cli

    setup_project(tmp_path, monkeypatch, {})
    monkeypatch.setenv("ENVFACTORY_POSTGRES_DSN", dsn)
    refused = pytest.raises(EnvFactoryError, match=f"ENVFACTORY_POSTGRES_DSN cannot be used: .*{says}")
    with refused, open_checkpointer(get_settings()):
        pass

    async def studio() -> None:
        async with dev_checkpointer():
            pass

    with pytest.raises(EnvFactoryError, match="ENVFACTORY_POSTGRES_DSN cannot be used"):
        asyncio.run(studio())
    run = run_cli(["envgen", "threads"])
    assert run.code == 1 and "Traceback" not in run.stderr + run.stdout, run
    lines = [line for line in (run.stderr + run.stdout).splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0] and "postgres@" not in lines[0], lines
    assert "s3cr" not in lines[0], lines  # never the password
