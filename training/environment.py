"""EnvFactory environments as TRL GRPO environments: multi-turn tool rollouts in isolated sessions.

TRL 1.16's `GRPOTrainer(environment_factory=...)` builds the tools a model may call from the *class* of the
environment: every public function of the class except `reset` / `get_reward` becomes a tool, described from its
type hints and Google-style docstring (`transformers.utils.get_json_schema`), and keyed by its `__name__`. Our
tools differ per task: a row's tools are those of its conversation's environments (plain names, or `env__tool`
when two of them share a name), exported as a JSON `tools` column. So there is one environment *class* per
distinct tool list, generated here: each tool becomes a method with a real signature (`__signature__`), type
hints built from its JSON schema (enums as `Literal`, arrays as `list[...]`, optional parameters defaulting to
None) and a docstring with each parameter's description. TRL's dict form of `environment_factory` (name →
factory) with an `environment` column on each row (`EnvironmentRegistry.add_environment_column`) picks the class
per row, and renders each prompt with that class's tools only.

Per rollout, TRL takes an instance from its pool and calls `reset(**row)`: the instance forks a fresh
`envfactory.records.episode.Episode` (one isolated `Session` per environment) from the row's `initial_config`; each
tool call of the model goes to that episode (`Session.call`: strict argument validation, structured errors,
rollback) and returns the result as the JSON text the SFT data's tool messages hold. Nothing is shared between
rollouts. A method takes `**arguments` behind its declared signature, so a wrong or missing argument reaches the
session and comes back as its structured error (what the environment would answer) instead of a Python
TypeError.

The class has no `get_reward`: TRL adds it as an extra reward with a fixed weight of 1 beside `reward_funcs`,
which would count the state term twice; the composite reward (`envfactory.reward.ToolUseReward`) already scores
R = α·R_traj + (1−α)·R_state − γ·P_length by replaying the rollout's calls from `initial_config` (deterministic
tools: the replay reaches the state this episode reached). `rollout_states(env)` / `rollout_calls(env)` expose an
instance's live states and calls for checks.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import keyword
import logging
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from envfactory.env.pool import EnvPool
from envfactory.errors import DataError, EnvFactoryError
from envfactory.export.messages import result_text
from envfactory.records.episode import Episode
from envfactory.records.models import States

log = logging.getLogger(__name__)

ENVIRONMENT_COLUMN = "environment"
_SEPARATOR = "__"
_DOC_HEADINGS = re.compile(r"\b(Args|Arguments|Returns|Raises|Yields|Examples?)\s*:")


class EnvironmentSetupError(DataError):
    """A dataset row whose tools or environments cannot be turned into a GRPO environment."""


# ---- tools ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolRoute:
    """Where an exported tool name goes: an environment and its tool."""

    server: str
    tool: str


@dataclass(frozen=True)
class RolloutTool:
    """One tool of a rollout: the exported schema (OpenAI `tools` entry) and its route."""

    name: str
    schema: dict[str, Any]
    route: ToolRoute

    @property
    def function(self) -> dict[str, Any]:
        fn = self.schema.get("function", self.schema)
        return fn if isinstance(fn, dict) else {}

    @property
    def parameters(self) -> dict[str, Any]:
        params = self.function.get("parameters")
        return params if isinstance(params, dict) else {"type": "object", "properties": {}}


def _json(value: str | bytes, column: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as e:  # (a JSONDecodeError; bytes that are not UTF-8)
        raise EnvironmentSetupError(f"{column} is not JSON ({str(e).splitlines()[0]})") from None


def parse_tools(value: Any) -> list[dict[str, Any]]:
    """The `tools` column: a JSON string (as exported) or a list of OpenAI-style tool entries."""
    data = _json(value, "tools") if isinstance(value, str | bytes) else value
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise EnvironmentSetupError("the tools column must be a list of tool entries (JSON)")
    return data


def parse_initial(value: Any) -> dict[str, Any]:
    """The `initial_config` column: a JSON object (as exported) of environment → state, or a mapping; none: {}."""
    data = _json(value, "initial_config") if isinstance(value, str | bytes) else value
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise EnvironmentSetupError("initial_config must be an object of environment states (JSON)")
    return dict(data)


def parse_servers(value: Any) -> list[str]:
    listed = isinstance(value, str | bytes) and str(value).lstrip().startswith("[")
    data = _json(value, "mcp_servers") if listed else value
    if isinstance(data, str):
        return [data]
    if not isinstance(data, list) or not all(isinstance(s, str) for s in data):
        raise EnvironmentSetupError("mcp_servers must be a list of environment names")
    return data


def _tool_name(entry: Mapping[str, Any]) -> str:
    fn = entry.get("function", entry)
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str) or not name:
        raise EnvironmentSetupError(f"a tool entry has no name: {json.dumps(entry)[:120]}")
    return name


def _tools(pool: EnvPool, server: str) -> list[Any]:
    return list(pool.get(server).metadata.tools)


def route_tools(entries: Sequence[Mapping[str, Any]], servers: Sequence[str], pool: EnvPool) -> list[RolloutTool]:
    """Route each exported tool name to an environment's tool (the exporter's naming, inverted).

    `env__tool` goes to that environment; a plain name to the environment that defines it — the row's
    `mcp_servers` first, then the rest of the pool; when several do, the one whose description matches."""
    tool_names: dict[str, list[str]] = {}

    def names_of(server: str) -> list[str]:
        if server not in tool_names:
            try:
                tool_names[server] = pool.get(server).metadata.tool_names
            except EnvFactoryError:
                tool_names[server] = []
        return tool_names[server]

    known = set(pool.names())
    routed: list[RolloutTool] = []
    for entry in entries:
        name = _tool_name(entry)
        route: ToolRoute | None = None
        server, sep, tool = name.partition(_SEPARATOR)
        if sep and server in known and tool in names_of(server):
            route = ToolRoute(server, tool)
        else:
            # a plain name is unique among the conversation's environments (the exporter qualifies it otherwise),
            # and the row's environments are some of those: look there first
            owners = [s for s in servers if name in names_of(s)]
            if not owners:
                owners = [s for s in pool.names() if s not in servers and name in names_of(s)]
            if len(owners) > 1:
                fn = entry.get("function", entry)
                wanted = fn.get("description") if isinstance(fn, Mapping) else None
                same = [s for s in owners if any(t.name == name and t.description == wanted for t in _tools(pool, s))]
                owners = same or owners
            if owners:
                route = ToolRoute(owners[0], name)
        if route is None:
            raise EnvironmentSetupError(f"tool '{name}': no environment in the pool defines it")
        routed.append(RolloutTool(name=name, schema=dict(entry), route=route))
    return routed


# ---- JSON schema → Python type hints ---------------------------------------------------------------------


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = {"$defs": defs, "definitions": defs}
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping):
            return node
    return schema


def _union(types: list[Any]) -> Any:
    unique = list(dict.fromkeys(types))
    if len(unique) == 1:
        return unique[0]
    return typing.Union[tuple(unique)]  # noqa: UP007 - built from a runtime list


_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "null": type(None)}


def python_type(schema: Any, defs: Mapping[str, Any] | None = None, depth: int = 0) -> Any:
    """A type hint that `transformers.utils.get_json_schema` turns back into (nearly) this JSON schema."""
    if not isinstance(schema, Mapping) or depth > 8:
        return Any
    defs = defs or {}
    schema = _resolve(schema, defs)
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        values = [v for v in schema["enum"] if isinstance(v, str | int | float | bool) or v is None]
        if values and len(values) == len(schema["enum"]):
            return Literal[tuple(values)]
    if "const" in schema and (isinstance(schema["const"], str | int | float | bool)):
        return Literal[schema["const"]]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return _union([python_type(s, defs, depth + 1) for s in schema[key]])
    kind = schema.get("type")
    if isinstance(kind, list) and kind:
        return _union([python_type({**schema, "type": k}, defs, depth + 1) for k in kind])
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        items = schema.get("items")
        return list[python_type(items, defs, depth + 1)] if isinstance(items, Mapping) else list  # type: ignore[misc]
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping) and extra:
            return dict[str, python_type(extra, defs, depth + 1)]  # type: ignore[misc]
        return dict
    return Any


def _one_line(text: Any) -> str:
    line = " ".join(str(text or "").split())
    return _DOC_HEADINGS.sub(lambda m: f"{m.group(1)} -", line)


def _hints(schema: Mapping[str, Any]) -> str:
    """Schema details a type hint cannot carry, kept in the description: format, bounds, default."""
    keys = ("format", "minimum", "maximum", "minLength", "maxLength", "pattern", "default")
    shown = [f"{k}: {json.dumps(schema[k])}" for k in keys if k in schema]
    return f" ({'; '.join(shown)})" if shown else ""


def _identifier(name: str, taken: set[str]) -> str:
    ident = re.sub(r"\W", "_", name)
    if not ident or ident[0].isdigit():
        ident = f"p_{ident}"
    if keyword.iskeyword(ident):
        ident += "_"
    while ident in taken:
        ident += "_"
    return ident


@dataclass
class MethodSpec:
    """A generated tool method: its signature, hints and docstring, and the argument names it maps back."""

    signature: inspect.Signature
    annotations: dict[str, Any]
    doc: str
    aliases: dict[str, str] = field(default_factory=dict)  # python name → schema name


def method_spec(tool: RolloutTool) -> MethodSpec:
    params = tool.parameters
    defs = params.get("$defs") or params.get("definitions") or {}
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    description = _one_line(tool.function.get("description")) or tool.name
    arguments: list[inspect.Parameter] = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    lines = [description, ""]
    taken: set[str] = {"self"}
    if props:
        lines.append("Args:")
    for pname in props:
        pschema = props[pname] if isinstance(props[pname], Mapping) else {}
        ident = pname if pname.isidentifier() and not keyword.iskeyword(pname) and pname not in taken else ""
        ident = ident or _identifier(pname, taken)
        taken.add(ident)
        if ident != pname:
            aliases[ident] = pname
        hint = python_type(pschema, defs)
        optional = pname not in required  # a default makes it optional in the schema; the hint stays as is
        annotations[ident] = hint
        arguments.append(
            inspect.Parameter(
                ident,
                inspect.Parameter.KEYWORD_ONLY,
                default=None if optional else inspect.Parameter.empty,
                annotation=hint,
            )
        )
        text = _one_line(_resolve(pschema, defs).get("description")) or pname.replace("_", " ")
        lines.append(f"    {ident}: {text}{_hints(pschema)}")
    return MethodSpec(inspect.Signature(arguments), annotations, "\n".join(lines).rstrip() + "\n", aliases)


# ---- the environment classes ------------------------------------------------------------------------------


class ToolEnvironment:
    """One rollout's isolated episode. Subclasses (made by `environment_class`) add one method per tool."""

    _tools: ClassVar[tuple[RolloutTool, ...]] = ()
    _routes: ClassVar[dict[str, ToolRoute]] = {}
    _aliases: ClassVar[dict[str, dict[str, str]]] = {}
    _key: ClassVar[str] = ""

    def __init__(self, pool: EnvPool) -> None:
        self._pool = pool
        self._episode: Episode | None = None
        self._calls: list[dict[str, Any]] = []
        self._row: dict[str, Any] = {}

    def reset(self, **row: Any) -> None:
        """Fork a fresh episode from the row's `initial_config` (environments without one start from their
        default scenario); nothing is appended to the prompt."""
        initial = parse_initial(row.get("initial_config"))
        servers = parse_servers(row.get("mcp_servers") or [])
        self._episode = Episode(self._pool, initial, servers)
        self._calls = []
        self._row = {k: row.get(k) for k in ("conversation_id", "turn", "ground_truth", "final_config", "mcp_servers")}
        return None

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        if self._episode is None:
            raise RuntimeError("reset() must be called before a tool")
        route = self._routes[name]
        renames = self._aliases.get(name, {})
        args = {renames.get(k, k): v for k, v in arguments.items()}
        record = self._episode.call(route.server, route.tool, args)
        payload = record.payload()
        self._calls.append(
            {"name": name, "server": route.server, "tool": route.tool, "arguments": args, "ok": record.ok}
        )
        return result_text(payload)


def rollout_states(environment: ToolEnvironment) -> States:
    """An environment instance's current states (environment name → dump); {} before `reset`.

    (Module functions, not methods: every public function of the class would become a tool.)"""
    episode = environment._episode
    return episode.dumps() if episode is not None else {}


def rollout_calls(environment: ToolEnvironment) -> list[dict[str, Any]]:
    """The calls the current rollout made, in order: name, server, tool, arguments, ok."""
    return list(environment._calls)


def _tool_method(tool: RolloutTool, spec: MethodSpec, owner: str) -> Callable[..., str]:
    name = tool.name

    def method(self: ToolEnvironment, **arguments: Any) -> str:
        return self._call(name, arguments)

    method.__name__ = name
    method.__qualname__ = f"{owner}.{name}"
    method.__doc__ = spec.doc
    method.__signature__ = spec.signature  # type: ignore[attr-defined]
    method.__annotations__ = dict(spec.annotations)
    return method


def environment_key(tools: Sequence[RolloutTool]) -> str:
    """A stable name for a routed tool list: its environments and a hash of the schemas and routes
    (`hotels-1a2b3c4d5e`)."""
    canonical = json.dumps(
        [[t.schema, t.route.server, t.route.tool] for t in tools], sort_keys=True, ensure_ascii=False
    )
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:10]
    label = "+".join(dict.fromkeys(t.route.server for t in tools)) or "tools"
    return f"{label}-{digest}"


def environment_class(key: str, tools: Sequence[RolloutTool]) -> type[ToolEnvironment]:
    """A `ToolEnvironment` subclass with one typed method per tool (what TRL exposes as tools)."""
    reserved = {"reset", "get_reward"} | {n for n in dir(ToolEnvironment) if not n.startswith("_")}
    owner = "Env_" + re.sub(r"\W", "_", key)
    namespace: dict[str, Any] = {
        "_tools": tuple(tools),
        "_routes": {t.name: t.route for t in tools},
        "_key": key,
        "__module__": __name__,
        "__qualname__": owner,
    }
    aliases: dict[str, dict[str, str]] = {}
    for tool in tools:
        if tool.name in reserved or tool.name.startswith("_") or not tool.name.isidentifier():
            raise EnvironmentSetupError(f"tool name '{tool.name}' cannot be a method of a TRL environment")
        if tool.name in namespace:
            raise EnvironmentSetupError(f"tool name '{tool.name}' appears twice in one tool list")
        spec = method_spec(tool)
        namespace[tool.name] = _tool_method(tool, spec, owner)
        aliases[tool.name] = spec.aliases
    namespace["_aliases"] = aliases
    return type(owner, (ToolEnvironment,), namespace)


class EnvironmentRegistry:
    """The environment classes a dataset needs, one per distinct tool list, and TRL's factories for them."""

    def __init__(self, pool: EnvPool) -> None:
        self.pool = pool
        self.classes: dict[str, type[ToolEnvironment]] = {}
        self._by_tools: dict[str, str] = {}

    def key_for(self, tools: Any, mcp_servers: Any) -> str:
        """The environment name of a row (its class made on first sight)."""
        raw = tools if isinstance(tools, str) else json.dumps(tools, sort_keys=True)
        servers = parse_servers(mcp_servers or [])
        cache_key = f"{raw}\x00{json.dumps(servers)}"
        if cache_key in self._by_tools:
            return self._by_tools[cache_key]
        entries = parse_tools(tools)
        if not entries:
            raise EnvironmentSetupError("a row has an empty tool list")
        routed = route_tools(entries, servers, self.pool)
        key = environment_key(routed)
        if key not in self.classes:
            self.classes[key] = environment_class(key, routed)
        self._by_tools[cache_key] = key
        return key

    def add_environment_column(self, dataset: Any) -> Any:
        """`dataset` (a `datasets.Dataset`) with the `environment` column TRL routes rows by; every row's tools,
        environments and initial state read first, so a bad one is an error naming its row before training, not a
        traceback in a rollout's reset."""
        initial = dataset["initial_config"] if "initial_config" in dataset.column_names else [None] * len(dataset)
        keys: list[str] = []
        for row, (tools, servers, state) in enumerate(
            zip(dataset["tools"], dataset["mcp_servers"], initial, strict=True), start=1
        ):
            try:
                keys.append(self.key_for(tools, servers))
                parse_initial(state)
            except EnvironmentSetupError as e:
                raise EnvironmentSetupError(f"row {row}: {e}") from None
        if ENVIRONMENT_COLUMN in dataset.column_names:
            dataset = dataset.remove_columns(ENVIRONMENT_COLUMN)
        return dataset.add_column(ENVIRONMENT_COLUMN, keys)

    def factories(self) -> dict[str, Callable[[], ToolEnvironment]]:
        """`environment_factory=` for `GRPOTrainer`: name → a callable making a fresh instance."""
        return {key: _Factory(cls, self.pool) for key, cls in self.classes.items()}

    def tool_schemas(self) -> dict[str, list[dict[str, Any]]]:
        """The exact exported tool schemas per environment (what the SFT data renders), in export order."""
        return {key: [dict(t.schema) for t in cls._tools] for key, cls in self.classes.items()}


@dataclass(frozen=True)
class _Factory:
    cls: type[ToolEnvironment]
    pool: EnvPool

    def __call__(self) -> ToolEnvironment:
        return self.cls(self.pool)


def use_exact_tool_schemas(trainer: Any, registry: EnvironmentRegistry) -> bool:
    """Render GRPO prompts with the exported JSON schemas instead of TRL's re-derivation from type hints.

    TRL keeps, per environment name, the tools it renders into prompts and parses completions with
    (`GRPOTrainer._env_tools`, a private attribute of TRL 1.16; execution uses the instances' methods, not this).
    The type-hint round trip drops what hints cannot say (formats, bounds, defaults, nested object fields), so
    replacing the list with the exported schemas makes GRPO prompts render exactly like the SFT data. Returns
    False (and changes nothing) when this TRL version keeps no such mapping or its names differ."""
    current = getattr(trainer, "_env_tools", None)
    exact = registry.tool_schemas()
    if not isinstance(current, dict) or set(current) != set(exact):
        log.warning("GRPOTrainer has no per-environment tool list to replace; prompts use TRL's derived schemas")
        return False
    for key, schemas in exact.items():
        names = {getattr(t, "__name__", None) for t in current[key]}
        if names != {_tool_name(s) for s in schemas}:
            log.warning("environment %s: TRL's tools differ from the exported ones; keeping TRL's", key)
            return False
    for key, schemas in exact.items():
        current[key] = schemas
    return True
