"""Serve the SynthAPI meta-tool hub over MCP: the whole pool behind five meta-tools, one episode per MCP session.

An agent connected here sees `list_apps`, `list_tools`, `get_tool_documentation`, `call_tool` and
`complete_task` (see `envfactory.metatools` for why `call_tool` is the fifth) instead of every tool
schema of every app. Each MCP session (each `initialize` over streamable HTTP, or the one stdio
connection) gets its own `HubEpisode`, keyed weakly on the SDK's session transport like
`EnvMCPServer` does: its own `Session` per app, its own task, its own verdict.

Task: the server's default task (`default_task`, e.g. for stdio), overridden per session by the
`task` query parameter or the `x-envfactory-task` header on the HTTP connection, or at any time by
the `envfactory_load_task` control tool (a `task_id` from the server's tasks file, or a whole `task`
object). `envfactory_state` returns the session's state dumps per app. Both control tools can be
turned off (`control_tools=False`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from mcp import types
from pydantic import ValidationError

from envfactory.env.pool import EnvPool
from envfactory.env.sandbox.process import workers_resident_mb
from envfactory.errors import EnvFactoryError, first_error
from envfactory.metatools import (
    CALL_TOOL,
    COMPLETE_TASK,
    GET_TOOL_DOC,
    LIST_TOOLS,
    META_TOOLS,
    Hub,
    HubEpisode,
    HubError,
    TaskLoaded,
    load_tasks,
)
from envfactory.records.models import Task
from envfactory.records.run_folder import CONVERSATIONS
from envfactory.serve.answers import answer_bytes, tool_result
from envfactory.serve.base import STATE_TOOL, SessionServer, unknown_arguments
from envfactory.serve.fair import OffLoop
from envfactory.serve.limits import ServeLimits, drop
from envfactory.terminal import shorten

LOAD_TASK_TOOL = "envfactory_load_task"
TASK_HEADER = "x-envfactory-task"
TASK_PARAM = "task"

HUB_INSTRUCTIONS = (
    "A hub of apps (stateful tool environments). Discover what you need on demand: list_apps, then"
    " list_tools(app), then get_tool_documentation(app, tool); run a tool with call_tool(app, tool, arguments)."
    " Each app keeps its state across your calls in this session. When the task is done, call"
    " complete_task(answer) once: it ends the episode and verifies the result."
)


def _control_tools(client_tasks: bool) -> list[types.Tool]:
    """The trainer's tools (never an agent's: with them it could restart a task it failed, or pick an easier one):
    load a task, read the session's state; a whole client-written `task` only where the server takes them."""
    task_id = {"type": "string", "description": "id of a task in the server's tasks file"}
    whole = {"type": "object", "description": "a whole Task object (id, instruction, servers, ...)"}
    return [
        types.Tool(
            name=LOAD_TASK_TOOL,
            description=(
                "Start this session over on a task: `task_id` names one of the server's tasks"
                + (", or `task` gives a whole Task object" if client_tasks else "")
                + ". Every app of the task starts from the task's initial state, every other app from its"
                " default scenario. Neither given: restart the current task."
            ),
            inputSchema={
                "type": "object",
                "properties": {"task_id": task_id, **({"task": whole} if client_tasks else {})},
            },
        ),
        types.Tool(
            name=STATE_TOOL,
            description=(
                "Return this session's current state dumps, one per app it holds a session of, for verification."
            ),
            inputSchema={"type": "object", "properties": {}},
        ),
    ]


_META_TOOLS = [
    types.Tool(
        name=spec.name,
        description=spec.description,
        inputSchema=spec.input_schema,
        outputSchema=spec.output_schema,
        annotations=types.ToolAnnotations(
            readOnlyHint=spec.name in ("list_apps", "list_tools", "get_tool_documentation"),
        ),
    )
    for spec in META_TOOLS
]


class HubMCPServer(SessionServer[HubEpisode]):
    """A FastMCP server whose tools are the hub's meta-tools, dispatched to per-session episodes."""

    choice_param = TASK_PARAM
    choice_header = TASK_HEADER

    def __init__(
        self,
        hub: Hub,
        *,
        default_task: str | None = None,
        host: str = "127.0.0.1",
        port: int = 8765,
        control_tools: bool | None = None,
        client_tasks: bool | None = None,
        log_level: str = "WARNING",
        json_response: bool = True,
        server_stream: bool = False,
        fast_calls: bool = True,
        limits: ServeLimits | None = None,
    ) -> None:
        if default_task is not None:
            hub.task(default_task)  # fail at start, not at the first call, on an unknown task id
        # a hub with tasks of its own serves agents: no control tools (an agent could restart a task it failed) and
        # no client-written task (its sender would set its own verdict); a hub without is a trainer's, which loads
        # each session's task itself
        trainers = not hub.tasks
        control_tools = trainers if control_tools is None else control_tools
        client_tasks = trainers if client_tasks is None else client_tasks
        super().__init__(
            name="envfactory-hub",
            instructions=HUB_INSTRUCTIONS,
            default_choice=default_task,
            # apps may be untrusted environments whose calls wait on a sandboxed worker
            blocking=True,
            host=host,
            port=port,
            control_tools=control_tools,
            log_level=log_level,
            json_response=json_response,
            server_stream=server_stream,
            fast_calls=fast_calls,
            limits=limits,
        )
        self.hub = hub
        self._apps = frozenset(hub.apps)
        self._inprocess: dict[str, bool] = {}  # app -> its calls run in this process (learnt from its sessions)
        self._tools_off_loop = OffLoop(self.limits.inline_cpu_s, self.limits.inline_call_s, weak=False)
        self.default_task = default_task
        self.client_tasks = client_tasks
        self._control = _control_tools(client_tasks)

    @property
    def open_episodes(self) -> int:
        return self.open_held

    async def list_tools(self) -> list[types.Tool]:
        return _META_TOOLS + (self._control if self.control_tools else [])

    def create(self, choice: Any) -> HubEpisode:
        """A new episode on the connection's task (if any)."""
        try:
            return self.hub.episode(choice)
        except HubError as e:
            if e.code == "unknown_task":
                raise HubError(e.code, f"{e.message}; given by this connection's task parameter") from None
            raise

    def helpers_resident_mb(self) -> float:
        return workers_resident_mb()  # the sandboxed workers of this process (untrusted environments)

    def choice_problem(self, choice: Any) -> str | None:
        if isinstance(choice, str) and choice != self.default_choice and choice not in self.hub.tasks:
            try:
                self.hub.task(shorten(choice))  # its message: the task, cut to 80 characters, and the tasks it has
            except HubError as e:
                return f"{e.message}; given by this connection's task parameter"
            return f"no task {shorten(choice)!r}; given by this connection's task parameter"
        return None

    def limiter_keys(self, key: Any, choice: Any, name: str, args: dict[str, Any]) -> list[str]:
        """Each app's calls run under that app's own limiter, so a slow app cannot hold the threads another
        app's calls need; a call touching several apps (a task's state, its verdict) holds each of theirs."""
        apps = self._apps_of(key, choice, name, args)
        return [f"app:{a}" for a in sorted(apps)] or ["hub"]

    def limiter_capacity(self, name: str) -> int:
        app = name.removeprefix("app:")
        return self.limits.cpu_threads if self._inprocess.get(app) else self.limits.app_threads

    def in_process(self, key: Any, name: str, args: dict[str, Any]) -> bool:
        """A `call_tool` of an in-process app the session's episode already holds a session of (nothing to fork
        or load): it may run on the event loop while the session's calls, and that tool's, are cheap. Before,
        every hub call queued for its app's thread."""
        if name != CALL_TOOL:
            return False
        app, episode = args.get("app"), self._held.get(key)
        return (
            isinstance(app, str)
            and self._inprocess.get(app, False)
            and episode is not None
            and not episode.ended
            and app in episode.sessions
            and _tool_key(args) not in self._tools_off_loop
        )

    def ran(self, key: Any, name: str, args: dict[str, Any], cpu: float, blocked: float, *, inline: bool) -> None:
        """As for any session, and for the app's tool: one that was expensive for a session leaves the loop for all
        (each new session of a client would otherwise run one expensive call there, e.g. a sleeping tool)."""
        super().ran(key, name, args, cpu, blocked, inline=inline)
        if name == CALL_TOOL and self._known_tool(args):  # (a name a client made up would be kept for good)
            self._tools_off_loop.ran(_tool_key(args), cpu, blocked, inline=inline)

    def _known_tool(self, args: dict[str, Any]) -> bool:
        """`args` name a tool one of the hub's apps has: only those are remembered across sessions."""
        app, tool = args.get("app"), args.get("tool")
        if not isinstance(app, str) or app not in self._apps or not isinstance(tool, str):
            return False
        try:
            self.hub.tool_spec(app, tool)
        except EnvFactoryError:  # no such tool (a HubError), or an app whose code fails to load
            return False
        return True

    def _apps_of(self, key: Any, choice: Any, name: str, args: dict[str, Any]) -> set[str]:
        known = self._apps
        if name in (CALL_TOOL, LIST_TOOLS, GET_TOOL_DOC):
            app = args.get("app")
            return {app} if isinstance(app, str) and app in known else set()
        episode = self._held.get(key)
        apps: set[str] = set(episode.sessions) if episode is not None else set()
        if name == COMPLETE_TASK and episode is not None and episode.task is not None:
            apps |= set(episode.task.verifier.goal)
        elif name == LOAD_TASK_TOOL:
            raw, task_id = args.get("task"), args.get("task_id")
            if isinstance(raw, dict):
                servers = raw.get("servers")
                apps = {a for a in servers if isinstance(a, str)} if isinstance(servers, list) else set()
            else:
                task: Task | None
                if isinstance(task_id, str):
                    task = self.hub.tasks.get(task_id)
                elif episode is not None:
                    task = episode.task  # no task named: the current one starts over
                else:
                    task = self.hub.tasks.get(choice) if isinstance(choice, str) else None
                apps = set(task.servers) if task is not None else set()
        elif episode is None and isinstance(choice, str) and choice in self.hub.tasks:
            apps = set(self.hub.tasks[choice].servers)  # the session's first call forks its task's apps
        return apps & known

    def _load_task(self, key: Any, connection_task: str | None, arguments: dict[str, Any]) -> types.CallToolResult:
        try:
            episode = self.held(key, connection_task)
        except HubError:  # a bad task on the connection must not keep the session from loading a good one
            episode = self._held[key] = self.hub.episode()
        unknown = unknown_arguments(LOAD_TASK_TOOL, arguments, frozenset({"task_id", "task"}))
        if unknown is not None:
            raise HubError("invalid_arguments", unknown)
        task_id, raw = arguments.get("task_id"), arguments.get("task")
        if task_id is not None and raw is not None:
            raise HubError("invalid_arguments", f"give `task_id` or `task` to {LOAD_TASK_TOOL}, not both")
        target: Task | str | None
        if raw is not None:
            if not self.client_tasks:
                raise HubError(
                    "invalid_arguments",
                    f"this hub runs its own tasks only: give {LOAD_TASK_TOOL} a `task_id` (a whole `task` is taken "
                    "only by a hub serving no tasks file, whose clients are trainers)",
                )
            try:
                target = Task.model_validate(raw)
            except ValidationError as e:
                loc, msg = first_error(e, "<root>")
                raise HubError("invalid_task", f"`task` is not a valid Task: {loc}: {msg}") from None
        elif task_id is not None:
            if not isinstance(task_id, str):
                raise HubError("invalid_arguments", "`task_id` must be a string")
            target = task_id
        else:
            target = episode.task
        task = self.hub.load_task(episode, target)
        if task is None:
            return tool_result({"task_id": None, "apps": []}, wrap=False)
        loaded = TaskLoaded(task_id=task.id, instruction=task.instruction, apps=task.servers)
        return tool_result(loaded.model_dump(mode="json"), wrap=False)

    def dispatch(
        self, key: Any, choice: Any, name: str, arguments: dict[str, Any], size: int = 0
    ) -> types.CallToolResult:
        try:
            if self.control_tools and name == LOAD_TASK_TOOL:
                too_large = self.config_too_large(arguments.get("task"), size, "task")
                if too_large is not None:
                    return tool_result(HubError("invalid_task", too_large).payload(), wrap=False, error=True)
                result = self._load_task(key, choice, arguments)
                self.forget(key)
                return result
            episode = self.held(key, choice)
            if self.control_tools and name == STATE_TOOL:
                if (unknown := unknown_arguments(STATE_TOOL, arguments, frozenset())) is not None:
                    raise HubError("invalid_arguments", unknown)
                return tool_result(self.hub.state(episode), wrap=False)
        except HubError as e:
            return tool_result(e.payload(), wrap=False, error=True)
        except EnvFactoryError as e:  # e.g. an app whose code fails to load
            return tool_result(HubError("environment_error", str(e)).payload(), wrap=False, error=True)
        before = len(episode.calls)
        out = self.hub.invoke(episode, name, arguments)
        # a tool's result may be any JSON value: structured content wraps it as {"result": ...}
        result = tool_result(out.payload, wrap=name == CALL_TOOL, error=not out.ok)
        for app, session in episode.sessions.items():
            if app not in self._inprocess:
                self._inprocess[app] = not session.env.blocking_io
        if len(episode.calls) > before:  # the episode's calls and its apps' histories are a ring here
            gone = self.remember(key, episode.calls[-1], size + answer_bytes(result))
            if gone:
                drop(episode.calls, gone)
                for app in {g.app for g in gone}:
                    if app in episode.sessions:
                        drop(episode.sessions[app].history, [g.record for g in gone if g.app == app])
        return result


def _tool_key(args: dict[str, Any]) -> str:
    """An app's tool, as `OffLoop` knows it (a call_tool's arguments)."""
    return f"{args.get('app')}/{args.get('tool')}"


def build_hub_server(
    pool: EnvPool,
    tasks_path: str | Path | None = None,
    *,
    apps: list[str] | None = None,
    **kwargs: Any,
) -> HubMCPServer:
    """A hub server over `pool` with the tasks of `tasks_path`: a JSONL file of Conversations or Tasks, or a synth
    run's folder (its training split, as `export` and `eval` read it). A file with no task is an error."""
    tasks = None
    if tasks_path is not None:
        path = Path(tasks_path)
        if path.is_dir():
            path = path / CONVERSATIONS
            if not path.is_file():
                raise HubError("invalid_tasks_file", f"{tasks_path} has no {CONVERSATIONS}: give a synth run folder")
        tasks = load_tasks(path)
        if not tasks:
            raise HubError("invalid_tasks_file", f"{path}: no task in it: nothing to serve")
    return HubMCPServer(Hub(pool, tasks, apps=apps), **kwargs)


def serve_hub(
    pool: EnvPool,
    tasks_path: str | Path | None = None,
    transport: Literal["stdio", "streamable-http", "http"] = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    default_task: str | None = None,
    control_tools: bool | None = None,
    client_tasks: bool | None = None,
    apps: list[str] | None = None,
    log_level: str = "WARNING",
    limits: ServeLimits | None = None,
) -> None:
    """Serve the hub until interrupted: streamable HTTP on `host:port` (path /mcp), or stdio for one client."""
    if transport not in ("stdio", "streamable-http", "http"):
        raise EnvFactoryError(f"unknown transport '{transport}': use stdio or streamable-http")
    server = build_hub_server(
        pool,
        tasks_path,
        apps=apps,
        default_task=default_task,
        host=host,
        port=port,
        control_tools=control_tools,
        client_tasks=client_tasks,
        log_level=log_level,
        limits=limits,
    )
    server.run(transport="stdio" if transport == "stdio" else "streamable-http")
