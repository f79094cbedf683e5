"""`configs/mcp_server.json`: the registry of verified environments, in the MCP clients' format.

Any MCP client that reads an `mcpServers` map (Claude Desktop, MCP Inspector, the EnvFactory
paper's code) can start a registered environment from its entry; the extra keys say what it is.
"""

from __future__ import annotations

import fcntl
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from envfactory.errors import EnvError
from envfactory.inputs import read_json_model, write_atomic

SERVER_ENV = frozenset({"ENVFACTORY_COMPILED_DIR", "ENVFACTORY_ENVS_DIR"})  # what a registry entry's `env` may set


class ServerEntry(BaseModel):
    model_config = ConfigDict(extra="allow")

    command: str = "envfactory"
    args: list[str]
    domain: str
    tools: int
    write_tools: int
    source: str
    scenarios: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = Field(
        default=None,
        description="variables the server needs, set by the MCP client that starts it: the folder of an environment "
        "outside the project's envs/ (ENVFACTORY_COMPILED_DIR, ENVFACTORY_ENVS_DIR; without it `envfactory serve "
        "NAME` finds no such environment)",
    )

    @field_validator("env")
    @classmethod
    def _only_folders(cls, env: dict[str, str] | None) -> dict[str, str] | None:
        """Only the folders an environment lives in: the entry's variables go into the MCP client configurations
        `envfactory mcp config` writes, where any other (a trust file, the sandbox switched off, a preloaded
        library) would change what the started server runs."""
        for key, value in (env or {}).items():
            if key not in SERVER_ENV:
                raise ValueError(f"env may set only {' and '.join(sorted(SERVER_ENV))}, not {key[:60]!r}")
            if not value.strip() or any(c in value for c in "\0\n\r"):
                raise ValueError(f"env {key} must be a folder's path on one line")
        return env


class Registry(BaseModel):
    model_config = ConfigDict(extra="allow")

    mcpServers: dict[str, ServerEntry] = Field(default_factory=dict)


class RegistryError(EnvError):
    pass


def load_registry(path: Path) -> Registry:
    if not path.exists():
        return Registry()
    return read_json_model(
        path, Registry, what="registry file", error=lambda m: RegistryError(f"{m}; fix or delete it")
    )


_THREAD_LOCK = threading.RLock()
_HELD = threading.local()  # how deep this thread is inside registry_lock


@contextmanager
def registry_lock(path: Path) -> Iterator[None]:
    """Exclusive access to the registry for a read-modify-write: across threads (an RLock, so a
    holder may re-enter) and across processes (flock on a lock file beside it; taken once per
    thread, since a second flock on another descriptor of the same file would wait for the first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _THREAD_LOCK:
        depth = getattr(_HELD, "depth", 0)
        _HELD.depth = depth + 1
        try:
            if depth:
                yield
                return
            with open(path.with_name(path.name + ".lock"), "a") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(fh, fcntl.LOCK_UN)
        finally:
            _HELD.depth = depth


def save_registry(path: Path, registry: Registry) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = Registry(mcpServers=dict(sorted(registry.mcpServers.items())))
    # atomic: a crash never leaves a half-written registry (callers hold registry_lock)
    data = ordered.model_dump(mode="json")
    for entry in data["mcpServers"].values():
        if entry.get("env") is None:
            entry.pop("env", None)  # (an in-pool environment's entry as it always was)
    write_atomic(path, json.dumps(data, indent=2) + "\n", error=RegistryError)
