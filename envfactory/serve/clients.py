"""Configurations for outside MCP clients (Claude Desktop, Cursor, VS Code, the MCP Inspector): `envfactory mcp config`.

The registry (`configs/mcp_server.json`) names the bare command `envfactory`, which only resolves where the
project's virtualenv is on PATH; a client started from a desktop or another folder cannot launch it. The
configuration printed here is resolvable from anywhere: the command is this interpreter's absolute path
(`python -m envfactory.cli serve NAME --transport stdio`) and `ENVFACTORY_ROOT` pins the project folder, so the
server finds its pool whatever directory the client starts it in. For HTTP, a client gets the server's URL
(started separately with `envfactory serve NAME --transport http` or `envfactory hub serve --transport http`).
"""

from __future__ import annotations

import sys
from typing import Any, Literal
from urllib.parse import urlsplit

from envfactory.config import Settings
from envfactory.env.registry import load_registry
from envfactory.errors import ConfigError

Client = Literal["claude-desktop", "cursor", "vscode", "inspector", "generic"]
CLIENTS: tuple[str, ...] = ("claude-desktop", "cursor", "vscode", "inspector", "generic")
HUB = "envfactory-hub"


class ClientConfigError(ConfigError):
    """The configuration cannot be made (an unknown client or environment, HTTP asked where a client has none)."""


def _stdio(args: list[str], settings: Settings, variables: dict[str, str] | None = None) -> dict[str, Any]:
    """A stdio entry: this interpreter running `envfactory ARGS` on this project and the pool this process sees (its
    pool and compiled folders where set), with the variables an environment's registry entry names over them."""
    pool = {"ENVFACTORY_ROOT": str(settings.root.resolve())}
    if settings.envs_dir is not None:
        pool["ENVFACTORY_ENVS_DIR"] = str(settings.envs_dir.expanduser().resolve())
    if settings.compiled_dir is not None:
        pool["ENVFACTORY_COMPILED_DIR"] = str(settings.compiled_dir.expanduser().resolve())
    return {"command": sys.executable, "args": ["-m", "envfactory.cli", *args], "env": {**pool, **(variables or {})}}


def _check_url(url: str, names: list[str] | None, hub: bool) -> None:
    """A URL is one running server: an http(s) address, for at most one environment or the hub."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ClientConfigError(
            f"--url {url!r}: give the running server's http(s) address, e.g. http://127.0.0.1:8765/mcp"
        )
    if (len(names or []) > 1) or (names and hub):
        raise ClientConfigError("--url is one running server: name at most one environment, or --hub, with it")


def client_config(
    settings: Settings,
    client: str = "generic",
    names: list[str] | None = None,
    *,
    hub: bool = False,
    url: str | None = None,
) -> dict[str, Any]:
    """A ready configuration: the registered environments (or `names`), optionally the hub, in `client`'s format;
    with `url`, one HTTP entry instead (a server already running there)."""
    client = client.lower()  # "Cursor" is cursor
    if client not in CLIENTS:
        raise ClientConfigError(f"unknown client '{client}'; clients: {', '.join(CLIENTS)}")
    if url is not None:
        _check_url(url, names, hub)
    registered = load_registry(settings.registry_file).mcpServers
    chosen = names if names else sorted(registered)
    if not chosen and not hub and url is None:
        raise ClientConfigError(
            f"no environment is registered in {settings.registry_file}: `envfactory envs validate` registers the "
            "pool's (or give --hub)"
        )
    unknown = [n for n in chosen if n not in registered]
    if unknown:
        known = ", ".join(sorted(registered))
        where = settings.registry_file
        raise ClientConfigError(f"not in the registry ({where}): {', '.join(unknown)}; registered: {known}")
    servers: dict[str, dict[str, Any]] = {}
    if url is not None:
        if client == "claude-desktop":
            raise ClientConfigError("Claude Desktop starts local servers over stdio only: drop --url")
        key = names[0] if names else HUB if hub else "envfactory"
        servers[key] = {"type": "http", "url": url} if client == "vscode" else {"url": url}
    else:
        for name in chosen:
            servers[name] = _stdio(["serve", name, "--transport", "stdio"], settings, registered[name].env)
        if hub:  # the hub serves the pool this process sees
            servers[HUB] = _stdio(["hub", "serve", "--transport", "stdio"], settings)
        if client == "vscode":
            servers = {k: {"type": "stdio", **v} for k, v in servers.items()}
    return {"servers": servers} if client == "vscode" else {"mcpServers": servers}
