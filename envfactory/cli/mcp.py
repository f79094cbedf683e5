"""`envfactory mcp config`: a configuration any MCP client can use from anywhere (envfactory/serve/clients.py);
`envfactory mcp haproxy`: several server processes behind one port, sessions sticky (envfactory/serve/affinity.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from envfactory.cli.args import env_names, out_file_or_stdout_option, path_to_write, refuse_overwriting_input
from envfactory.config import get_settings
from envfactory.inputs import write_atomic
from envfactory.serve.affinity import AffinityError, BalancerSettings, haproxy_config
from envfactory.serve.clients import CLIENTS, client_config
from envfactory.terminal import visible

app = typer.Typer(no_args_is_help=True, help="Configurations for outside MCP clients.")


@app.command("config")
def config(
    name: Annotated[list[str] | None, typer.Argument(help="registered environments (default: every one)")] = None,
    client: Annotated[str, typer.Option(help=f"the client's format: {', '.join(CLIENTS)}")] = "generic",
    hub: Annotated[bool, typer.Option(help="add the meta-tool hub (the whole pool behind list_apps/...)")] = False,
    url: Annotated[str | None, typer.Option(help="a running HTTP server's URL (…/mcp) instead of stdio")] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="write it to this file instead of printing it ('-': print it)",
            parser=path_to_write,
            callback=out_file_or_stdout_option,
        ),
    ] = None,
) -> None:
    """Print (or write) a ready MCP client configuration: absolute interpreter, ENVFACTORY_ROOT set."""
    names = env_names(name) or None
    settings = get_settings()
    refuse_overwriting_input(out, "--out", settings.registry_file)  # the registry is what the config is made from
    text = json.dumps(client_config(settings, client, names, hub=hub, url=url), indent=2) + "\n"
    if out is None or str(out) == "-":
        typer.echo(text, nl=False)
    else:
        write_atomic(out, text)
        typer.echo(visible(f"wrote {out}"), err=True)


@app.command("haproxy")
def haproxy(
    backend: Annotated[list[str], typer.Option("--backend", help="host:port of a server process (repeat)")],
    bind: Annotated[str, typer.Option(help="host:port the balancer listens on")] = "127.0.0.1:8765",
    idle_s: Annotated[int, typer.Option(help="forget a session's server after this many seconds unused")] = 1800,
    stats_socket: Annotated[str | None, typer.Option(help="a Unix socket for HAProxy's runtime API")] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="write it to this file instead of printing it ('-': print it)",
            parser=path_to_write,
            callback=out_file_or_stdout_option,
        ),
    ] = None,
) -> None:
    """Print (or write) an HAProxy configuration: several `serve --transport http` processes behind one port,
    each MCP session sticky to the process that opened it."""
    try:
        settings = BalancerSettings(backends=backend, bind=bind, idle_s=idle_s, stats_socket=stats_socket)
    except ValidationError as e:
        raise AffinityError(f"bad balancer settings: {e.errors()[0]['msg']}") from None
    text = haproxy_config(settings)
    if out is None or str(out) == "-":
        typer.echo(visible(text), nl=False)
    else:
        write_atomic(out, text)
        typer.echo(visible(f"wrote {out}"), err=True)
