"""The SynthAPI meta-tool hub, in process: the whole pool behind a handful of meta-tools.

An agent does not hold every tool schema of every app in its context; it discovers them on demand:

- `list_apps()` — the apps (environments): name, description, domain, number of tools;
- `list_tools(app)` — each tool of an app: name, one-line description, kind (read / write);
- `get_tool_documentation(app, tool)` — the full description, the JSON-Schema input parameters and
  the output schema of one tool;
- `call_tool(app, tool, arguments)` — run a discovered tool;
- `complete_task(answer)` — end the episode and run the task's state verifier.

SynthAPI names four meta-tools (list_apps, list_tools, get_tool_documentation, complete_task): its
agent executes the tools it discovers directly, since its harness adds them to the model's tool list
once documented. Over MCP (`envfactory.serve.hub_server`) a client's tool list is fixed at connection
time, and re-listing per discovered tool would defeat the purpose, so the fifth meta-tool,
`call_tool`, is how a discovered tool is executed: the same call a direct tool would make, routed to
this episode's isolated `Session` of that app.

An *episode* (`HubEpisode`) is one conversation: one `Session` per app it touches (forked lazily from
the app's default scenario, or from the task's initial state), the active task T = (x, v, Db⁰, π*)
if any, and whether it has ended. Loading a task forks every app of `task.servers` from
`task.initial_state[app]`; the other apps start from their default scenario when first called.
`complete_task` runs `verify(task.verifier, task.initial_state, <final dumps>, answer)`; after it the
episode refuses tool calls until a task is loaded again.

`Hub` is independent of MCP: the LLM solver agents use it directly (the catalogue methods, the
episode methods, or `invoke` to dispatch a meta-tool call by name with JSON arguments).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envfactory.env.environment import BaseEnvironment
from envfactory.env.metadata import ToolKind, ToolSpec
from envfactory.env.pool import EnvPool
from envfactory.env.session import CallRecord, Session
from envfactory.env.tools import _strip_titles, pydantic_errors_to_problems
from envfactory.errors import EnvFactoryError, first_error
from envfactory.inputs import InputError, parse_json, read_text
from envfactory.tasks.episode import Episode
from envfactory.tasks.models import Conversation, States, Task
from envfactory.tasks.verifier import verify

HubErrorCode = Literal[
    "unknown_app",
    "unknown_tool",
    "unknown_task",
    "invalid_task",
    "no_task",
    "episode_ended",
    "invalid_arguments",
    "unknown_meta_tool",
    "invalid_tasks_file",
    "environment_error",
]


class HubError(EnvFactoryError):
    """An error a hub user can act on; `code` says which kind (the MCP server reports it as the error type)."""

    def __init__(self, code: HubErrorCode, message: str) -> None:
        self.code: HubErrorCode = code
        self.message = message
        super().__init__(message)

    def payload(self) -> dict[str, Any]:
        return {"error": {"type": self.code, "message": self.message}}


# ---- what the meta-tools return -------------------------------------------------------------------


class AppInfo(BaseModel):
    """One app of the hub, as `list_apps` shows it."""

    name: str
    description: str
    domain: str
    num_tools: int


class AppList(BaseModel):
    apps: list[AppInfo]


class ToolInfo(BaseModel):
    """One tool, as `list_tools` shows it: enough to decide whether to read its documentation."""

    name: str
    description: str = Field(description="the first sentence of the tool's description")
    kind: ToolKind


class ToolList(BaseModel):
    app: str
    tools: list[ToolInfo]


class ToolDoc(BaseModel):
    """The full documentation of one tool: what to call `call_tool` with, and what comes back."""

    app: str
    name: str
    kind: ToolKind
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None


class CompletionResult(BaseModel):
    """The verdict of `complete_task`: success, and in words what differs from the goal."""

    success: bool
    reasons: list[str] = Field(default_factory=list)


class TaskLoaded(BaseModel):
    """What loading a task answers: its id, instruction and apps."""

    task_id: str
    instruction: str
    apps: list[str]


class MetaOutcome(BaseModel):
    """The outcome of a meta-tool call by name (`Hub.invoke`): ok, and the JSON payload an agent sees."""

    ok: bool
    payload: Any = None


# ---- the meta-tools' arguments (their models are also the input schemas) --------------------------


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ListAppsArgs(_Args):
    pass


class ListToolsArgs(_Args):
    app: str = Field(description="name of an app, as list_apps returns it")


class GetToolDocumentationArgs(_Args):
    app: str = Field(description="name of an app, as list_apps returns it")
    tool: str = Field(description="name of one of the app's tools, as list_tools returns it")


class CallToolArgs(_Args):
    app: str = Field(description="name of an app, as list_apps returns it")
    tool: str = Field(description="name of one of the app's tools, as list_tools returns it")
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="the tool's arguments, as its documentation's input_schema describes"
    )


class CompleteTaskArgs(_Args):
    answer: str | None = Field(default=None, description="the final answer to the user, when the task asks for one")


class MetaToolSpec(BaseModel):
    """A meta-tool as an agent sees it: name, description, JSON-Schema input, and output schema if any."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A Pydantic model's JSON Schema without the auto titles."""
    schema: dict[str, Any] = _strip_titles(model.model_json_schema())
    if schema.get("type") == "object":
        schema.setdefault("properties", {})
    return schema


LIST_APPS, LIST_TOOLS, GET_TOOL_DOC, CALL_TOOL, COMPLETE_TASK = (
    "list_apps",
    "list_tools",
    "get_tool_documentation",
    "call_tool",
    "complete_task",
)

_ARGS: dict[str, type[_Args]] = {
    LIST_APPS: ListAppsArgs,
    LIST_TOOLS: ListToolsArgs,
    GET_TOOL_DOC: GetToolDocumentationArgs,
    CALL_TOOL: CallToolArgs,
    COMPLETE_TASK: CompleteTaskArgs,
}

META_TOOLS: list[MetaToolSpec] = [
    MetaToolSpec(
        name=LIST_APPS,
        description="List the apps you can use: name, description, domain and number of tools of each.",
        input_schema=model_schema(ListAppsArgs),
        output_schema=model_schema(AppList),
    ),
    MetaToolSpec(
        name=LIST_TOOLS,
        description="List the tools of one app: name, one-line description and kind (read or write) of each.",
        input_schema=model_schema(ListToolsArgs),
        output_schema=model_schema(ToolList),
    ),
    MetaToolSpec(
        name=GET_TOOL_DOC,
        description=(
            "Get the full documentation of one tool of an app: its description, its input parameters (JSON Schema,"
            " with the required ones) and its output schema. Read it before calling a tool."
        ),
        input_schema=model_schema(GetToolDocumentationArgs),
        output_schema=model_schema(ToolDoc),
    ),
    MetaToolSpec(
        name=CALL_TOOL,
        description=(
            "Call one tool of an app with its arguments and return what the tool returns (an error object when"
            " the call fails). Each app keeps its state across your calls."
        ),
        input_schema=model_schema(CallToolArgs),
    ),
    MetaToolSpec(
        name=COMPLETE_TASK,
        description=(
            "Finish the task when you are done (give your final answer to the user if the task asks a question)."
            " The episode ends: no tool can be called after it."
        ),
        input_schema=model_schema(CompleteTaskArgs),
        output_schema=model_schema(CompletionResult),
    ),
]


def one_line(description: str) -> str:
    """The first sentence of the first non-empty line of a description."""
    line = next((ln.strip() for ln in description.splitlines() if ln.strip()), "")
    head, sep, _ = line.partition(". ")
    return head + "." if sep else line


# ---- tasks sources -----------------------------------------------------------------------------------


MAX_TASKS_BYTES = 2 * 1024**3  # a synth run's conversations.jsonl can serve as the tasks file: large, but bounded


def load_tasks(path: str | Path) -> dict[str, Task]:
    """Read a JSONL file of `Conversation` records (their `.task`) or bare `Task` records, keyed by task id.

    Blank lines are skipped; a line that is not JSON, not a record, or repeats a task id is an error
    naming the file and the line.
    """
    p = Path(path)
    try:
        text = read_text(p, max_bytes=MAX_TASKS_BYTES, what="tasks file")
    except InputError as e:
        raise HubError("invalid_tasks_file", str(e)) from None
    tasks: dict[str, Task] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{p}: line {lineno}"
        try:
            data = parse_json(line, where)
        except InputError as e:
            raise HubError("invalid_tasks_file", str(e)) from None
        if not isinstance(data, dict):
            raise HubError("invalid_tasks_file", f"{where}: expected a JSON object (a Conversation or a Task)")
        is_conversation = "task" in data and "nodes" in data
        try:
            task = Conversation.model_validate(data).task if is_conversation else Task.model_validate(data)
        except ValidationError as e:
            kind = "Conversation" if is_conversation else "Task"
            raise HubError("invalid_tasks_file", f"{where}: not a valid {kind} record: {_first_error(e)}") from None
        if task.id in tasks:
            raise HubError("invalid_tasks_file", f"{where}: task id '{task.id}' appears twice")
        tasks[task.id] = task
    return tasks


def _first_error(e: ValidationError) -> str:
    loc, msg = first_error(e, "<root>")
    more = f" (and {e.error_count() - 1} more problems)" if e.error_count() > 1 else ""
    return f"{loc}: {msg}{more}"


# ---- episodes -------------------------------------------------------------------------------------


class HubCall(NamedTuple):
    """One tool call of an episode, across apps, in order."""

    app: str
    record: CallRecord


class HubEpisode(Episode):
    """One conversation with the hub: an `Episode` (a `Session` per app touched), the active task, whether
    it has ended, and every call in order."""

    def __init__(self, pool: EnvPool) -> None:
        super().__init__(pool)
        self.task: Task | None = None
        self.ended = False
        self.result: CompletionResult | None = None
        self.calls: list[HubCall] = []


# ---- the hub ----------------------------------------------------------------------------------------


class Hub:
    """The pool behind the meta-tools. Catalogue methods are shared; everything stateful takes an episode."""

    def __init__(
        self,
        pool: EnvPool,
        tasks: Mapping[str, Task] | Iterable[Task] | None = None,
        *,
        apps: Sequence[str] | None = None,
    ) -> None:
        self.pool = pool
        known = pool.names()
        if apps is not None:
            missing = [a for a in apps if a not in known]
            if missing:
                raise HubError("unknown_app", f"no app '{missing[0]}' in the pool (known: {', '.join(known)})")
        self.apps: list[str] = list(apps) if apps is not None else known
        self._app_set = set(self.apps)
        if tasks is None:
            self.tasks: dict[str, Task] = {}
        elif isinstance(tasks, Mapping):
            self.tasks = dict(tasks)
        else:
            self.tasks = {t.id: t for t in tasks}
        for task in self.tasks.values():
            self._check_task(task)
        self._app_infos: list[AppInfo] | None = None

    # ---- lookups ---------------------------------------------------------------------------------
    def env(self, app: str) -> BaseEnvironment:
        if app not in self._app_set:
            raise HubError("unknown_app", f"no app '{app}'; the apps are: {', '.join(self.apps)}")
        return self.pool.get(app)

    def tool_spec(self, app: str, tool: str) -> ToolSpec:
        meta = self.env(app).metadata
        try:
            return meta.tool(tool)
        except KeyError:
            raise HubError(
                "unknown_tool", f"app '{app}' has no tool '{tool}'; its tools are: {', '.join(meta.tool_names)}"
            ) from None

    def task(self, task_id: str) -> Task:
        task = self.tasks.get(task_id)
        if task is None:
            known = ", ".join(sorted(self.tasks)[:20]) or "none loaded"
            more = f" and {len(self.tasks) - 20} more" if len(self.tasks) > 20 else ""
            raise HubError("unknown_task", f"no task '{task_id}' (known: {known}{more})")
        return task

    def _check_task(self, task: Task) -> None:
        used = [*task.servers, *task.initial_state, *task.verifier.goal]
        unknown = sorted({a for a in used if a not in self._app_set})
        if unknown:
            raise HubError(
                "invalid_task",
                f"task '{task.id}' uses app '{unknown[0]}', which the hub does not serve"
                f" (apps: {', '.join(self.apps)})",
            )

    # ---- the catalogue meta-tools ----------------------------------------------------------------
    def list_apps(self) -> list[AppInfo]:
        if self._app_infos is None:  # from each app's metadata.json: listing builds no environment
            infos = []
            for name in self.apps:
                e = self.pool.entry(name)
                infos.append(AppInfo(name=name, description=e.description, domain=e.domain, num_tools=e.tools))
            self._app_infos = infos
        return list(self._app_infos)

    def list_tools(self, app: str) -> list[ToolInfo]:
        return [
            ToolInfo(name=t.name, description=one_line(t.description), kind=t.kind)
            for t in self.env(app).metadata.tools
        ]

    def get_tool_documentation(self, app: str, tool: str) -> ToolDoc:
        spec = self.tool_spec(app, tool)
        return ToolDoc(
            app=app,
            name=spec.name,
            kind=spec.kind,
            description=spec.description,
            input_schema=spec.input_schema,
            output_schema=spec.output_schema,
        )

    # ---- episodes ----------------------------------------------------------------------------------
    def episode(self, task: Task | str | None = None) -> HubEpisode:
        """A new episode, with `task` (an object or a task id) loaded when given."""
        ep = HubEpisode(self.pool)
        if task is not None:
            self.load_task(ep, task)
        return ep

    def load_task(self, episode: HubEpisode, task: Task | str | None) -> Task | None:
        """Start the episode over on `task` (None: no task, every app at its default scenario)."""
        if isinstance(task, str):
            task = self.task(task)
        elif task is not None:
            self._check_task(task)
        sessions: dict[str, Session] = {}
        if task is not None:
            for app in task.servers:
                config = task.initial_state[app] if app in task.initial_state else self._default_config(app)
                try:
                    sessions[app] = Session.fork(self.env(app), config)
                except HubError:
                    raise
                except EnvFactoryError as e:
                    raise HubError("invalid_task", f"task '{task.id}': the initial state of '{app}': {e}") from None
        episode.sessions = sessions
        episode.task = task
        episode.ended = False
        episode.result = None
        episode.calls = []
        return task

    def _default_config(self, app: str) -> str | None:
        return self.env(app).default_scenario()

    def session(self, episode: HubEpisode, app: str) -> Session:
        """The episode's session of `app` (one of the hub's apps), forked from its default scenario on first use."""
        self.env(app)  # an app outside the hub is an error naming the hub's apps
        return episode.session(app)

    def call_tool(
        self, episode: HubEpisode, app: str, tool: str, arguments: dict[str, Any] | None = None
    ) -> CallRecord:
        """Run one tool in the episode's session of `app`. A failed call is a record with `ok=False`."""
        if episode.ended:
            raise HubError(
                "episode_ended",
                "the episode has ended (complete_task was called); no tool can be called until a task is loaded again",
            )
        rec = self.session(episode, app).call(tool, arguments)
        episode.calls.append(HubCall(app, rec))
        return rec

    def state(self, episode: HubEpisode) -> States:
        """The current state dump of every app the episode holds a session of."""
        return episode.dumps()

    def complete_task(self, episode: HubEpisode, answer: str | None = None) -> CompletionResult:
        """End the episode and run the active task's verifier on the final states."""
        task = episode.task
        if task is None:
            raise HubError(
                "no_task", "no task is active in this episode, so there is nothing to verify; load a task first"
            )
        if episode.ended:
            raise HubError("episode_ended", "the episode has already ended: complete_task was called before")
        for app in task.verifier.goal:
            self.session(episode, app)  # a goal app never touched is checked at its initial state
        verdict = verify(task.verifier, task.initial_state, self.state(episode), answer)
        episode.ended = True
        episode.result = CompletionResult(success=verdict.ok, reasons=verdict.reasons)
        return episode.result

    # ---- dispatch by name ------------------------------------------------------------------------
    def invoke(self, episode: HubEpisode, name: str, arguments: dict[str, Any] | None = None) -> MetaOutcome:
        """Run meta-tool `name` with JSON `arguments`: what an agent's tool call becomes. Never raises a HubError:
        errors (and failed tool calls) come back with `ok=False` and `{"error": {...}}` as the payload."""
        try:
            return self._invoke(episode, name, arguments or {})
        except HubError as e:
            return MetaOutcome(ok=False, payload=e.payload())
        except EnvFactoryError as e:  # e.g. an app whose code fails to load
            return MetaOutcome(ok=False, payload=HubError("environment_error", str(e)).payload())

    def _invoke(self, episode: HubEpisode, name: str, arguments: dict[str, Any]) -> MetaOutcome:
        model = _ARGS.get(name)
        if model is None:
            raise HubError("unknown_meta_tool", f"no meta-tool '{name}'; the meta-tools are: {', '.join(_ARGS)}")
        try:
            args = model.model_validate(arguments)
        except ValidationError as e:
            problems = "; ".join(f"{p.parameter}: {p.problem}" for p in pydantic_errors_to_problems(e))
            raise HubError("invalid_arguments", f"invalid arguments for '{name}': {problems}") from None
        out: BaseModel
        if isinstance(args, CallToolArgs):
            rec = self.call_tool(episode, args.app, args.tool, args.arguments)
            return MetaOutcome(ok=rec.ok, payload=rec.payload())
        if isinstance(args, ListToolsArgs):
            out = ToolList(app=args.app, tools=self.list_tools(args.app))
        elif isinstance(args, GetToolDocumentationArgs):
            out = self.get_tool_documentation(args.app, args.tool)
        elif isinstance(args, CompleteTaskArgs):
            out = self.complete_task(episode, args.answer)
        else:
            out = AppList(apps=self.list_apps())
        return MetaOutcome(ok=True, payload=out.model_dump(mode="json"))
