"""An environment e = (m, D, π, V_e): metadata, state model, tools; and the contract check between them."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic_core import to_json

from envfactory.env.diff import StateDiff, diff_states
from envfactory.env.folder import FolderError, list_names, read_json_object
from envfactory.env.metadata import Domain, EnvMetadata, ToolKind, ToolSpec
from envfactory.env.state import Change, State
from envfactory.env.tools import Tool
from envfactory.errors import ContractError, ScenarioError
from envfactory.inputs import read_json_object as read_json_file

if TYPE_CHECKING:
    from envfactory.env.session import Session

F = TypeVar("F", bound=Callable[..., Any])


class ToolBinding(Protocol):
    """What a session needs of a tool, whatever the environment's implementation."""

    name: str
    kind: ToolKind

    def parse_args(self, args: dict[str, Any]) -> dict[str, Any]: ...

    def invoke(self, state: Any, kwargs: dict[str, Any]) -> Any: ...


class BaseEnvironment(ABC):
    """Common interface of native (Pydantic-state) and imported (e.g. BFCL) environments."""

    name: str
    folder: Path | None = None
    blocking_io: bool = False  # True: a call may wait on another process (servers run it off the event loop)

    @property
    @abstractmethod
    def metadata(self) -> EnvMetadata: ...

    @abstractmethod
    def binding(self, tool: str) -> ToolBinding | None:
        """The tool named `tool`, or None if the environment has no such tool."""

    @abstractmethod
    def new_state(self, config: dict[str, Any] | None, source: str = "<config>") -> Any:
        """A fresh, independent state built from an initial config (a state dump)."""

    @abstractmethod
    def dump_state(self, state: Any) -> dict[str, Any]:
        """The state as JSON-compatible data."""

    # ---- per-call bookkeeping: the generic way dumps and copies the whole state ----------
    def begin(self, state: Any, strict: bool) -> Any:
        """Called before a tool runs; returns what `finish` / `rollback` need."""
        return (copy.deepcopy(state), self.dump_state(state))

    def finish(self, state: Any, token: Any, strict: bool) -> tuple[StateDiff, list[Change], str | None]:
        """After a successful call: (diff, change log, contract violation or None)."""
        return diff_states(token[1], self.dump_state(state)), [], None

    def rollback(self, state: Any, token: Any) -> Any:
        """Undo a failed call; returns the state to keep using."""
        return token[0]

    # ---- scenarios (initial configs) ---------------------------------------------------
    def scenario_names(self) -> list[str]:
        if self.folder is None:
            return []
        return list_names(self.folder, "scenarios", ".json")

    def scenario(self, name: str) -> dict[str, Any]:
        """A named initial config (a copy: callers may change it)."""
        return copy.deepcopy(self._scenario(name))

    def _scenario(self, name: str) -> dict[str, Any]:
        """The cached, parsed scenario file: read once per environment, never handed out to mutate.

        `name` is matched against the names listed from the folder, so no string a client sends
        can point anywhere else, and the error does not say whether some file exists."""
        cache: dict[str, dict[str, Any]] = self.__dict__.setdefault("_scenario_cache", {})
        if name in cache:
            return cache[name]
        names = self.scenario_names()
        if name not in names:
            shown = name if len(name) <= 80 else name[:77] + "..."
            raise ScenarioError(
                f"environment '{self.name}' has no scenario {shown!r}; it has: {', '.join(names) or 'none'}"
            )
        assert self.folder is not None
        try:  # never through a link: a scenario cannot make the parent read a file outside the folder
            data = read_json_object(self.folder, f"scenarios/{name}.json", what="scenario")
        except FolderError as e:
            raise ScenarioError(str(e)) from None
        cache[name] = data
        return data

    def sample_configs(self, limit: int = 4) -> list[tuple[str, dict[str, Any]]]:
        """Initial configs that ship with the environment, labelled: its scenarios (an imported suite
        gives its own entries' configs). What health checks and reachability run from; an environment
        that ships none starts from its empty state."""
        return [(name, self.scenario(name)) for name in self.scenario_names()[:limit]] or [("empty", {})]

    def known_calls(self, label: str) -> list[tuple[str, dict[str, Any]]]:
        """Calls known to be sensible from the sample config `label`, in order (an imported suite: its
        entry's ground truth). Health runs them before its random ones; none by default."""
        return []

    def default_scenario(self) -> str | None:
        """`default` when the environment ships one: what a CLI user or a server starts from."""
        return "default" if "default" in self.scenario_names() else None

    def resolve_config(self, config: dict[str, Any] | str | Path | None) -> tuple[dict[str, Any] | None, str]:
        """A dump, a scenario *name* or a `Path` to a JSON file → (dump, source label).

        A string is only ever a scenario name of this environment, whatever it looks like: what a
        client sends never names a file on the server. Only a `Path`, which local callers build on
        purpose (`envfactory call --state FILE`), is read, bounded in size and depth."""
        if config is None or isinstance(config, dict):
            return config, "<config>"
        if isinstance(config, Path):
            return read_json_file(config, what="config file", error=ScenarioError), str(config)
        if not isinstance(config, str):
            raise ScenarioError(
                f"a config must be a state dump (an object) or a scenario name, not {type(config).__name__}"
            )
        # not copied: `new_state` builds the state through JSON, so nothing is shared
        return self._scenario(config), f"{self.name}/scenarios/{config}.json"

    def open_session(self, data: dict[str, Any] | None, source: str, *, strict: bool = False) -> Session:
        """A session on a fresh state built from a resolved config (`Session.fork` resolves it)."""
        from envfactory.env.session import Session

        return Session(self, self.new_state(data, source), strict=strict, source=source)

    def session(self, config: dict[str, Any] | str | Path | None = None, **kwargs: Any) -> Session:
        from envfactory.env.session import Session

        return Session.fork(self, config, **kwargs)


class Environment(BaseEnvironment):
    """A native environment: a `State` subclass and tools registered with `@env.tool(kind=...)`.

    ```python
    env = Environment("hotels", HotelDB, description="...", domain="travel")

    @env.tool(kind="write")
    def book_room(db: HotelDB, hotel_id: str, nights: int) -> Booking:
        '''Book a room. Args: hotel_id: ...'''
    ```
    """

    def __init__(self, name: str, state: type[State], *, description: str, domain: Domain) -> None:
        if not (isinstance(state, type) and issubclass(state, State)):
            raise TypeError(f"environment '{name}': state must be a subclass of envfactory State")
        self.name = name
        self.state_model = state
        self.description = description
        self.domain: Domain = domain
        self.tools: dict[str, Tool] = {}
        self._metadata: EnvMetadata | None = None

    def tool(self, *, kind: ToolKind, name: str | None = None) -> Callable[[F], F]:
        """Register a tool. `kind` is required: `read` tools must not change state (sessions check it)."""
        if kind not in ("read", "write"):
            raise ValueError(f"tool kind must be 'read' or 'write', not {kind!r}")

        def register(fn: F) -> F:
            t = Tool(fn, kind, name)
            if t.name in self.tools:
                raise ValueError(f"environment '{self.name}': tool '{t.name}' registered twice")
            self.tools[t.name] = t
            self._metadata = None
            return fn

        return register

    def binding(self, tool: str) -> Tool | None:
        return self.tools.get(tool)

    def new_state(self, config: dict[str, Any] | None, source: str = "<config>") -> State:
        # through JSON: the new state shares no object with `config` or with any other session
        return self.state_model.load_bytes(to_json(config or {}), source)

    def dump_state(self, state: Any) -> dict[str, Any]:
        return dict(state.dump())

    # The change log makes per-call bookkeeping O(changes) instead of O(state size).
    def begin(self, state: Any, strict: bool) -> Any:
        return (state.log_mark(), state.dump() if strict else None)

    def finish(self, state: Any, token: Any, strict: bool) -> tuple[StateDiff, list[Change], str | None]:
        mark, before = token
        diff = state.diff_since(mark)
        changes = state.changes_since(mark)
        if strict:
            full = diff_states(before, state.dump())
            if full != diff:
                return (
                    full,
                    changes,
                    (
                        "state changed outside the CRUD helpers (create/update/delete/set): "
                        f"the dump differs at {sorted(full.paths() ^ diff.paths())[:5]}"
                    ),
                )
        return diff, changes, None

    def rollback(self, state: Any, token: Any) -> Any:
        mark, before = token
        if before is not None:  # strict: the dump is the truth even if a tool bypassed the log
            return self.new_state(before)
        state.rollback(mark)
        return state

    def derived_metadata(self) -> EnvMetadata:
        """Metadata as the code defines it (signatures and docstrings)."""
        return EnvMetadata(
            name=self.name,
            description=self.description,
            domain=self.domain,
            tools=[t.spec() for t in self.tools.values()],
        )

    @property
    def metadata(self) -> EnvMetadata:
        if self._metadata is None:
            self._metadata = self.derived_metadata()
        return self._metadata

    def attach_metadata(self, meta: EnvMetadata, source: str = "metadata.json") -> None:
        """Use `meta` (e.g. the folder's metadata.json) after checking it agrees with the code."""
        problems = contract_problems(meta, self.derived_metadata(), source)
        if problems:
            raise ContractError(self.name, problems)
        self._metadata = meta


def _type_of(schema: dict[str, Any]) -> Any:
    t = schema.get("type")
    if t is None and "anyOf" in schema:
        return sorted(str(_type_of(s)) for s in schema["anyOf"])
    if t is None and "$ref" in schema:
        return "object"
    return t


def contract_problems(meta: EnvMetadata, code: EnvMetadata, source: str = "metadata.json") -> list[str]:
    """Where the metadata and the code disagree (names, kinds, parameters, required flags, types)."""
    problems: list[str] = []
    if meta.name != code.name:
        problems.append(f"{source} names the environment '{meta.name}' but env.py names it '{code.name}'")
    mtools = {t.name: t for t in meta.tools}
    ctools = {t.name: t for t in code.tools}
    for name in mtools.keys() - ctools.keys():
        problems.append(f"tool '{name}' is in {source} but not registered in env.py")
    for name in ctools.keys() - mtools.keys():
        problems.append(f"tool '{name}' is registered in env.py but missing from {source}")
    for name in sorted(mtools.keys() & ctools.keys()):
        problems.extend(_tool_problems(mtools[name], ctools[name], source))
    return problems


def _tool_problems(m: ToolSpec, c: ToolSpec, source: str) -> list[str]:
    out: list[str] = []
    where = f"tool '{m.name}'"
    if m.kind != c.kind:
        out.append(f"{where}: {source} says kind '{m.kind}', env.py says '{c.kind}'")
    mp, cp = m.parameters, c.parameters
    for p in sorted(mp.keys() - cp.keys()):
        out.append(f"{where}: parameter '{p}' is in {source} but not in the env.py signature")
    for p in sorted(cp.keys() - mp.keys()):
        out.append(f"{where}: parameter '{p}' is in the env.py signature but not in {source}")
    mreq, creq = set(m.required), set(c.required)
    for p in sorted(mp.keys() & cp.keys()):
        if (p in mreq) != (p in creq):
            ms = "required" if p in mreq else "optional"
            cs = "required" if p in creq else "optional"
            out.append(f"{where}: parameter '{p}' is {ms} in {source} but {cs} in env.py")
        mt, ct = _type_of(mp[p]), _type_of(cp[p])
        if mt != ct:
            out.append(f"{where}: parameter '{p}' has type {mt!r} in {source} but {ct!r} in env.py")
    return out
