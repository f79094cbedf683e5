"""The `envfactory` command (typer + rich). Errors print one line and exit non-zero.

What it prints that it did not write (names, messages, metadata, tool output) goes through
`envfactory.terminal`: markup escaped, control characters made visible."""

from __future__ import annotations

import hashlib
import json
import sys
import traceback
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from envfactory.cli.args import env_name, env_names, out_dir_option, path_to_write
from envfactory.cli.corpus import app as corpus_app
from envfactory.cli.mcp import app as mcp_app
from envfactory.cli.prompts import app as prompts_app
from envfactory.config import get_settings
from envfactory.env.metadata import dump_metadata
from envfactory.env.pool import EnvPool, derived_metadata
from envfactory.envgen.validate import missing_registered, sync_registry, validate_env
from envfactory.errors import EnvFactoryError
from envfactory.inputs import parse_json, write_atomic
from envfactory.terminal import SafeConsole, Table, print_json, safe, shorten, visible

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, help=__doc__)
envs_app = typer.Typer(no_args_is_help=True, help="The environment pool.")
app.add_typer(envs_app, name="envs")
hub_app = typer.Typer(no_args_is_help=True, help="The meta-tool hub: the whole pool behind list_apps/list_tools/...")
app.add_typer(hub_app, name="hub")
app.add_typer(prompts_app, name="prompts")
app.add_typer(mcp_app, name="mcp")
app.add_typer(corpus_app, name="corpus")

out = SafeConsole()
err = SafeConsole(stderr=True)


class Transport(StrEnum):
    stdio = "stdio"
    http = "http"


def _pool() -> EnvPool:
    return EnvPool(get_settings())


def _pool_names(pool: EnvPool, include_imported: bool = True) -> list[str]:
    """The pool's environments; an empty pool is a mistake (a wrong ENVFACTORY_ENVS_DIR), not an empty table."""
    names = pool.names(include_imported=include_imported)
    if not names:
        where = pool.settings.envs_path
        raise EnvFactoryError(
            f"no environments in {shorten(str(where))}{'' if include_imported else ' (native)'}: "
            "point ENVFACTORY_ENVS_DIR at a folder of environment folders, or run from the project folder"
        )
    return names


def config_option(value: str | None) -> str | Path | None:
    """A `--scenario` value: a JSON file when it looks like one (read here, by the local user), else a name."""
    if value is None:
        return None
    if value.endswith(".json") or "/" in value:
        return Path(value)
    try:
        is_file = Path(value).is_file()
    except OSError:  # a name too long for a path (ENAMETOOLONG): a name, which the environment looks up
        is_file = False
    return Path(value) if is_file else value


@envs_app.command("list")
def envs_list(
    native_only: Annotated[bool, typer.Option("--native", help="only the bundled folders under envs/")] = False,
) -> None:
    """List the environments: domain, tools (write tools), scenarios, source, how each runs.

    Read from each folder's metadata.json and scenario files: nothing is built, no code runs (an
    environment whose code or plan does not load is found by `envs validate`)."""
    pool = _pool()
    table = Table("name", "domain", "tools", "write", "scenarios", "source", "runs")
    for name in _pool_names(pool, include_imported=not native_only):
        try:
            e = pool.entry(name)
        except EnvFactoryError as exc:
            table.add_row(safe(name), "[red]broken[/red]", "", "", "", safe(str(exc)[:60]), "")
            continue
        scenarios = ", ".join(e.scenarios)
        cells = (name, e.domain, str(e.tools), str(e.write_tools), scenarios, e.source, e.runs)
        table.add_row(*map(safe, cells))
    out.print(table)
    for name, hidden in pool.shadowed().items():  # the pool folder's comes first: the other is never loaded
        out.print(f"note: {safe(name)} in {safe(str(hidden.parent))} is hidden by {safe(str(pool.folder / name))}")
    if not native_only:
        for name, folder in pool.hidden_imported().items():
            out.print(f"note: the imported suite's {safe(name)} is hidden by {safe(str(folder))}", highlight=False)


class HubFormatOption(StrEnum):
    openenv = "openenv"
    verifiers = "verifiers"


@envs_app.command("export")
def envs_export(
    names: Annotated[list[str] | None, typer.Argument(help="environments (default: those the tasks use)")] = None,
    fmt: Annotated[HubFormatOption, typer.Option("--format", help="openenv | verifiers")] = HubFormatOption.openenv,
    out_dir: Annotated[
        Path, typer.Option("--out", help="the package folder to write", parser=path_to_write, callback=out_dir_option)
    ] = Path("export"),
    tasks: Annotated[
        Path | None, typer.Option("--tasks", help="a synth run folder (or conversations JSONL): its turns become tasks")
    ] = None,
    all_envs: Annotated[bool, typer.Option("--all", help="every environment folder of the pool")] = False,
    name: Annotated[
        str | None, typer.Option(help="package name (default: the environment's, or envfactory_pool)")
    ] = None,
) -> None:
    """Write an OpenEnv or verifiers package: the environments, the tasks, the composite reward as its reward."""
    from envfactory.export.files import training_conversations
    from envfactory.export.rl import convert_to_rl_data
    from envfactory.export.tools_schema import catalog_for
    from envfactory.hubs.export import HubExportError, export_package

    if all_envs and names:
        raise HubExportError("give environment names or --all, not both")
    pool = _pool()
    records = []
    if tasks is not None:
        conversations = training_conversations(tasks)
        if not conversations:
            raise HubExportError(f"--tasks {tasks}: no conversation in it: nothing to make tasks of")
        catalog = catalog_for(pool, conversations)
        records = [r for c in conversations for r in convert_to_rl_data(c, catalog)]
    chosen = env_names(names)
    if all_envs:
        chosen = pool.native_names()
    elif not chosen:
        chosen = list(dict.fromkeys(s for r in records for s in r.servers()))
    if not chosen:
        raise HubExportError("name the environments, or give --tasks or --all")
    manifest = export_package(pool, chosen, records, fmt.value, out_dir, name)
    err.print(
        f"{safe(manifest.format)}: {safe(manifest.module)} with {len(manifest.environments)} environment(s)"
        f" and {manifest.tasks} task(s) in {safe(out_dir)}",
        highlight=False,
    )
    if tasks is None:  # the environments only: an episode starts from a task, so nothing can run one yet
        err.print("note: no --tasks, so the package holds no tasks; give a synth run to make episodes", soft_wrap=True)


@envs_app.command("validate")
def envs_validate(
    name: Annotated[str | None, typer.Argument(help="one environment; all when omitted")] = None,
    health: Annotated[bool, typer.Option(help="also require health (see `envs health`)")] = True,
) -> None:
    """Validate environments against the contract and their health; update configs/mcp_server.json."""
    from envfactory.envgen.health import HealthSettings, gate

    pool = _pool()
    names = [env_name(name)] if name is not None else pool.names()
    if name is not None and name not in pool.names():
        raise EnvFactoryError(f"no environment '{name}'; see `envfactory envs list`")
    reports = [validate_env(pool, n) for n in names]
    if health:
        settings = HealthSettings(calls=pool.settings.health_calls)
        with err.status("") as status:
            for i, r in enumerate(reports):
                status.update(f"health {i + 1}/{len(reports)}: {safe(r.name)}")
                gate(pool, r, settings)
    if name is None:
        reports += missing_registered(pool, names)
        if not reports:  # no folder and nothing registered: a wrong ENVFACTORY_ENVS_DIR, not an empty registry
            _pool_names(pool)
    sync_registry(pool, reports)
    table = Table("name", "verdict", "domain", "tools", "write", "scenarios", "runs")
    for r in reports:
        verdict = "[green]ok[/green]" if r.ok else f"[red]failed ({len(r.problems)})[/red]"
        row = (r.domain or "", str(r.tools), str(r.write_tools), str(len(r.scenarios)), r.runs or "")
        table.add_row(safe(r.name), verdict, *map(safe, row))
    out.print(table)
    for r in reports:
        for problem in r.problems:  # full lines, not table cells: paths and messages stay greppable
            out.print(f"[red]{safe(r.name)}[/red]: {safe(problem)}", highlight=False, soft_wrap=True)
        for warning in r.warnings:
            out.print(f"[yellow]{safe(r.name)}[/yellow] (warning): {safe(warning)}", highlight=False, soft_wrap=True)
    failed = [r.name for r in reports if not r.ok]
    out.print(f"registry: {safe(pool.settings.registry_file)}", highlight=False)
    if failed:
        raise EnvFactoryError(f"{len(failed)} of {len(reports)} environments failed validation: {', '.join(failed)}")


@envs_app.command("health")
def envs_health(
    name: Annotated[str | None, typer.Argument(help="one environment; the whole pool when omitted")] = None,
    calls: Annotated[int, typer.Option(min=1, max=100_000, help="agent-like calls per scenario")] = 60,
    seed: Annotated[int, typer.Option(help="seed of the call sequences")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="the reports as JSON, one list")] = False,
) -> None:
    """Check the environment contract by running it: round trips, determinism, read-only reads, robustness
    under malformed calls, reachable writes, schema. Exits non-zero if any environment is unhealthy."""
    from envfactory.envgen.health import DIMENSIONS, HealthSettings, health_of

    pool = _pool()
    names = _pool_names(pool)
    if name is not None:
        if env_name(name) not in names:
            raise EnvFactoryError(f"no environment '{name}'; see `envfactory envs list`")
        names = [name]
    settings = HealthSettings(calls=calls, seed=seed)
    reports = []
    with err.status("") as status:
        for i, n in enumerate(names):
            status.update(f"health {i + 1}/{len(names)}: {safe(n)}")
            reports.append(health_of(pool, n, settings))
    if as_json:
        sys.stdout.write(json.dumps([r.model_dump(mode="json") for r in reports], indent=2) + "\n")
    else:
        table = Table("name", "verdict", *DIMENSIONS, "s")
        for r in reports:
            cells = {
                d.name: ("[green]ok[/green]" if d.ok else "[red]FAIL[/red]") + f" {d.checked}" for d in r.dimensions
            }
            verdict = "[green]healthy[/green]" if r.healthy else "[red]unhealthy[/red]"
            table.add_row(safe(r.name), verdict, *(cells.get(d, "-") for d in DIMENSIONS), f"{r.seconds:.1f}")
        out.print(table)
        for r in reports:
            if not r.healthy:
                out.print(f"[red]{safe(r.summary())}[/red]", highlight=False, soft_wrap=True)
    bad = [r.name for r in reports if not r.healthy]
    if bad:
        raise EnvFactoryError(f"{len(bad)} of {len(reports)} environments are unhealthy: {', '.join(bad)}")


@envs_app.command("trust")
def envs_trust(
    name: str,
    revoke: Annotated[bool, typer.Option("--revoke", help="forget the trust: the code runs sandboxed again")] = False,
    note: Annotated[str, typer.Option(help="who reviewed it, and why it is trusted")] = "",
    show: Annotated[
        bool, typer.Option("--show", help="print the files trust covers and their hash; trust nothing")
    ] = False,
    expect: Annotated[
        str | None,
        typer.Option(help="the hash --show printed for the files you reviewed: refused if they changed since"),
    ] = None,
) -> None:
    """After reviewing envs/NAME, let its code run in-process (unsandboxed); any later change to a file undoes it.

    Review with `--show` first and trust with `--expect HASH`: what is trusted is then what was reviewed."""
    from envfactory.env import trust as trust_store

    chosen = [o for o, v in (("--show", show), ("--revoke", revoke)) if v]
    with_trust = [o for o, v in (("--expect", expect is not None), ("--note", bool(note))) if v]
    if len(chosen) > 1 or (chosen and with_trust):
        raise EnvFactoryError(
            f"{' and '.join(chosen + with_trust)} do not go together: --show prints, --revoke forgets, "
            "and trusting takes --expect and --note"
        )
    settings = get_settings()
    folder = settings.envs_path / env_name(name)
    if not (folder / "env.py").is_file():
        raise EnvFactoryError(f"no environment folder '{name}' in {settings.envs_path}")
    if show:
        snap = trust_store.snapshot(folder)
        table = Table("file", "bytes", "sha256")
        for rel, data in sorted(snap.files.items()):
            table.add_row(safe(rel), f"{len(data):,}", hashlib.sha256(data).hexdigest()[:16])
        out.print(table)
        out.print(f"{name}: sha256 {snap.sha256} (trust it with --expect {snap.sha256[:16]})", soft_wrap=True)
        return
    if revoke:
        was = trust_store.revoke(settings.trust_file, name)
        out.print(
            f"{name}: {'no longer trusted' if was else 'was not trusted'}; its code runs sandboxed", soft_wrap=True
        )
        return
    entry = trust_store.trust(settings.trust_file, name, folder, note, expect=expect)
    out.print(
        f"{name}: trusted (sha256 {entry.sha256[:16]}…) in {safe(settings.trust_file)}; it now runs in-process",
        soft_wrap=True,
    )


@envs_app.command("metadata")
def envs_metadata(
    name: str,
    write: Annotated[bool, typer.Option("--write", help="write envs/NAME/metadata.json from the code")] = False,
) -> None:
    """Print the metadata the code defines (signatures and docstrings), or write it to metadata.json. A compiled
    environment's is derived from its compiled.json: printed, never written."""
    pool = _pool()
    folder = pool.folder / env_name(name)
    if not (folder / "env.py").is_file() and pool.compiled(name):
        if write:
            raise EnvFactoryError(f"'{name}' is compiled: its metadata comes from its compiled.json, nothing to write")
        print_json(out, pool.get(name).metadata.model_dump_json(exclude_none=True))
        return
    if not (folder / "env.py").is_file():
        raise EnvFactoryError(f"no environment folder '{name}' in {pool.folder}")
    meta = derived_metadata(folder, pool.settings)
    if write:
        dump_metadata(meta, folder / "metadata.json")
        out.print(f"wrote {safe(folder / 'metadata.json')} ({len(meta.tools)} tools)", highlight=False)
    else:
        print_json(out, meta.model_dump_json(exclude_none=True))


@app.command("serve")
def serve(
    name: str,
    transport: Annotated[Transport, typer.Option(help="stdio: one client; http: streamable HTTP, many sessions")] = (
        Transport.stdio
    ),
    host: Annotated[str | None, typer.Option(help="HTTP bind address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="HTTP port (or ENVFACTORY_HTTP_PORT)")] = None,
    scenario: Annotated[str | None, typer.Option(help="default initial config: a scenario name or a JSON file")] = None,
    fast_calls: Annotated[
        bool, typer.Option(help="HTTP: answer tool calls of open sessions without the SDK's message loop")
    ] = True,
    uds: Annotated[
        Path | None,
        typer.Option(help="HTTP on this Unix socket instead of a TCP port (a trainer on the same machine; owner only)"),
    ] = None,
) -> None:
    """Serve an environment as an MCP server (each MCP session gets its own isolated state)."""
    from envfactory.serve.mcp_server import EnvMCPServer

    settings = get_settings()
    _http_options(transport, ("--host", host), ("--port", port), ("--no-fast-calls", not fast_calls), ("--uds", uds))
    env = EnvPool(settings).get(env_name(name))
    default_config = config_option(scenario) or env.default_scenario()
    if scenario is not None:  # a scenario that does not fit the state: one line now, not an error on every call
        env.session(default_config).close()
    server = EnvMCPServer(
        env,
        default_config=default_config,
        host=host or settings.http_host,
        port=port or settings.http_port,
        fast_calls=fast_calls,
    )
    if transport is Transport.http:
        _run_http(server, name, uds)
    else:
        server.run(transport="stdio")


def _http_options(transport: Transport, *given: tuple[str, Any]) -> None:
    """Refuse HTTP options (name, value: given when truthy) with stdio, and --uds beside --host or --port."""
    named = [name for name, value in given if value]
    if transport is Transport.stdio and named:
        raise EnvFactoryError(f"{', '.join(named)}: HTTP options; add --transport http, or leave them out for stdio")
    if "--uds" in named and ("--host" in named or "--port" in named):
        raise EnvFactoryError("--uds serves on a Unix socket: leave out --host and --port")


def _run_http(server: Any, what: str, uds: Path | None) -> None:
    """Serve `server` over streamable HTTP on its host and port, or on the Unix socket `uds`; a taken port or
    socket path is one line, before "serving"."""
    from envfactory.serve.net import check_bindable, check_unix_socket

    if uds is not None:
        server.serve_on_unix_socket(check_unix_socket(uds))
        address = f"the Unix socket {safe(str(server.uds))} (http://localhost/mcp)"
    else:
        check_bindable(server.settings.host, server.settings.port)
        address = f"http://{safe(server.settings.host)}:{server.settings.port}/mcp"
    err.print(f"serving {what} on {address}", highlight=False)
    server.run(transport="streamable-http")


@hub_app.command("serve")
def hub_serve(
    tasks: Annotated[Path | None, typer.Option(help="JSONL of conversations (e.g. a synth run's) or tasks")] = None,
    transport: Annotated[Transport, typer.Option(help="stdio: one client; http: streamable HTTP")] = Transport.stdio,
    host: Annotated[str | None, typer.Option(help="HTTP bind address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="HTTP port (or ENVFACTORY_HTTP_PORT)")] = None,
    task: Annotated[str | None, typer.Option(help="the task every session starts with (stdio)")] = None,
    app_name: Annotated[list[str] | None, typer.Option("--app", help="serve only these apps (repeatable)")] = None,
    uds: Annotated[
        Path | None,
        typer.Option(help="HTTP on this Unix socket instead of a TCP port (a trainer on the same machine; owner only)"),
    ] = None,
    control_tools: Annotated[
        bool | None,
        typer.Option(
            "--control-tools/--no-control-tools",
            help="list envfactory_load_task and envfactory_state, for a trainer (default: only without --tasks)",
        ),
    ] = None,
) -> None:
    """Serve the pool through SynthAPI's meta-tools; a session picks its task with ?task=ID (or the header).

    With --tasks the agent gets the meta-tools only (the control tools would let it restart a task it failed);
    without, a trainer loads each session's task with envfactory_load_task, a whole Task or an id."""
    from envfactory.serve.hub_server import build_hub_server

    _http_options(transport, ("--host", host), ("--port", port), ("--uds", uds))
    settings = get_settings()
    apps = env_names(app_name) if app_name is not None else None
    bind_host, bind_port = host or settings.http_host, port or settings.http_port
    server = build_hub_server(  # tasks and apps checked here: an error comes before "serving ..."
        EnvPool(settings),
        tasks,
        apps=apps,
        default_task=task,
        host=bind_host,
        port=bind_port,
        control_tools=control_tools,  # None: only a hub without --tasks (a trainer's) lists them
    )
    if transport is Transport.http:
        _run_http(server, "the hub", uds)
    else:
        server.run(transport="stdio")


@app.command("call")
def call(
    name: str,
    tool: str,
    args: Annotated[str, typer.Option("--args", help="tool arguments as a JSON object")] = "{}",
    state: Annotated[
        Path | None, typer.Option(help="state file: read before the call (if it exists), written after")
    ] = None,
    scenario: Annotated[str | None, typer.Option(help="initial config when there is no state file")] = None,
) -> None:
    """Call one tool on a fresh session; with --state, chain calls across invocations through a file."""
    arguments: Any = parse_json(args, "--args")
    if not isinstance(arguments, dict):
        raise EnvFactoryError('--args must be a JSON object, e.g. \'{"city": "Lisbon"}\'')
    if state is not None and not state.parent.is_dir():  # before the call: its result must not be lost
        raise EnvFactoryError(f"--state {state}: the folder {state.parent} does not exist")
    if state is not None and state.exists() and not state.is_file():
        raise EnvFactoryError(f"--state {state}: not a regular file (give the file the state is kept in)")
    env = _pool().get(env_name(name))
    config: Any = config_option(scenario) or env.default_scenario()
    if isinstance(config, Path) and not config.is_file() and not (state is not None and state.is_file()):
        what = "not a regular file" if config.exists() else "no such file"
        raise EnvFactoryError(f"--scenario {scenario}: {what} (give a scenario's name or a JSON state file)")
    if state is not None and (state.exists() or state.is_symlink()):
        config = state
    session = env.session(config)
    rec = session.call(tool, arguments)
    if state is not None and rec.ok:
        write_atomic(state, json.dumps(session.dump(), indent=2) + "\n")
    print_json(out, rec.payload(), is_text=False)
    if not rec.ok:
        raise typer.Exit(1)


@app.command("demo")
def demo() -> None:
    """Run the main job offline on the bundled pool (what `make demo` runs)."""
    from envfactory.cli.demo import run_demo

    reports = run_demo(get_settings(), out)
    failed = [r.name for r in reports if not r.ok]
    if failed:
        raise EnvFactoryError(f"demo: {len(failed)} environments failed validation: {', '.join(failed)}")


def _add_plugins(argv: list[str]) -> None:
    """Sub-apps registered by other packages (`envgen` from graphs/) under the `envfactory.cli` entry
    point group. Loaded only when named on the command line (or for help): importing LangGraph
    would slow every other command, `serve` included."""
    from importlib.metadata import entry_points

    wanted = argv[1] if len(argv) > 1 else "--help"
    registered = {group.name for group in app.registered_groups} | {c.name for c in app.registered_commands}
    for ep in entry_points(group="envfactory.cli"):
        if wanted not in (ep.name, "--help") or ep.name in registered:  # main() called again in one process
            continue
        try:
            _add_plugin(ep.name, ep.load())
        except ModuleNotFoundError as e:
            if wanted == "--help":
                continue  # listed only when it can run
            hint = "pip install 'envfactory[graphs]'" if (e.name or "").startswith("langgraph") else f"install {e.name}"
            raise EnvFactoryError(f"`envfactory {ep.name}` needs {e.name}, which is not installed: {hint}") from None


def _add_plugin(name: str, sub: typer.Typer) -> None:
    """A plugin's app as a group of commands, or — an app that is one command (`synth`, `eval`, `export`: a
    callback run without a subcommand) — as that command, so that its usage line and its errors do not speak of
    subcommands it has not got (`envfactory synth foo` was "Missing option '--config'")."""
    one = sub.registered_callback
    if not sub.registered_commands and not sub.registered_groups and one is not None and one.invoke_without_command:
        assert one.callback is not None
        app.command(name, help=one.help or sub.info.help)(one.callback)
    else:
        app.add_typer(sub, name=name)


# click's own error class (typer vendors click from 0.2x on, older typer uses click itself): found through a public
# subclass, so either works
_CLICK_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


_INTERRUPTED = 130  # 128 + SIGINT, the shell's code for a command stopped by Ctrl-C


def _interrupted(argv: list[str]) -> str:
    """What Ctrl-C leaves, said for the command it stopped: a server is stopped; a batch resumes."""
    words = [a for a in argv if not a.startswith("-")][:2]
    if words[:1] == ["serve"] or words == ["hub", "serve"]:
        return "stopped: the server is down and its sessions' states are gone"
    if words[:1] in (["synth"], ["eval"]) or words == ["corpus", "compile"]:
        return "interrupted: what was written is kept; run the same command again to continue where it stopped"
    return "interrupted"


def main() -> None:
    """Entry point: every error is one line — ours exit 1, usage errors (unknown option, bad value) exit 2."""
    try:
        _add_plugins(sys.argv)
        code = app(standalone_mode=False)  # click raises usage errors to us instead of printing a panel
    except KeyboardInterrupt:  # Ctrl-C before typer runs the command (a plugin's imports take seconds)
        code = _INTERRUPTED
    except EnvFactoryError as e:
        err.print(f"[red]error:[/red] {safe(e)}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except typer.Abort:
        err.print("aborted", highlight=False)
        sys.exit(1)
    except _CLICK_ERROR as e:
        exit_code = int(getattr(e, "exit_code", 2))
        if type(e).__name__ == "NoArgsIsHelpError":  # a bare group: its help, as click shows it
            err.print(safe(e.format_message()), highlight=False, soft_wrap=True)  # type: ignore[attr-defined]
            sys.exit(exit_code)
        ctx = getattr(e, "ctx", None)
        where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        message = " ".join(e.format_message().split())  # type: ignore[attr-defined]  # click lists choices a line each
        message = message.replace(": Value error, ", ": ")  # (pydantic's prefix, where typer validates with it)
        err.print(f"[red]error:[/red] {safe(message)}{safe(where)}", highlight=False, soft_wrap=True)
        sys.exit(exit_code)
    except OSError as e:  # the machine refused a file operation (a data folder under /proc, a full disk): one line
        where = f"{shorten(str(e.filename))}: " if e.filename else ""
        err.print(f"[red]error:[/red] {safe(where)}{safe(e.strerror or e)}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except Exception:  # a bug: its traceback, as Python prints it, but with the message's control characters visible
        sys.stderr.write(visible(traceback.format_exc()))
        sys.exit(1)
    if code == _INTERRUPTED:  # Ctrl-C: typer turns KeyboardInterrupt into exit code 130, silently
        err.print(_interrupted(sys.argv[1:]), highlight=False, soft_wrap=True)
    if isinstance(code, int) and code:  # `raise typer.Exit(n)` in a command
        sys.exit(code)
