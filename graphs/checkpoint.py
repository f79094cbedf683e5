"""Checkpointers: a SQLite file by default, Postgres when `ENVFACTORY_POSTGRES_DSN` is set.

The CLI uses the sync savers, one per process shared by its threads (SQLite locks under concurrent
writers from several connections). `langgraph dev` gets its own persistent saver through
`langgraph.json`'s `checkpointer` key, which must be an async context manager (`dev_checkpointer`).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from urllib.parse import unquote

from langgraph.checkpoint.base import BaseCheckpointSaver

from envfactory.config import Settings, get_settings
from envfactory.errors import EnvFactoryError
from envfactory.executor import Shipped


def checkpoint_path(settings: Settings) -> Path:
    return settings.data_path / "checkpoints.sqlite"


@contextmanager
def open_checkpointer(settings: Settings | None = None) -> Iterator[BaseCheckpointSaver[str]]:
    """A sync saver for `graph.invoke`: Postgres if a DSN is set, else `<data>/checkpoints.sqlite`."""
    settings = settings or get_settings()
    if settings.postgres_dsn:
        try:
            import psycopg
            from langgraph.checkpoint.postgres import PostgresSaver
        except ImportError:
            raise EnvFactoryError(_PG_MISSING) from None
        with ExitStack() as stack:
            try:  # connected and set up here: a bad DSN or an unreachable server is one line, not a traceback
                pg = stack.enter_context(PostgresSaver.from_conn_string(settings.postgres_dsn))
                pg.setup()
            except psycopg.Error as e:
                raise EnvFactoryError(_pg_problem(e, settings.postgres_dsn)) from None
            yield pg
        return
    from langgraph.checkpoint.sqlite import SqliteSaver

    path = checkpoint_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not path.is_file():
        raise EnvFactoryError(f"{path}: not a file, where the checkpoint database goes: {_ASIDE}")
    conn = sqlite3.connect(str(path), check_same_thread=False)
    try:
        try:  # read (and set up) here, so a damaged or foreign file is one line, not a traceback at first use
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            columns = {row[1] for row in conn.execute("PRAGMA table_info(checkpoints)")}
            if tables and not {"thread_id", "checkpoint_ns", "checkpoint_id"} <= columns:
                shown = ", ".join(sorted(tables)[:5])
                raise EnvFactoryError(f"{path}: a SQLite database of something else (tables: {shown}): {_ASIDE}")
            saver = SqliteSaver(conn)
            saver.setup()
        except sqlite3.DatabaseError as e:
            raise EnvFactoryError(f"{path}: not a readable checkpoint database ({e}): {_ASIDE}") from None
        yield saver
    finally:
        conn.close()


_ASIDE = "move it aside (its threads cannot be resumed), or set ENVFACTORY_DATA_DIR to another folder"
_PG_MISSING = "ENVFACTORY_POSTGRES_DSN is set, and the Postgres saver is missing: pip install 'envfactory[postgres]'"


def _pg_problem(e: Exception, dsn: str) -> str:
    """One line on why the checkpoint database of ENVFACTORY_POSTGRES_DSN cannot be used, its password left out
    (psycopg quotes a part of the DSN it cannot read: a badly percent-encoded password, whole)."""
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
    for secret in _passwords(dsn):
        first = first.replace(secret, "***")
    return f"the checkpoint database of ENVFACTORY_POSTGRES_DSN cannot be used: {first}"


def _passwords(dsn: str) -> list[str]:
    """The password a DSN holds, as written and decoded (a URL's `user:password@`, a `password=` key), longest first."""
    found = re.findall(r"^[A-Za-z][\w+.-]*://[^/@?#]*?:([^/@?#]*)@", dsn) + re.findall(
        r"(?:^|[\s&?])password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&]+)", dsn
    )
    out = {v for raw in found if (v := raw.strip("'"))} | {unquote(v) for v in found if v}
    return sorted((v for v in out if v), key=len, reverse=True)


def process_checkpointer(runner: Shipped, settings: Settings) -> BaseCheckpointSaver[str]:
    """`runner`'s checkpointer in this process: the one it was given, else opened on first use and kept open
    for the process's life (a Ray worker's runner; the exit stack is kept with it, so the connection stays)."""

    def open_kept() -> BaseCheckpointSaver[str]:
        stack: ExitStack[bool | None] = runner.once("_checkpointer_stack", lambda: ExitStack())
        return stack.enter_context(open_checkpointer(settings))

    return runner.once("_checkpointer", open_kept)


@asynccontextmanager
async def dev_checkpointer() -> AsyncIterator[BaseCheckpointSaver[str]]:
    """For `langgraph dev` (langgraph.json): an async saver on a file outside the project folder.

    The dev server's reloader loops when SQLite files change inside the project, so the default
    path is under the user's cache unless `ENVFACTORY_DATA_DIR` says otherwise.
    """
    settings = get_settings()
    if settings.postgres_dsn:  # the CLI's database and tables: Studio lists the CLI's threads, and the CLI Studio's
        try:
            import psycopg
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        except ImportError:
            raise EnvFactoryError(_PG_MISSING) from None
        async with AsyncExitStack() as stack:
            try:
                pg = await stack.enter_async_context(AsyncPostgresSaver.from_conn_string(settings.postgres_dsn))
                await pg.setup()
            except psycopg.Error as e:
                raise EnvFactoryError(_pg_problem(e, settings.postgres_dsn)) from None
            yield pg
        return
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    base = settings.data_dir or Path.home() / ".cache" / "envfactory"
    base.mkdir(parents=True, exist_ok=True)
    async with AsyncSqliteSaver.from_conn_string(str(base / "studio-checkpoints.sqlite")) as saver:
        yield saver
