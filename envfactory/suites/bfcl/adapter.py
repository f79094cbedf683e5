"""BFCL classes as envfactory environments: `BFCLTool` (one method), `BFCLEnvironment` (one class).

Also the numeric guard that keeps MathAPI's process-global precision changes inside one call,
`factories()` (one per BFCL class that imports here) and `environment()` (one shared object per class).
"""

from __future__ import annotations

import contextlib
import copy
import decimal
import functools
import inspect
import pickle
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from envfactory.env.diff import RUNTIME_PREFIX, StateDiff
from envfactory.env.environment import BaseEnvironment
from envfactory.env.metadata import EnvMetadata, ToolKind, ToolSpec
from envfactory.env.state import Change
from envfactory.env.tools import ArgumentError, ArgumentProblem
from envfactory.errors import ScenarioError, ToolError
from envfactory.suites.bfcl.calls import ParsedCall
from envfactory.suites.bfcl.dump import (
    _NOT_STATE,
    _NOT_STATE_ALL,
    FolderCycleError,
    _dump_file_system,
    int_key_paths,
    restore_int_keys,
    to_jsonable,
)
from envfactory.suites.bfcl.schema import StrictValidator, _parameters_schema, _problem_for, convert_schema
from envfactory.suites.bfcl.suites import (
    _INPUT_PATCHES,
    _NULLABLE_OUTPUT,
    _SUITES,
    _UNDOCUMENTED_RESPONSES,
    SUITES_BY_CLASS,
    _backend,
    available,
    bfcl_version,
    class_importable,
    func_docs,
    load_class,
)


@contextmanager
def _numeric_guard() -> Iterator[None]:
    """Keep MathAPI's process-global precision changes (decimal context, mpmath.mp.dps) inside one call."""
    mp = sys.modules.get("mpmath")
    dps = mp.mp.dps if mp is not None else None
    try:
        with decimal.localcontext():
            yield
    finally:
        if mp is not None and dps is not None:
            mp.mp.dps = dps


def _split_description(text: str) -> tuple[str, str]:
    """BFCL writes "<class description> Tool description: <tool description>"."""
    marker = "Tool description:"
    if marker in text:
        head, tail = text.split(marker, 1)
        return head.strip(), tail.strip()
    return "", text.strip()


class BFCLTool:
    """One BFCL method as a tool binding: schema-checked arguments, a plain method call, JSON results."""

    def __init__(
        self,
        cls: type[Any],
        doc: dict[str, Any],
        kind: ToolKind,
        *,
        output: str = "documented",
        input_patches: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """`output`: "documented" (the converted `response`), "nullable" (that or null) or "none"."""
        self.name: str = doc["name"]
        self.kind: ToolKind = kind
        self.cls = cls
        self.description = _split_description(str(doc.get("description", "")))[1] or self.name
        self.input_schema = _parameters_schema(doc)
        for pname, patch in (input_patches or {}).items():
            if pname in self.input_schema["properties"]:
                self.input_schema["properties"][pname].update(copy.deepcopy(patch))
        response = doc.get("response")
        self.output_schema: dict[str, Any] | None = None
        if output != "none" and isinstance(response, dict) and response:
            try:
                converted = convert_schema(response)
            except ValueError:
                converted = {}
            if isinstance(converted.get("type"), str):
                if output == "nullable":
                    converted["type"] = [converted["type"], "null"]
                self.output_schema = converted
        StrictValidator.check_schema(self.input_schema)
        self._validator = StrictValidator(self.input_schema)
        self._properties: dict[str, Any] = self.input_schema["properties"]
        self._required: list[str] = self.input_schema.get("required", [])
        self.signature = inspect.signature(getattr(cls, self.name))
        params = list(self.signature.parameters.values())[1:]  # drop self
        self.signature = self.signature.replace(parameters=params)
        # mutable defaults (e.g. post_tweet's tags=[]) are shared by every call in the process
        self._fresh_defaults = {
            p.name: p.default for p in params if p.default is not p.empty and isinstance(p.default, list | dict | set)
        }

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description,
            kind=self.kind,
            input_schema=copy.deepcopy(self.input_schema),
            output_schema=copy.deepcopy(self.output_schema),
        )

    def parse_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """Validate `args` against the schema (strict JSON types); return fresh call kwargs."""
        problems = [
            ArgumentProblem(parameter=str(k), problem="unknown parameter") for k in args if k not in self._properties
        ]
        problems += [
            ArgumentProblem(parameter=r, problem="required parameter is missing")
            for r in self._required
            if r not in args
        ]
        for err in sorted(self._validator.iter_errors(args), key=lambda e: list(map(str, e.absolute_path))):
            if err.validator == "required" and not err.absolute_path:
                continue  # reported above, by name
            problems.append(_problem_for(err))
        if problems:
            raise ArgumentError(problems)
        kwargs = copy.deepcopy(args)  # BFCL keeps argument objects in its state
        for name, default in self._fresh_defaults.items():
            if name not in kwargs:
                kwargs[name] = copy.deepcopy(default)
        return kwargs

    def invoke(self, state: Any, kwargs: dict[str, Any]) -> Any:
        """Call the method; its result (BFCL's own, `{"error": ...}` dicts included) as fresh JSON data."""
        method = getattr(state, self.name)
        with _numeric_guard():
            try:
                result = method(**kwargs)
            except Exception as e:  # BFCL signals some bad inputs by raising (e.g. an unknown route)
                raise ToolError(f"{type(e).__name__}: {e}", exception=type(e).__name__) from e
            return to_jsonable(result)

    def bind(self, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Name positional arguments by the method's signature, as Python (and so BFCL) would."""
        try:
            bound = self.signature.bind_partial(*args, **(kwargs or {}))
        except TypeError as e:
            raise ArgumentError([ArgumentProblem(parameter="<arguments>", problem=str(e))]) from None
        return dict(bound.arguments)


class BFCLEnvironment(BaseEnvironment):
    """One BFCL multi-turn class as an envfactory environment (state = an instance of the class)."""

    def __init__(
        self, class_name: str, *, long_context: bool = False, kinds: dict[str, ToolKind] | None = None
    ) -> None:
        """`kinds` overrides entries of the read/write table (for tests of the session's kind check)."""
        suite = SUITES_BY_CLASS.get(class_name)
        if suite is None:
            raise ValueError(f"no envfactory suite for BFCL class '{class_name}'; known: {', '.join(SUITES_BY_CLASS)}")
        self.suite = suite
        self.class_name = class_name
        self.name = suite.env
        self.long_context = long_context
        self.cls = load_class(class_name)
        _, _, stateless = _backend()
        self.stateless = class_name in stateless or not hasattr(self.cls, "_load_scenario")
        self._not_state = _NOT_STATE_ALL | _NOT_STATE.get(class_name, frozenset())
        docs = func_docs(class_name)
        no_output = _UNDOCUMENTED_RESPONSES.get(class_name, frozenset())
        nullable = _NULLABLE_OUTPUT.get(class_name, frozenset())
        patches = {p: schema for (c, p), schema in _INPUT_PATCHES.items() if c == class_name}
        self.tools: dict[str, BFCLTool] = {}
        for doc in docs:
            name = doc["name"]
            # a tool missing from the table (a newer bfcl-eval) counts as a write: never wrongly "read"
            kind: ToolKind = (kinds or {}).get(name) or ("read" if name in suite.read else "write")
            output = "none" if name in no_output else "nullable" if name in nullable else "documented"
            self.tools[name] = BFCLTool(self.cls, doc, kind, output=output, input_patches=patches)
        self.description = next(
            (d for d in (_split_description(str(x.get("description", "")))[0] for x in docs) if d), ""
        )
        if not self.description:
            self.description = str(getattr(self.cls(), "_api_description", "")) or f"BFCL {class_name}"
        self._metadata: EnvMetadata | None = None

    @property
    def metadata(self) -> EnvMetadata:
        if self._metadata is None:
            self._metadata = EnvMetadata(
                name=self.name,
                description=self.description,
                domain=self.suite.domain,
                version=bfcl_version(),
                source=f"bfcl:{self.class_name}",
                tools=[t.spec() for t in self.tools.values()],
            )
        return self._metadata

    def binding(self, tool: str) -> BFCLTool | None:
        return self.tools.get(tool)

    def sample_configs(self, limit: int = 4) -> list[tuple[str, dict[str, Any]]]:
        """BFCL's own initial configs for this class: those of the first multi_turn_base entries using it."""
        from envfactory.suites.bfcl.entries import load_entries

        out: list[tuple[str, dict[str, Any]]] = []
        with contextlib.suppress(Exception):
            for entry in load_entries("multi_turn_base"):
                if self.class_name in entry.involved_classes and len(out) < limit:
                    out.append((entry.id, entry.config_for(self.class_name)))
        return out

    def known_calls(self, label: str) -> list[tuple[str, dict[str, Any]]]:
        """The ground truth of entry `label` that runs on this class, call by call, in turn order."""
        from envfactory.suites.bfcl.calls import CallSyntaxError, parse_call
        from envfactory.suites.bfcl.entries import load_entries, route

        out: list[tuple[str, dict[str, Any]]] = []
        with contextlib.suppress(Exception):
            entry = next(e for e in load_entries("multi_turn_base") if e.id == label)
            for turn in entry.ground_truth:
                for text in turn:
                    with contextlib.suppress(CallSyntaxError, ArgumentError):
                        call = parse_call(text)
                        if route(call.method, entry.involved_classes) == self.class_name:
                            out.append((call.method, self.call_arguments(call)))
        return out

    def new_state(self, config: dict[str, Any] | None, source: str = "<config>") -> Any:
        """A fresh instance loaded from a deep copy of `config` (BFCL's initial_config for this class)."""
        instance = self.cls()
        if self.stateless:
            return instance  # BFCL loads no scenario into stateless classes
        if config is not None and not isinstance(config, dict):
            raise ScenarioError(f"{source}: a BFCL config must be a JSON object")
        try:
            instance._load_scenario(copy.deepcopy(config or {}), long_context=self.long_context)
        except Exception as e:
            raise ScenarioError(f"{source}: cannot load into BFCL {self.class_name}: {type(e).__name__}: {e}") from e
        if self.long_context:
            instance = copy.deepcopy(instance)  # it holds BFCL's module-level extension data
        self._restore(instance, config or {})
        return instance

    def _default_types(self) -> dict[str, type]:
        """The type of each attribute of an instance loaded from BFCL's own default scenario."""
        cached: dict[str, type] | None = self.__dict__.get("_types")
        if cached is None:
            fresh = self.cls()
            with contextlib.suppress(Exception):
                fresh._load_scenario({}, long_context=False)
            cached = self.__dict__["_types"] = {k: type(v) for k, v in vars(fresh).items()}
        return cached

    def _restore(self, instance: Any, config: dict[str, Any]) -> None:
        """What a dump holds beyond BFCL's own scenario keys, put back: `fork(dump(s))` must behave like s.

        `_load_scenario` reads only the keys of BFCL's initial configs, so a dump taken mid-episode
        lost the rest — the file system's working directory, a started engine, the brake pedal's
        force. Plain values (scalars, lists and dicts of them) are set back as they were dumped; the
        working directory is found again by its path in the loaded tree."""
        saved = config.get(RANDOM_KEY)
        rng = getattr(instance, "_random", None)
        if isinstance(rng, random.Random) and isinstance(saved, list) and len(saved) == 3:
            with contextlib.suppress(TypeError, ValueError):
                rng.setstate((saved[0], tuple(saved[1]), saved[2]))
        if self.class_name == "GorillaFileSystem":
            path = config.get("_current_dir")
            if isinstance(path, str) and not config.get("_current_dir_detached"):
                node = _walk_to(instance.root, path)
                if node is not None:
                    instance._current_dir = node
            return
        attrs = vars(instance)
        for key, kind in self._default_types().items():
            # BFCL's loader takes some values as the config gives them: a dump's list where the class
            # keeps a set (`generated_ids`) would break `.add` later
            current = attrs.get(key)
            if kind in (set, frozenset, tuple) and isinstance(current, list):
                attrs[key] = kind(current)
        for key, value in config.items():
            if key not in attrs or key in self._not_state or key.startswith(RUNTIME_PREFIX):
                continue
            current = attrs[key]
            if to_jsonable(current) == value or not (_plain(current) and _plain(value)):
                continue
            if isinstance(current, bool) != isinstance(value, bool):
                continue
            attrs[key] = float(value) if isinstance(current, float) and isinstance(value, int) else copy.deepcopy(value)
        paths = config.get(INT_KEYS_KEY)
        if isinstance(paths, list):
            restore_int_keys(attrs, [p for p in paths if isinstance(p, list) and p and p[0] in attrs])

    # Per-call bookkeeping: the generic way, with a pickle snapshot in place of a deep copy (about 7x
    # cheaper for states holding a random.Random; unpickled only when a call fails and rolls back).
    def begin(self, state: Any, strict: bool) -> Any:
        try:
            snapshot: tuple[str, Any] = ("pickle", pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception:  # an attribute that does not pickle: fall back to a deep copy
            snapshot = ("copy", copy.deepcopy(state))
        return (snapshot, self.dump_state(state))

    def finish(self, state: Any, token: Any, strict: bool) -> tuple[StateDiff, list[Change], str | None]:
        try:
            return super().finish(state, token, strict)
        except FolderCycleError:  # BFCL's cp copies a folder into itself by linking it there: refused, undone
            raise ToolError("cannot copy a folder into itself") from None

    def rollback(self, state: Any, token: Any) -> Any:
        kind, data = token[0]
        return pickle.loads(data) if kind == "pickle" else data

    def dump_state(self, state: Any) -> dict[str, Any]:
        if self.class_name == "GorillaFileSystem":
            out = _dump_file_system(state)
        else:
            attrs = {k: v for k, v in vars(state).items() if k not in self._not_state}
            out = {k: to_jsonable(v) for k, v in attrs.items()}
            paths = int_key_paths(attrs)
            if paths:  # `comments[1]`: JSON keys are strings, the fork needs the int back
                out[INT_KEYS_KEY] = paths
        rng = getattr(state, "_random", None)
        if isinstance(rng, random.Random):
            # where the seeded RNG behind new ids stands: runtime, not state (diffs and verifiers skip
            # `__` keys), but a fork must go on drawing the same ids as the session it came from
            version, words, gauss = rng.getstate()
            out[RANDOM_KEY] = [version, list(words), gauss]
        return out

    def call_arguments(self, call: ParsedCall) -> dict[str, Any]:
        """A parsed call's arguments by name (positional ones named by the method's signature)."""
        tool = self.tools.get(call.name)
        if tool is None:
            if call.args:
                raise ArgumentError([ArgumentProblem(parameter="<arguments>", problem=f"no tool '{call.name}'")])
            return dict(call.kwargs)
        return tool.bind(call.args, call.kwargs)


RANDOM_KEY = RUNTIME_PREFIX + "random"
INT_KEYS_KEY = RUNTIME_PREFIX + "int_keys"  # where a dict of the state has int keys (see `int_key_paths`)


def _plain(value: Any) -> bool:
    """JSON data as Python holds it (no tuple, set or object that a dump would turn into something else)."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def _walk_to(root: Any, path: str) -> Any:
    """The directory of a GorillaFileSystem tree at `path` (`/workspace/document`), or None."""
    names = [n for n in path.split("/") if n]
    if not names or names[0] != getattr(root, "name", None):
        return None
    node = root
    for name in names[1:]:
        child = getattr(node, "contents", {}).get(name)
        if child is None or not hasattr(child, "contents"):
            return None
        node = child
    return node


def factories() -> dict[str, Callable[[], BaseEnvironment]]:
    """One factory per BFCL class that imports here (e.g. MathAPI needs `mpmath`)."""
    if not available():
        return {}
    try:
        modules, _, _ = _backend()
    except ImportError:
        return {}
    out: dict[str, Callable[[], BaseEnvironment]] = {}
    for suite in _SUITES:
        if suite.cls in modules and class_importable(suite.cls):
            out[suite.env] = functools.partial(BFCLEnvironment, suite.cls)
    return out


@functools.cache
def environment(class_name: str, long_context: bool = False) -> BFCLEnvironment:
    """A shared (stateless) environment object per class; sessions on it share nothing."""
    return BFCLEnvironment(class_name, long_context=long_context)
