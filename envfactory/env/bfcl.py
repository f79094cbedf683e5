"""BFCL multi-turn environments through the envfactory contract.

Each of BFCL's multi-turn backend classes (`GorillaFileSystem`, `TravelAPI`, `TradingBot`,
`MessageAPI`, `TicketAPI`, `VehicleControlAPI`, `TwitterAPI`, `MathAPI`) becomes one
`BFCLEnvironment`. Nothing of BFCL is copied: the classes run as installed (`bfcl-eval`), and this
module only adapts them.

- **metadata** comes from BFCL's function docs (`multi_turn_func_doc/*.json`), converted from
  BFCL's schema dialect ("dict", "float", "tuple", "any", `"default": "None"`...) to JSON Schema.
  Each tool's kind (read/write) comes from a hand-checked table (`_SUITES`).
- **state** is an instance of the BFCL class after `_load_scenario(deepcopy(config))`, exactly as
  BFCL's own executor builds it (stateless classes, i.e. `MathAPI`, get no scenario).
- **dump_state** serializes the instance's attributes recursively to JSON data. Left out, because
  they are not scenario state: `_api_description` (a constant string), `_random` (the seeded RNG
  behind ids, tokens and sensor readings: it is deterministic given the seed and the call history,
  dumping its 625-word Mersenne state would make every read of a random sensor look like a write,
  and BFCL's own state checker ignores it), `TravelAPI._flight_cost_lookup` (a cache that
  `book_flight` refills itself) and `File._last_modified` (wall-clock time, ignored by BFCL's
  `File.__eq__`). Private attributes that *are* state stay in (`VehicleControlAPI._brakePedalForce`,
  `_parkingBrakeForce`, `_slopeAngle`: `startEngine` reads them), and `GorillaFileSystem._current_dir`
  is dumped as its path. The file tree is dumped in BFCL's own config format
  (`{"root": {name: {"type": "directory", "contents": {...}}}}`).
- **calls** are validated against the converted schema (strict JSON types: `1.0` is not an integer,
  `true` is not a number), then run as plain method calls. BFCL's results are kept exactly as they
  are (including its `{"error": ...}` dicts); they are only converted to JSON data (tuples → lists,
  sets → sorted lists, non-string keys → strings as `json.dumps` writes them, mpmath/Decimal →
  numbers). An exception raised by a BFCL method becomes a `ToolError` (the session rolls back).
- No `eval`, `exec` or `globals()`: BFCL's ground truth strings are parsed with `ast`
  (`parse_call`, `parse_calls`), and routed to their class with `route` (same rule as BFCL's
  executor, which maps a method name to the last involved class that has it).

BFCL quirks contained here (all isolation fixes; none changes a result BFCL would give a fresh
process): `TwitterAPI.post_tweet` has mutable default arguments (`tags=[]`, `mentions=[]`) that
`mention` later extends, so omitted mutable defaults are passed as fresh copies; arguments are
deep-copied before the call (BFCL stores them in its state); results are converted to fresh JSON
data (BFCL returns references into its state); `MathAPI` sets process-global precisions
(`mpmath.mp.dps`, the decimal context), which are restored after each call; long-context states are
deep-copied after loading (BFCL puts its module-level extension dicts into the state).
"""

from __future__ import annotations

import ast
import copy
import datetime
import decimal
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import pickle
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import BaseModel, ConfigDict, Field

from envfactory.env.environment import BaseEnvironment
from envfactory.env.metadata import Domain, EnvMetadata, ToolKind, ToolSpec
from envfactory.env.session import Session
from envfactory.env.tools import ArgumentError, ArgumentProblem
from envfactory.errors import ScenarioError, ToolError

# ---- the suites: environment names, domains and the hand-checked read/write table -----------------


@dataclass(frozen=True)
class _Suite:
    env: str
    cls: str
    domain: Domain
    read: frozenset[str]
    write: frozenset[str]


def _suite(env: str, cls: str, domain: Domain, *, read: str, write: str) -> _Suite:
    return _Suite(env, cls, domain, frozenset(read.split()), frozenset(write.split()))


# Read = changes no attribute that dump_state keeps (checked by replaying BFCL's ground truth).
# Notes: `cd` is a write (the working directory is session state); `echo` is a write (it writes a
# file when given one); `get_flight_cost` only refills a private cache; `get_current_speed` and the
# outside-temperature tools draw from the RNG, which is not dumped (see the module docstring).
_SUITES: tuple[_Suite, ...] = (
    _suite(
        "bfcl_file_system",
        "GorillaFileSystem",
        "office",
        read="cat diff du find grep ls pwd sort tail wc",
        write="cd cp echo mkdir mv rm rmdir touch",
    ),
    _suite(
        "bfcl_math",
        "MathAPI",
        "utilities",
        read="absolute_value add divide imperial_si_conversion logarithm max_value mean min_value multiply "
        "percentage power round_number si_unit_conversion square_root standard_deviation subtract sum_values",
        write="",
    ),
    _suite(
        "bfcl_message",
        "MessageAPI",
        "office",
        read="get_message_stats get_user_id list_users message_get_login_status search_messages view_messages_sent",
        write="add_contact delete_message message_login send_message",
    ),
    _suite(
        "bfcl_posting",
        "TwitterAPI",
        "lifestyle",
        read="get_tweet get_tweet_comments get_user_stats get_user_tweets list_all_following "
        "posting_get_login_status search_tweets",
        write="authenticate_twitter comment follow_user mention post_tweet retweet unfollow_user",
    ),
    _suite(
        "bfcl_ticket",
        "TicketAPI",
        "office",
        read="get_ticket get_user_tickets ticket_get_login_status",
        write="close_ticket create_ticket edit_ticket logout resolve_ticket ticket_login",
    ),
    _suite(
        "bfcl_trading",
        "TradingBot",
        "finance",
        read="filter_stocks_by_price get_account_info get_available_stocks get_current_time get_order_details "
        "get_order_history get_stock_info get_symbol_by_name get_transaction_history get_watchlist "
        "notify_price_change trading_get_login_status",
        write="add_to_watchlist cancel_order fund_account place_order remove_stock_from_watchlist trading_login "
        "trading_logout withdraw_funds",
    ),
    _suite(
        "bfcl_travel",
        "TravelAPI",
        "travel",
        read="compute_exchange_rate contact_customer_support get_all_credit_cards get_booking_history "
        "get_budget_fiscal_year get_credit_card_balance get_flight_cost get_nearest_airport_by_city "
        "list_all_airports retrieve_invoice travel_get_login_status verify_traveler_information",
        write="authenticate_travel book_flight cancel_booking purchase_insurance register_credit_card set_budget_limit",
    ),
    _suite(
        "bfcl_vehicle",
        "VehicleControlAPI",
        "lifestyle",
        read="check_tire_pressure displayCarStatus display_log estimate_distance estimate_drive_feasibility_by_mileage "
        "find_nearest_tire_shop gallon_to_liter get_current_speed get_outside_temperature_from_google "
        "get_outside_temperature_from_weather_com get_zipcode_based_on_city liter_to_gallon",
        write="activateParkingBrake adjustClimateControl fillFuelTank lockDoors pressBrakePedal releaseBrakePedal "
        "setCruiseControl setHeadlights set_navigation startEngine",
    ),
)
SUITES_BY_CLASS: dict[str, _Suite] = {s.cls: s for s in _SUITES}
SUITES_BY_ENV: dict[str, _Suite] = {s.env: s for s in _SUITES}

# Attributes that are not scenario state (why: see the module docstring).
_NOT_STATE_ALL = frozenset({"_api_description", "_random"})
_NOT_STATE: dict[str, frozenset[str]] = {"TravelAPI": frozenset({"_flight_cost_lookup"})}

# Corrections to BFCL's docs where its own data contradicts them (found by replaying its ground truth).
# TicketAPI documents ticket ids as integers, but some initial configs use string ids ("ticket_001",
# multi_turn_base_173) and the ground truth passes them: either is accepted.
_INPUT_PATCHES: dict[tuple[str, str], dict[str, Any]] = {
    ("TicketAPI", "ticket_id"): {"type": ["integer", "string"]},
}
# Tools that return None on success (documented as a dict): their output may be null.
_NULLABLE_OUTPUT: dict[str, frozenset[str]] = {"GorillaFileSystem": frozenset({"mkdir", "touch", "echo"})}
# Tools whose documented `response` does not describe what the method returns (a list, fields of
# other types, a list in place of the error dict), so they get no output schema rather than a wrong one.
_UNDOCUMENTED_RESPONSES: dict[str, frozenset[str]] = {
    "MessageAPI": frozenset({"send_message"}),  # message_id is {"new_id": n}, documented as an integer
    "TwitterAPI": frozenset({"get_user_tweets", "search_tweets", "get_tweet_comments"}),  # lists
    "TicketAPI": frozenset({"get_user_tickets", "get_ticket"}),  # a list; ticket fields as the config has them
    "TradingBot": frozenset({"get_watchlist", "get_order_history", "get_transaction_history"}),  # lists if logged out
    "TravelAPI": frozenset({"list_all_airports"}),  # a list of codes
}


# ---- locating the installed package ------------------------------------------------------------------


def available() -> bool:
    """Whether `bfcl-eval` is installed (its multi-turn classes and data)."""
    try:
        return importlib.util.find_spec("bfcl_eval") is not None
    except (ImportError, ValueError):
        return False


def _backend() -> tuple[dict[str, str], dict[str, str], list[str]]:
    """BFCL's own maps: class → module, class → func doc file; and its stateless classes."""
    from bfcl_eval.constants import executable_backend_config as cfg

    return dict(cfg.CLASS_FILE_PATH_MAPPING), dict(cfg.MULTI_TURN_FUNC_DOC_FILE_MAPPING), list(cfg.STATELESS_CLASSES)


def data_dir() -> Path:
    """The installed package's data folder (test entries, ground truth, function docs)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or spec.origin is None:
        raise ScenarioError("bfcl-eval is not installed")
    return Path(spec.origin).parent / "data"


def _version_prefix() -> str:
    from bfcl_eval.constants.category_mapping import VERSION_PREFIX

    return str(VERSION_PREFIX)


def bfcl_version() -> str:
    try:
        return importlib.metadata.version("bfcl-eval")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def load_class(class_name: str) -> type[Any]:
    """The BFCL class named `class_name` (raises ImportError when its module or a dependency is missing)."""
    modules, _, _ = _backend()
    if class_name not in modules:
        raise ImportError(f"bfcl-eval has no multi-turn class '{class_name}'")
    cls = getattr(importlib.import_module(modules[class_name]), class_name)
    assert isinstance(cls, type)
    return cls


@functools.cache
def class_importable(class_name: str) -> bool:
    """Whether the class and its dependencies import here (MathAPI needs `mpmath`)."""
    try:
        load_class(class_name)
    except ImportError:
        return False
    return True


@functools.cache
def func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs for one class, as shipped in `multi_turn_func_doc/`."""
    _, doc_files, _ = _backend()
    path = data_dir() / "multi_turn_func_doc" / doc_files[class_name]
    lines = path.read_text(encoding="utf-8").splitlines()
    return tuple(json.loads(line) for line in lines if line.strip())


# ---- schema conversion -----------------------------------------------------------------------------

_TYPE_ALIASES = {
    "dict": "object",
    "object": "object",
    "float": "number",
    "number": "number",
    "double": "number",
    "int": "integer",
    "integer": "integer",
    "long": "integer",
    "str": "string",
    "string": "string",
    "char": "string",
    "bool": "boolean",
    "boolean": "boolean",
    "array": "array",
    "list": "array",
    "tuple": "array",
    "set": "array",
    "null": "null",
    "none": "null",
    "nonetype": "null",
}
_ANY_TYPES = {"any", "anytype", "mixed", ""}
_KEEP = ("description", "enum", "minimum", "maximum", "minItems", "maxItems", "pattern", "format", "const")


def _convert_type(t: Any) -> str | list[str] | None:
    if isinstance(t, list):
        out: list[str] = []
        for x in t:
            c = _convert_type(x)
            if c is None:
                return None  # one alternative is "any": the union accepts anything
            out.extend([c] if isinstance(c, str) else c)
        return sorted(set(out)) if len(set(out)) > 1 else (out[0] if out else None)
    if not isinstance(t, str):
        return None
    key = t.strip().lower()
    if key in _ANY_TYPES:
        return None
    if key not in _TYPE_ALIASES:
        raise ValueError(f"unknown BFCL type {t!r}")
    return _TYPE_ALIASES[key]


def convert_schema(schema: Any) -> dict[str, Any]:
    """BFCL's schema dialect → JSON Schema (2020-12): dict→object, float→number, tuple→array, any→{}.

    `"default": "None"` (BFCL's way to say the Python default is None) is dropped: such a
    parameter is optional and is omitted, not sent as null. Other defaults are kept as annotations.
    Non-schema keys are dropped.
    """
    if not isinstance(schema, dict):
        return {}
    out: dict[str, Any] = {}
    t = _convert_type(schema.get("type"))
    if t is not None:
        out["type"] = t
    for k in _KEEP:
        if k in schema:
            out[k] = copy.deepcopy(schema[k])
    if "properties" in schema and isinstance(schema["properties"], dict):
        out["properties"] = {str(k): convert_schema(v) for k, v in schema["properties"].items()}
    if isinstance(schema.get("required"), list):
        out["required"] = [r for r in schema["required"] if r in out.get("properties", {})]
    if "items" in schema:
        items = schema["items"]
        if isinstance(items, list):  # tuple-style items
            out["prefixItems"] = [convert_schema(s) for s in items]
        else:
            out["items"] = convert_schema(items)
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = convert_schema(schema["additionalProperties"])
    elif isinstance(schema.get("additionalProperties"), bool):
        out["additionalProperties"] = schema["additionalProperties"]
    for k in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(k), list):
            out[k] = [convert_schema(s) for s in schema[k]]
    if "default" in schema and schema["default"] not in ("None", None):
        out["default"] = copy.deepcopy(schema["default"])
    return out


def _parameters_schema(doc: dict[str, Any]) -> dict[str, Any]:
    params = convert_schema(doc.get("parameters") or {"type": "dict", "properties": {}})
    out: dict[str, Any] = {"type": "object", "properties": params.get("properties", {})}
    if params.get("required"):
        out["required"] = params["required"]
    return out


def _strict_type_checker() -> Any:
    base = jsonschema.Draft202012Validator.TYPE_CHECKER
    return base.redefine_many(
        {
            "integer": lambda _c, x: isinstance(x, int) and not isinstance(x, bool),
            "number": lambda _c, x: isinstance(x, int | float) and not isinstance(x, bool),
        }
    )


# JSON Schema 2020-12 with strict JSON types: 1.0 is not an integer, true is not a number
StrictValidator: Any = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, type_checker=_strict_type_checker()
)


# ---- JSON conversion -------------------------------------------------------------------------------


def _json_key(k: Any) -> str:
    """A dict key as `json.dumps` writes it."""
    if isinstance(k, str):
        return k
    if k is True:
        return "true"
    if k is False:
        return "false"
    if k is None:
        return "null"
    if isinstance(k, int | float):
        return json.dumps(k)
    return str(k)


def _sort_key(x: Any) -> str:
    return json.dumps(x, sort_keys=True, default=str)


def to_jsonable(value: Any, _seen: frozenset[int] = frozenset()) -> Any:
    """`value` as fresh JSON data (shares no object with `value`).

    dict keys become strings as `json.dumps` writes them (a key that would then collide with an
    existing string key is written `"<type>:<key>"`); tuples → lists; sets → sorted lists;
    datetimes → ISO strings; Decimal and mpmath numbers → floats (mpmath at the precision in force,
    the one BFCL's call set); other objects → their public attributes.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        str_keys = {k for k in value if isinstance(k, str)}
        for k, v in value.items():
            key = _json_key(k)
            if not isinstance(k, str) and (key in str_keys or key in out):
                key = f"{type(k).__name__}:{key}"
            out[key] = to_jsonable(v, _seen)
        return out
    if isinstance(value, list | tuple):
        return [to_jsonable(v, _seen) for v in value]
    if isinstance(value, set | frozenset):
        items = [to_jsonable(v, _seen) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return sorted(items, key=_sort_key)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if type(value).__module__.startswith("mpmath"):
        try:
            return float(str(value))
        except (TypeError, ValueError):
            return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    fs = _fs_dump(value, _seen)
    if fs is not None:
        return fs
    if hasattr(value, "__dict__"):
        if id(value) in _seen:
            return f"<cycle: {type(value).__name__}>"
        seen = _seen | {id(value)}
        return {k: to_jsonable(v, seen) for k, v in vars(value).items() if not k.startswith("_")}
    return str(value)


def _fs_types() -> tuple[type[Any], type[Any]] | None:
    mod = sys.modules.get("bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system")
    if mod is None:
        return None
    return mod.Directory, mod.File


def _fs_dump(value: Any, seen: frozenset[int]) -> dict[str, Any] | None:
    """GorillaFileSystem's Directory/File in BFCL's config format (no parent links, no mtimes)."""
    types = _fs_types()
    if types is None:
        return None
    directory, file = types
    if isinstance(value, file):
        return {"type": "file", "content": to_jsonable(value.content, seen)}
    if isinstance(value, directory):
        return {"type": "directory", "contents": {str(k): to_jsonable(v, seen) for k, v in value.contents.items()}}
    return None


def _find_path(root: Any, target: Any) -> list[str] | None:
    """Names from `root` down to `target` (by identity), or None if `target` is not in the tree."""
    directory, _ = _fs_types() or (None, None)
    stack: list[tuple[Any, list[str]]] = [(root, [root.name])]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        for name, child in node.contents.items():
            if directory is not None and isinstance(child, directory):
                stack.append((child, [*path, str(name)]))
    return None


def _dump_file_system(state: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in vars(state).items():
        if key in _NOT_STATE_ALL:
            continue
        if key == "root":
            out["root"] = {value.name: to_jsonable(value)}
        elif key == "_current_dir":
            path = _find_path(state.root, value)
            if path is None:
                # BFCL's `mv` of a directory leaves its children's parent links on the old object;
                # `cd ..` from there reaches a directory that is no longer in the tree.
                chain, node = [], value
                while node is not None:
                    chain.append(node.name)
                    node = node.parent
                out["_current_dir"] = "/" + "/".join(reversed(chain))
                out["_current_dir_detached"] = True
            else:
                out["_current_dir"] = "/" + "/".join(path)
        else:
            out[key] = to_jsonable(value)
    return out


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


# ---- tools and environments -------------------------------------------------------------------------


def _split_description(text: str) -> tuple[str, str]:
    """BFCL writes "<class description> Tool description: <tool description>"."""
    marker = "Tool description:"
    if marker in text:
        head, tail = text.split(marker, 1)
        return head.strip(), tail.strip()
    return "", text.strip()


def _problem_for(err: Any) -> ArgumentProblem:
    where = ".".join(str(p) for p in err.absolute_path) or "<arguments>"
    if err.validator == "type":
        expected = err.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        got = "boolean" if isinstance(err.instance, bool) else type(err.instance).__name__
        names = {"int": "integer", "float": "number", "str": "string", "list": "array", "dict": "object"}
        problem = f"must be of type {expected} (got {names.get(got, got)} {err.instance!r})"
    else:
        problem = err.message
    return ArgumentProblem(parameter=where, problem=problem)


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
        return instance

    # Per-call bookkeeping: the generic way, with a pickle snapshot in place of a deep copy (about 7x
    # cheaper for states holding a random.Random; unpickled only when a call fails and rolls back).
    def begin(self, state: Any, strict: bool) -> Any:
        try:
            snapshot: tuple[str, Any] = ("pickle", pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception:  # an attribute that does not pickle: fall back to a deep copy
            snapshot = ("copy", copy.deepcopy(state))
        return (snapshot, self.dump_state(state))

    def rollback(self, state: Any, token: Any) -> Any:
        kind, data = token[0]
        return pickle.loads(data) if kind == "pickle" else data

    def dump_state(self, state: Any) -> dict[str, Any]:
        if self.class_name == "GorillaFileSystem":
            return _dump_file_system(state)
        return {k: to_jsonable(v) for k, v in vars(state).items() if k not in self._not_state}

    def call_arguments(self, call: ParsedCall) -> dict[str, Any]:
        """A parsed call's arguments by name (positional ones named by the method's signature)."""
        tool = self.tools.get(call.name)
        if tool is None:
            if call.args:
                raise ArgumentError([ArgumentProblem(parameter="<arguments>", problem=f"no tool '{call.name}'")])
            return dict(call.kwargs)
        return tool.bind(call.args, call.kwargs)


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


# ---- ground-truth call strings ---------------------------------------------------------------------


class CallSyntaxError(ValueError):
    """A string that is not a plain function call with literal arguments."""


@dataclass(frozen=True)
class ParsedCall:
    """`name(*args, **kwargs)` with literal arguments; `name` may be dotted (`Class.method`)."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def method(self) -> str:
        return self.name.rsplit(".", 1)[-1]


def _call_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_call_name(node.value)}.{node.attr}"
    raise CallSyntaxError(f"not a function name: {ast.unparse(node)}")


def _literal(node: ast.expr, text: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise CallSyntaxError(f"argument is not a literal: {ast.unparse(node)!s} in {text!r}") from None


def _parse_call_node(node: ast.expr, text: str) -> ParsedCall:
    if not isinstance(node, ast.Call):
        raise CallSyntaxError(f"not a function call: {text!r}")
    name = _call_name(node.func)
    args = []
    for a in node.args:
        if isinstance(a, ast.Starred):
            raise CallSyntaxError(f"*args are not allowed: {text!r}")
        args.append(_literal(a, text))
    kwargs: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise CallSyntaxError(f"**kwargs are not allowed: {text!r}")
        if kw.arg in kwargs:
            raise CallSyntaxError(f"argument '{kw.arg}' given twice: {text!r}")
        kwargs[kw.arg] = _literal(kw.value, text)
    return ParsedCall(name=name, args=tuple(args), kwargs=kwargs)


def _parse_expr(text: str) -> ast.expr:
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise CallSyntaxError(f"invalid call syntax: {text!r} ({e.msg})") from None


def parse_call(text: str) -> ParsedCall:
    """Parse one call string such as `cd(folder='document')` with `ast` (never evaluated)."""
    return _parse_call_node(_parse_expr(text), text)


def parse_calls(text: str) -> list[ParsedCall]:
    """Parse one call or a Python list/tuple of calls (`[f(a=1), g()]`), as BFCL's models write them."""
    node = _parse_expr(text)
    if isinstance(node, ast.List | ast.Tuple):
        return [_parse_call_node(n, text) for n in node.elts]
    return [_parse_call_node(node, text)]


def route(method: str, involved_classes: list[str]) -> str | None:
    """The involved class that runs `method`: the last one that has it, as in BFCL's executor."""
    owner = None
    for class_name in involved_classes:
        if not class_importable(class_name):
            continue
        env = environment(class_name)
        if method in env.tools:
            owner = class_name
    return owner


# ---- test entries ----------------------------------------------------------------------------------


class BFCLEntry(BaseModel):
    """One multi-turn test entry with its ground truth (one list of call strings per turn)."""

    model_config = ConfigDict(extra="allow")

    id: str
    question: list[list[dict[str, Any]]]
    initial_config: dict[str, Any] = Field(default_factory=dict)
    involved_classes: list[str]
    ground_truth: list[list[str]] = Field(default_factory=list)
    path: list[str] = Field(default_factory=list)
    excluded_function: list[str] = Field(default_factory=list)

    def config_for(self, class_name: str) -> dict[str, Any]:
        """The initial config of one involved class (`{}` when the entry gives none), as BFCL reads it."""
        return dict(self.initial_config.get(class_name, {}))

    def sessions(self, *, long_context: bool = False, strict: bool = False) -> dict[str, Session]:
        """One fresh Session per involved class, forked from this entry's initial config."""
        return {
            c: Session.fork(environment(c, long_context), self.config_for(c), strict=strict)
            for c in self.involved_classes
        }


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read: {e.strerror}") from None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_entries(category: str = "multi_turn_base") -> list[BFCLEntry]:
    """BFCL's entries of a multi-turn category (e.g. `multi_turn_base`) joined with their ground truth."""
    name = f"{_version_prefix()}_{category}.json"
    entries = _read_jsonl(data_dir() / name)
    answers_path = data_dir() / "possible_answer" / name
    answers = {a["id"]: a.get("ground_truth", []) for a in _read_jsonl(answers_path)} if answers_path.exists() else {}
    return [BFCLEntry.model_validate({**e, "ground_truth": answers.get(e["id"], [])}) for e in entries]
