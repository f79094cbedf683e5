"""`Hub`: the pool behind the meta-tools, with one `HubEpisode` per conversation (the catalogue, the episode
methods, and `invoke`, a meta-tool call by name with JSON arguments)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from envfactory.env.environment import BaseEnvironment
from envfactory.env.metadata import ToolSpec
from envfactory.env.pool import EnvPool
from envfactory.env.session import CallRecord, Session
from envfactory.env.tools import pydantic_errors_to_problems
from envfactory.errors import EnvFactoryError
from envfactory.metatools.protocol import (
    META_TOOL_ARGS,
    AppInfo,
    AppList,
    CallToolArgs,
    CompleteTaskArgs,
    CompletionResult,
    GetToolDocumentationArgs,
    HubError,
    ListToolsArgs,
    MetaOutcome,
    ToolDoc,
    ToolInfo,
    ToolList,
    one_line,
)
from envfactory.records.episode import Episode
from envfactory.records.models import States, Task
from envfactory.records.verifier import verify

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
        self.result: CompletionResult | None = None  # the verdict in full (the expected values named), for logs
        self.told: CompletionResult | None = None  # the verdict as the agent was told it: no expected value
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
        outside = sorted({a for a in [*task.initial_state, *task.verifier.goal] if a not in task.servers})
        if outside:  # (an initial state of another app was ignored without a word)
            raise HubError(
                "invalid_task",
                f"task '{task.id}' gives a state of app '{outside[0]}', which is not one of its servers"
                f" ({', '.join(task.servers)}): name it in servers or leave its state out",
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
        episode.result = episode.told = None
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
        episode.told = CompletionResult(success=verdict.ok, reasons=verdict.public)
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
        model = META_TOOL_ARGS.get(name)
        if model is None:
            raise HubError(
                "unknown_meta_tool", f"no meta-tool '{name}'; the meta-tools are: {', '.join(META_TOOL_ARGS)}"
            )
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
        elif isinstance(args, CompleteTaskArgs):  # the agent hears the verdict without the expected values
            self.complete_task(episode, args.answer)
            assert episode.told is not None
            out = episode.told
        else:
            out = AppList(apps=self.list_apps())
        return MetaOutcome(ok=True, payload=out.model_dump(mode="json"))
