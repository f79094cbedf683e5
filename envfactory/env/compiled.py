"""Compiled environments: an API spec's resources and operations as data, interpreted by this module.

`envfactory.compiler` turns a real OpenAPI document into a `CompiledPlan` — resources (collections of
records keyed by id, nested under a parent where the paths say so) and operations with the semantics
their method and shape imply: create, read, list (query parameters that name record fields are
filters), update, delete, and a transition where the record schema names the states. This module runs
such a plan under the environment contract: the state is plain JSON (collections, id counters, a clock),
arguments are validated strictly against each tool's JSON Schema, failures are typed tool errors
(`not_found`, `conflict`, `invalid_arguments`), ids come from counters and "now" from the clock, so
replays are exact and `fork(dump(s))` is `s`.

No string of a spec ever becomes Python source: names are dictionary keys, schemas are checked by
`jsonschema`, and the only code that runs is this module's. A compiled environment therefore needs no
sandbox and no trust: it runs in-process, at in-process speed.

The folder of a compiled environment holds `compiled.json` (the plan), `metadata.json` (derived from
the plan and checked against it like a native environment's) and `scenarios/*.json`.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticSerializationError, from_json, to_json

from envfactory.env.diff import StateDiff, diff_states
from envfactory.env.environment import BaseEnvironment, contract_problems
from envfactory.env.json_schema import pattern_budget, schema_problem, timed_validator
from envfactory.env.metadata import Domain, EnvMetadata, ToolKind, ToolSpec
from envfactory.env.state import DEFAULT_CLOCK, Change
from envfactory.env.tools import ArgumentError, ArgumentProblem
from envfactory.errors import ConflictError, ContractError, EnvLoadError, NotFoundError, ScenarioError, ToolError

PLAN_FILE = "compiled.json"
RESERVED = frozenset({"clock", "counters"})  # top-level keys of the state that are not collections
_RESOURCE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,59}$")
_ID_PREFIX = re.compile(r"^[A-Z][A-Z0-9]{0,9}$")
_CHECKED_CONFIGS = 256  # configs whose checked state a compiled environment keeps...
_CHECKED_RECORDS = 50_000  # ...records known to fit their schema...
_CHECKED_BYTES = 32 * 2**20  # ...and at most about this much data in each (a state of 1 MB strings is no 8 GB)
_LARGE_STATE = 2**20  # JSON bytes of a state past which an environment copies states by structure

Semantics = Literal["create", "read", "list", "update", "upsert", "delete", "transition"]
KIND: dict[str, ToolKind] = {
    "create": "write",
    "read": "read",
    "list": "read",
    "update": "write",
    "upsert": "write",
    "delete": "write",
    "transition": "write",
}


class Resource(BaseModel):
    """A collection of records keyed by id (`pets`), possibly nested under a parent (`owners`)."""

    model_config = ConfigDict(extra="forbid")

    name: str  # the collection's key in the state
    label: str  # what a person calls one record ("pet")
    id_field: str  # the record field that holds its id
    id_type: Literal["string", "integer"] = "string"
    id_prefix: str = "ID"  # string ids: PREFIX-0001
    parent: str | None = None
    parent_field: str | None = None  # the record field holding its parent's id
    scope_fields: list[str] = Field(default_factory=list)  # namespace keys from the path (no resource of their own)
    record_schema: dict[str, Any]  # JSON Schema of one record


class Operation(BaseModel):
    """One tool: what it does to which resource, and which argument feeds what."""

    model_config = ConfigDict(extra="forbid")

    spec: ToolSpec
    semantics: Semantics
    resource: str
    method: str  # where it came from in the spec
    route: str
    id_param: str | None = None  # the argument carrying the record's id (read/update/delete/transition)
    parents: list[tuple[str, str]] = Field(default_factory=list)  # (argument, resource), outermost first
    scopes: list[tuple[str, str]] = Field(default_factory=list)  # (argument, record field): namespace keys
    fields: dict[str, str] = Field(default_factory=dict)  # argument -> record field (body fields; list filters)
    limit_param: str | None = None
    offset_param: str | None = None
    page_param: str | None = None
    status_field: str | None = None  # transition: the field that holds the state...
    target: Any = None  # ...and the state it moves to


class Skipped(BaseModel):
    """An operation of the spec left out, with the reason (never a tool that pretends)."""

    method: str
    route: str
    reason: str


class CompiledPlan(BaseModel):
    """Everything a compiled environment is: the data `CompiledEnvironment` interprets."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["envfactory-compiled/1"] = "envfactory-compiled/1"
    name: str
    description: str
    domain: Domain
    source: str  # e.g. corpus:<spec id>
    provenance: dict[str, Any] = Field(default_factory=dict)
    clock: datetime = DEFAULT_CLOCK
    resources: list[Resource]
    operations: list[Operation] = Field(min_length=1)
    skipped: list[Skipped] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> CompiledPlan:
        names = {r.name for r in self.resources}
        if len(names) != len(self.resources):
            raise ValueError("two resources share a name")
        if names & RESERVED:
            raise ValueError(f"a resource may not be named {sorted(names & RESERVED)[0]!r}")
        for r in self.resources:
            if r.parent is not None and (r.parent not in names or r.parent_field is None):
                raise ValueError(f"resource '{r.name}': unknown parent '{r.parent}' or no parent field")
        tools = [o.spec.name for o in self.operations]
        if len(set(tools)) != len(tools):
            raise ValueError("two operations share a tool name")
        for o in self.operations:
            if o.resource not in names:
                raise ValueError(f"tool '{o.spec.name}': unknown resource '{o.resource}'")
            if o.spec.kind != KIND[o.semantics]:
                raise ValueError(f"tool '{o.spec.name}': a {o.semantics} is a {KIND[o.semantics]} tool")
            params = o.spec.parameters
            used = [a for a in (o.id_param, o.limit_param, o.offset_param, o.page_param) if a is not None]
            used += [a for a, _ in o.parents] + [a for a, _ in o.scopes] + list(o.fields)
            unknown = [a for a in used if a not in params]
            if unknown:
                raise ValueError(f"tool '{o.spec.name}': argument '{unknown[0]}' is not in its input schema")
            # the interpreter reads the record's id and its path (parents, scopes) on every call: a call without
            # one must be refused by the input schema, not reach the semantics
            path = [a for a in (o.id_param, *(a for a, _ in o.parents), *(a for a, _ in o.scopes)) if a is not None]
            optional = [a for a in path if a not in o.spec.required]
            if optional:
                raise ValueError(
                    f"tool '{o.spec.name}': argument '{optional[0]}' names the record or its path, so its input "
                    "schema must require it"
                )
            if o.semantics in ("read", "update", "upsert", "delete", "transition") and o.id_param is None:
                raise ValueError(f"tool '{o.spec.name}': a {o.semantics} needs the id argument")
        return self


def validator_for(schema: dict[str, Any]) -> Draft202012Validator:
    """A validator for a plan's schema: its patterns come from a spec (or a hand-edited compiled.json) and run
    in this process, so they are matched under a time limit (`envfactory.env.json_schema`)."""
    return timed_validator(schema)


def schema_problems(validator: Draft202012Validator, value: Any, root: str) -> list[ArgumentProblem]:
    out = []
    with pattern_budget():
        errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))[:5]
    for err in errors:
        where = ".".join(str(p) for p in err.absolute_path) or root
        if err.validator == "required":
            missing = str(err.message).split("'")[1] if "'" in err.message else root
            out.append(ArgumentProblem(parameter=missing, problem="required parameter is missing"))
        elif err.validator == "additionalProperties" and not err.absolute_path:
            out.append(ArgumentProblem(parameter=root, problem=str(err.message)[:300]))
        else:
            out.append(ArgumentProblem(parameter=where, problem=str(err.message)[:300]))
    return out


class CompiledTool:
    """A tool of a compiled environment: schema validation, then the operation's semantics on the state."""

    def __init__(self, env: CompiledEnvironment, op: Operation) -> None:
        self.env, self.op = env, op
        self.name = op.spec.name
        self.kind: ToolKind = op.spec.kind
        schema = {**op.spec.input_schema, "additionalProperties": False}
        self.validator = validator_for(schema)

    def parse_args(self, args: dict[str, Any]) -> dict[str, Any]:
        problems = schema_problems(self.validator, args, "<arguments>")
        if problems:
            raise ArgumentError(problems)
        unreadable = [p for name, value in args.items() if (p := _unreadable(value, name)) is not None]
        if unreadable:
            raise ArgumentError(unreadable[:5])
        kwargs = dict(args)
        # paging that starts where leaving it out starts (offset 0, page 1) is read as left out: the same call,
        # as a reward compares calls by what the tool reads (a policy that says `page: 1` scored 0 against one
        # that did not)
        given = [(p, start) for p, start in ((self.op.offset_param, 0), (self.op.page_param, 1)) if p in kwargs]
        if len(given) == 1:  # (with both, the offset wins: dropping one would let the other count)
            param, start = given[0]
            if type(kwargs[param]) in (int, float) and kwargs[param] == start:
                del kwargs[param]
        return kwargs

    def invoke(self, state: Any, kwargs: dict[str, Any]) -> Any:
        return self.env.run(self.op, state, kwargs)


_LONG_INT_BITS = 4_000  # past this, whether str() can write the number is asked (Python's limit: 4,300 digits)


def _unreadable(value: Any, where: str) -> ArgumentProblem | None:
    """What in a valid argument no state can hold: a string with a lone surrogate (what the server's body parser
    keeps, and no JSON text can carry), an integer too long to write as digits (ids are keyed by their text)."""
    t = type(value)
    if t is str:
        if not value.isascii() and not _encodes(value):
            return ArgumentProblem(parameter=where, problem="the text holds a lone surrogate, which is not UTF-8")
    elif t is int:
        if value.bit_length() > _LONG_INT_BITS:
            try:
                str(value)
            except ValueError:
                return ArgumentProblem(parameter=where, problem="the integer has too many digits to be read")
    elif t is dict:
        for k, v in value.items():
            problem = _unreadable(k, where) or _unreadable(v, f"{where}.{k}" if _encodes(str(k)) else where)
            if problem is not None:
                return problem
    elif t is list:
        for i, v in enumerate(value):
            problem = _unreadable(v, f"{where}[{i}]")
            if problem is not None:
                return problem
    return None


class CompiledEnvironment(BaseEnvironment):
    """An environment whose tools are a `CompiledPlan`'s operations, interpreted here."""

    def __init__(self, plan: CompiledPlan, folder: Path | None = None) -> None:
        self.plan = plan
        self.name = plan.name
        self.folder = folder
        self.resources = {r.name: r for r in plan.resources}
        self.children = {r.name: [c.name for c in plan.resources if c.parent == r.name] for r in plan.resources}
        self.record_validators = {r.name: validator_for(r.record_schema) for r in plan.resources}
        self.tools = {o.spec.name: CompiledTool(self, o) for o in plan.operations}
        self._checked: dict[bytes, bytes] = {}  # config JSON -> checked state JSON
        self._checked_bytes = 0
        self._met: set[int] = set()  # hashes of configs forked once (a second fork keeps the checked state)
        self._valid_records: set[tuple[str, Any]] = set()  # (collection, record JSON or `_shape`) fitting the schema
        self._valid_bytes = 0  # about what those records hold
        # States are copied through JSON (fast for the usual states: pydantic-core does it) until one is past
        # _LARGE_STATE; from then on by structure (`_copy`), which costs the same for a state of 1 MB strings
        # as for one of short ones, where JSON scans and copies every byte of every copy.
        self.by_structure = False
        self._metadata = self.derived_metadata()

    # ---- metadata ----------------------------------------------------------------------------
    def derived_metadata(self) -> EnvMetadata:
        p = self.plan
        return EnvMetadata(
            name=p.name,
            description=p.description,
            domain=p.domain,
            source=p.source,
            tools=[o.spec for o in p.operations],
        )

    @property
    def metadata(self) -> EnvMetadata:
        return self._metadata

    def attach_metadata(self, meta: EnvMetadata, source: str) -> None:
        problems = contract_problems(meta, self.derived_metadata(), source)
        if problems:
            raise ContractError(self.name, problems)
        self._metadata = meta

    def binding(self, tool: str) -> CompiledTool | None:
        return self.tools.get(tool)

    # ---- state ---------------------------------------------------------------------------------
    def empty_state(self) -> dict[str, Any]:
        return {
            "clock": self.plan.clock.isoformat(),
            "counters": {},
            **{r.name: {} for r in self.plan.resources},
        }

    def new_state(self, config: dict[str, Any] | None, source: str = "<config>") -> dict[str, Any]:
        """A fresh state from a dump: every record checked against its resource's schema and references.

        A config forked again (a scenario, a task's initial state) is checked once: its checked state is kept
        and copied, so a session costs a JSON round trip, not a schema validation per record. A record met
        before (in another config) was checked then. (Large states: see `by_structure`.)"""
        try:
            if not self.by_structure:
                raw = to_json(config or {})
                if len(raw) <= _LARGE_STATE:
                    return self._from_json(raw, source)
                self.by_structure = True
            data = _copy(config or {})
        except PydanticSerializationError:
            raise ScenarioError(f"{source}: a state must be JSON") from None
        return self._check(data, source)

    def _from_json(self, raw: bytes, source: str) -> dict[str, Any]:
        checked = self._checked.get(raw)
        if checked is not None:
            return from_json(checked)
        state = self._check(from_json(raw), source)
        key = hash(raw)
        if key not in self._met:  # kept from its second fork on: most dumps (a session's, mid-run) never come back
            if len(self._met) >= 4 * _CHECKED_CONFIGS:
                self._met.clear()
            self._met.add(key)
            return state
        checked = to_json(state)
        size = len(raw) + len(checked)
        while self._checked and (len(self._checked) >= _CHECKED_CONFIGS or self._checked_bytes + size > _CHECKED_BYTES):
            oldest = next(iter(self._checked), b"")
            dropped = self._checked.pop(oldest, None)
            if dropped is not None:  # (another thread may have dropped it first)
                self._checked_bytes -= len(oldest) + len(dropped)
        self._checked[raw] = checked
        self._checked_bytes += size
        return state

    def copy_data(self, value: Any) -> Any:
        """A deep copy of JSON data (a state, a result): through JSON, or by structure (`by_structure`)."""
        if not self.by_structure:
            raw = to_json(value)
            if len(raw) <= _LARGE_STATE:
                return from_json(raw)
            self.by_structure = True
        return _copy(value)

    def _check(self, data: Any, source: str) -> dict[str, Any]:
        state = self.empty_state()
        if not isinstance(data, dict):
            raise ScenarioError(f"{source}: a state must be a JSON object")
        unknown = sorted(set(data) - set(state))
        if unknown:
            raise ScenarioError(f"{source}: no collection '{str(unknown[0])[:80]}' in '{self.name}'")
        if "clock" in data:
            try:
                state["clock"] = datetime.fromisoformat(str(data["clock"])).isoformat()
            except ValueError:
                raise ScenarioError(f"{source}: 'clock' is not an ISO date-time") from None
        counters = data.get("counters", {})
        if not isinstance(counters, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in counters.items()
        ):
            raise ScenarioError(f"{source}: 'counters' must map names to counts")
        state["counters"] = dict(counters)
        for r in self.plan.resources:
            coll = data.get(r.name, {})
            if not isinstance(coll, dict):
                raise ScenarioError(f"{source}: '{r.name}' must be an object of records keyed by id")
            for key, record in coll.items():
                where = f"{r.name}.{key}"
                if not isinstance(record, dict):
                    raise ScenarioError(f"{source}: {where} must be an object")
                if _key(record.get(r.id_field)) != key:
                    raise ScenarioError(f"{source}: {where} holds id {record.get(r.id_field)!r}, not its key")
                # a record met before (in another config) was checked then
                seen = (r.name, _shape(record) if self.by_structure else to_json(record))
                if seen in self._valid_records:
                    continue
                problems = schema_problems(self.record_validators[r.name], record, where)
                if problems:
                    raise ScenarioError(f"{source}: {where}: {problems[0].parameter}: {problems[0].problem}")
                if len(self._valid_records) >= _CHECKED_RECORDS or self._valid_bytes > _CHECKED_BYTES:
                    self._valid_records.clear()
                    self._valid_bytes = 0
                self._valid_records.add(seen)
                self._valid_bytes += sum(len(v) for v in record.values() if type(v) is str)
            state[r.name] = coll
        for r in self.plan.resources:  # references: a child names a parent that exists
            if r.parent is None or r.parent_field is None:
                continue
            for key, record in state[r.name].items():
                if _key(record.get(r.parent_field)) not in state[r.parent]:
                    raise ScenarioError(f"{source}: {r.name}.{key}.{r.parent_field} names no record of '{r.parent}'")
        return state

    def dump_state(self, state: Any) -> dict[str, Any]:
        return self.copy_data(state)

    # A call's bookkeeping: the state before it as a copy of its top level and of each collection, sharing the
    # records. That is enough because `run` never changes a record in place: it adds, replaces and deletes
    # records of collections, and moves counters — so the copy is the state before, restoring it is handing
    # the copy back, and the diff skips every record the call did not touch (the same object on both sides).
    def begin(self, state: Any, strict: bool) -> Any:
        return {k: dict(v) if type(v) is dict else v for k, v in state.items()}

    def finish(self, state: Any, token: Any, strict: bool) -> tuple[StateDiff, list[Change], str | None]:
        diff = diff_states(token, state)
        return diff, _changes(diff), None

    def rollback(self, state: Any, token: Any) -> Any:
        return token

    # ---- the semantics ---------------------------------------------------------------------------
    def _get(self, state: dict[str, Any], resource: str, key: Any) -> dict[str, Any]:
        r = self.resources[resource]
        record = state[resource].get(_key(key))
        if record is None:
            raise NotFoundError(f"no {r.label} with id '{key}'", collection=resource, id=_key(key))
        return record

    def _check_parents(self, op: Operation, state: dict[str, Any], args: dict[str, Any]) -> None:
        """Every parent id exists, and each is the child of the one before it."""
        previous: tuple[str, Any] | None = None
        for arg, resource in op.parents:
            record = self._get(state, resource, args[arg])
            r = self.resources[resource]
            if (
                previous is not None
                and r.parent == previous[0]
                and r.parent_field is not None
                and _key(record.get(r.parent_field)) != _key(previous[1])
            ):
                owner = self.resources[previous[0]].label
                raise NotFoundError(
                    f"{r.label} '{args[arg]}' does not belong to {owner} '{previous[1]}'",
                    collection=resource,
                    id=_key(args[arg]),
                )
            previous = (resource, args[arg])

    def _in_parent(self, op: Operation, r: Resource, record: dict[str, Any], args: dict[str, Any]) -> bool:
        """The record sits where the path puts it: under the parent named, in the scopes named."""
        if any(_key(record.get(f)) != _key(args[a]) for a, f in op.scopes):
            return False
        if not op.parents or r.parent_field is None or op.parents[-1][1] != r.parent:
            return True
        arg, _ = op.parents[-1]
        return _key(record.get(r.parent_field)) == _key(args[arg])

    def new_id(self, state: dict[str, Any], r: Resource) -> Any:
        counters: dict[str, int] = state["counters"]
        n = counters.get(r.id_prefix, 0)
        while True:
            n += 1
            key: Any = n if r.id_type == "integer" else f"{r.id_prefix}-{n:04d}"
            if _key(key) not in state[r.name]:
                break
        counters[r.id_prefix] = n
        return key

    def _check_record(self, r: Resource, record: dict[str, Any]) -> None:
        problems = schema_problems(self.record_validators[r.name], record, r.label)
        if problems:
            raise ToolError(f"invalid {r.label}: {problems[0].parameter}: {problems[0].problem}")

    def run(self, op: Operation, state: dict[str, Any], args: dict[str, Any]) -> Any:
        r = self.resources[op.resource]
        self._check_parents(op, state, args)
        if op.semantics == "list":
            return self._list(op, r, state, args)
        if op.semantics == "create":
            return self._create(op, r, state, args)
        assert op.id_param is not None
        if op.semantics == "upsert" and _key(args[op.id_param]) not in state[r.name]:
            return self._create(op, r, state, args, key=args[op.id_param])
        record = self._get(state, r.name, args[op.id_param])
        if not self._in_parent(op, r, record, args):
            raise NotFoundError(
                f"no {r.label} with id '{args[op.id_param]}' there (it is filed elsewhere)",
                collection=r.name,
                id=_key(args[op.id_param]),
            )
        if op.semantics == "read":
            return self.copy_data(record)
        key = _key(args[op.id_param])
        if op.semantics == "delete":
            removed = self._delete(state, r, key)
            out = {"deleted": True, r.id_field: record[r.id_field]}
            return out | ({"also_deleted": removed} if removed else {})
        if op.semantics == "transition":
            assert op.status_field is not None
            if record.get(op.status_field) == op.target:
                raise ConflictError(f"{r.label} '{key}' is already {op.target}", collection=r.name, id=key)
            new = {**record, op.status_field: op.target}
        else:  # update, or an upsert of a record that exists
            new = {**record, **{field: _copy(args[a]) for a, field in op.fields.items() if a in args}}
        self._check_record(r, new)
        state[r.name][key] = new
        return self.copy_data(new)

    def _delete(self, state: dict[str, Any], r: Resource, key: str) -> dict[str, int]:
        """Delete a record and, with it, every record filed under it (children, their children...): counts by
        collection of what went with it."""
        del state[r.name][key]
        removed: dict[str, int] = {}
        for child in self.children[r.name]:
            c = self.resources[child]
            for k in [k for k, v in state[child].items() if _key(v.get(c.parent_field)) == key]:
                removed[child] = removed.get(child, 0) + 1
                for name, n in self._delete(state, c, k).items():
                    removed[name] = removed.get(name, 0) + n
        return removed

    def _create(self, op: Operation, r: Resource, state: dict[str, Any], args: dict[str, Any], key: Any = None) -> Any:
        """A new record from the arguments; its id from the counter, or `key` (an upsert names its own)."""
        record: dict[str, Any] = {field: _copy(args[a]) for a, field in op.fields.items() if a in args}
        props = r.record_schema.get("properties", {})
        for field, schema in props.items():
            if field in record or not isinstance(schema, dict):
                continue
            if "default" in schema:
                record[field] = _copy(schema["default"])
            elif schema.get("format") == "date-time" and field in _STAMP_FIELDS:
                record[field] = state["clock"]
            elif field in _STATUS_FIELDS and isinstance(schema.get("enum"), list) and schema["enum"]:
                record[field] = schema["enum"][0]
        if op.parents and r.parent_field is not None and op.parents[-1][1] == r.parent:
            record[r.parent_field] = args[op.parents[-1][0]]
        for a, f in op.scopes:
            record[f] = args[a]
        record[r.id_field] = self.new_id(state, r) if key is None else key
        self._check_record(r, record)
        state[r.name][_key(record[r.id_field])] = record
        return self.copy_data(record)

    def _list(self, op: Operation, r: Resource, state: dict[str, Any], args: dict[str, Any]) -> Any:
        out = []
        for record in state[r.name].values():
            if not self._in_parent(op, r, record, args):
                continue
            if all(_matches(record.get(field), args[a]) for a, field in op.fields.items() if a in args):
                out.append(record)
        start = 0
        limit = args.get(op.limit_param) if op.limit_param else None
        if op.offset_param and op.offset_param in args:
            start = max(0, int(args[op.offset_param]))
        elif op.page_param and op.page_param in args and limit:
            start = max(0, (int(args[op.page_param]) - 1) * int(limit))
        end = None if not limit else start + max(0, int(limit))
        return self.copy_data(out[start:end])


_STAMP_FIELDS = frozenset({"created_at", "createdAt", "created", "updated_at", "updatedAt", "updated", "date_created"})
_STATUS_FIELDS = frozenset({"status", "state"})


def _copy(value: Any) -> Any:
    """A deep copy of JSON data, equal to what a JSON round trip gives: objects and arrays are copied, strings,
    numbers, booleans and null (immutable) are shared — so a 1 MB string costs a reference, where a round trip
    copies and scans its bytes. Data a round trip would change or refuse (a tuple, a key that is no string, a
    lone surrogate, an object of another type, nesting past its depth) goes through one, whole."""
    try:
        return _plain_copy(value, 0)
    except _NotPlain:
        return from_json(to_json(value))


class _NotPlain(Exception):
    pass


_PLAIN_DEPTH = 200  # deeper data goes through JSON, which refuses nesting past 254


def _plain_copy(value: Any, depth: int) -> Any:
    t = type(value)
    if t is str:
        if value.isascii() or _encodes(value):
            return value
    elif t is dict:
        if depth < _PLAIN_DEPTH and all(type(k) is str and (k.isascii() or _encodes(k)) for k in value):
            return {k: _plain_copy(v, depth + 1) for k, v in value.items()}
    elif t is list:
        if depth < _PLAIN_DEPTH:
            return [_plain_copy(v, depth + 1) for v in value]
    elif t is int or t is float or t is bool or value is None:
        return value
    raise _NotPlain


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no JSON can carry it
        return False
    return True


def _shape(value: Any) -> Any:
    """A hashable key of JSON data that tells apart what JSON tells apart: the order of keys and the types of
    numbers (`1`, `1.0` and `true` are equal in Python). Strings keep their own (cached) hash, so the key of a
    record holding a long string costs no scan of it."""
    t = type(value)
    if t is dict:
        return (dict, *[(k, _shape(v)) for k, v in value.items()])
    if t is list:
        return (list, *[_shape(v) for v in value])
    if t is str or value is None:
        return value
    return (t, value)


def _changes(diff: StateDiff) -> list[Change]:
    """The change log of a call, read from its diff: records created, deleted or updated, counters moved."""
    out: dict[tuple[str, str, str | None], Change] = {}
    for op, paths in (("create", diff.added), ("delete", diff.removed), ("update", diff.changed)):
        for path in paths:
            coll, _, rest = path.partition(".")
            key = rest.split(".", 1)[0] if rest else None
            if coll == "counters":
                change = Change(op="counter", collection=coll, id=key)
            elif coll == "clock" or key is None:
                change = Change(op="set", collection=coll)
            else:
                change = Change(op=op if "." not in rest else "update", collection=coll, id=key)
            out.setdefault((change.op, change.collection, change.id), change)
    return list(out.values())


def interpreter_problems(plan: CompiledPlan) -> list[str]:
    """What the interpreter relies on beyond the plan's schema, one line per problem naming the resource or tool:
    resources named like identifiers with their own id prefixes, record schemas holding the id, parent and scope
    fields, acyclic parents, tools whose parents, scopes and fields name what exists, integer paging arguments, a
    transition into a state its status enum names, a create that files a child under its parent. The compiler's
    plans hold it by construction; a revised plan (`compiler.revision`) and a plan read from a folder (`load_plan`,
    a hand-edited `compiled.json`) are checked, so that no call fails inside the interpreter."""
    out: list[str] = []
    res = {r.name: r for r in plan.resources}
    prefixes = Counter(r.id_prefix for r in plan.resources)
    for r in plan.resources:
        where = f"resource '{r.name}'"
        if not _RESOURCE_NAME.fullmatch(r.name):
            out.append(f"{where}: a resource's name is an identifier (letters, digits, underscore; at most 60)")
        if not _ID_PREFIX.fullmatch(r.id_prefix):
            out.append(f"{where}: id_prefix '{r.id_prefix}' must be 1-10 capital letters or digits, a letter first")
        elif prefixes[r.id_prefix] > 1:
            out.append(f"{where}: id_prefix '{r.id_prefix}' is another resource's too (each counts its own ids)")
        props = r.record_schema.get("properties")
        if r.record_schema.get("type") != "object" or not isinstance(props, dict):
            out.append(f"{where}: record_schema must be an object schema with properties")
            continue
        loose = sorted(str(f) for f, schema in props.items() if not isinstance(schema, dict))
        if loose:  # initial states and records are made from each field's schema
            out.append(f"{where}: the schema of its field '{loose[0]}' must be a JSON object (a schema with a type)")
        if r.id_field not in props:
            out.append(f"{where}: record_schema has no property '{r.id_field}' (its id_field)")
        elif type_of(props[r.id_field]) != r.id_type:
            out.append(f"{where}: the id field '{r.id_field}' must be of type '{r.id_type}' (its id_type)")
        if r.parent_field is not None and r.parent_field not in props:
            out.append(f"{where}: record_schema has no property '{r.parent_field}' (its parent_field)")
        if r.parent_field is not None and r.parent_field in (r.id_field, *r.scope_fields):
            out.append(f"{where}: its parent_field '{r.parent_field}' is its id field or a scope field too")
        if r.id_field in r.scope_fields:
            out.append(f"{where}: its id field '{r.id_field}' cannot be a scope field")
        problem = schema_problem(r.record_schema)
        if problem is not None:  # records are validated with it on every write
            out.append(f"{where}: record_schema is not a JSON Schema records can be checked with: {problem}")
        missing = [f for f in r.scope_fields if f not in props]
        out += [f"{where}: record_schema has no property '{f}' (a scope field)" for f in missing]
        seen, cur = {r.name}, r
        while cur.parent is not None and cur.parent in res:
            if cur.parent in seen:
                out.append(f"{where}: its parents form a cycle through '{cur.parent}'")
                break
            seen.add(cur.parent)
            cur = res[cur.parent]
    for o in plan.operations:
        out += _operation_problems(o, res)
    return out


def _operation_problems(o: Operation, res: dict[str, Resource]) -> list[str]:
    where = f"tool '{o.spec.name}'"
    r = res[o.resource]
    props = r.record_schema.get("properties")
    props = props if isinstance(props, dict) else {}  # (named by the resource's own check)
    params = o.spec.parameters
    out = [f"{where}: parents names no resource '{p}'" for _, p in o.parents if p not in res]
    out += [
        f"{where}: scope '{a}' fills '{f}', which is not a scope field of '{r.name}' ({r.scope_fields})"
        for a, f in o.scopes
        if f not in r.scope_fields
    ]
    out += [
        f"{where}: fields maps '{a}' to '{f}', which is no field of a {r.label}"
        for a, f in o.fields.items()
        if f not in props
    ]
    keys = {r.id_field, *r.scope_fields} | ({r.parent_field} if r.parent_field is not None else set())
    if o.semantics in ("update", "upsert"):  # (a list's fields filter; a create files its record after them)
        out += [  # where a record is filed is its path's business: a body field rewriting it would break the state
            f"{where}: fields maps '{a}' to '{f}', the field that files a {r.label} (its id, parent or scope)"
            for a, f in o.fields.items()
            if f in keys
        ]
    if o.semantics == "transition" and o.status_field in keys:
        out.append(f"{where}: a transition's status_field '{o.status_field}' is the field that files a {r.label}")
    problem = schema_problem(o.spec.input_schema)
    if problem is not None:  # every call's arguments are validated with it
        out.append(f"{where}: its input_schema is not a JSON Schema arguments can be checked with: {problem}")
    for arg in (o.limit_param, o.offset_param, o.page_param):
        if arg is not None and type_of(params[arg]) != "integer":
            out.append(f"{where}: the paging argument '{arg}' must be of type 'integer'")
    if o.semantics == "transition":
        status = props.get(o.status_field) if o.status_field else None
        enum = status.get("enum") if isinstance(status, dict) else None
        if o.status_field is None or o.status_field not in props:
            out.append(f"{where}: a transition needs status_field, a field of a {r.label}")
        elif not isinstance(enum, list) or o.target not in enum:
            out.append(
                f"{where}: a transition moves '{o.status_field}' to a state its enum names; "
                f"{o.target!r} is not in {enum if isinstance(enum, list) else 'its enum (it has none)'}"
            )
    if o.semantics in ("create", "upsert"):
        if r.parent is not None and not (o.parents and o.parents[-1][1] == r.parent):
            out.append(f"{where}: a create of a {r.label} takes its '{r.parent}' id (the last of parents)")
        missing = sorted(set(r.scope_fields) - {f for _, f in o.scopes})
        if missing:
            out.append(f"{where}: a create of a {r.label} must fill its scope fields (scopes): {missing}")
    return out


def type_of(schema: Any) -> str | None:
    """A schema's one type (`["string", "null"]` is a string), or None (also for a schema that is not an object:
    `true`, a string in a hand-edited plan)."""
    if not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    return t if isinstance(t, str) else None


def _key(value: Any) -> str:
    """A record's key in its collection: ids are compared as strings (`7` and `"7"` name one record, and so does
    `7.0`, which JSON Schema counts as an integer)."""
    if type(value) is float and value.is_integer():
        return str(int(value))
    return str(value)


def _matches(value: Any, wanted: Any) -> bool:
    """A list filter's test: text as the reward's matcher reads it (case and surrounding spaces aside: a filter of
    `" sit "` found nothing where `"sit"` found a listing, and a reward that reads the two as the same call gave the
    empty answer full credit); a list field holds the wanted value."""
    if isinstance(value, list) and not isinstance(wanted, list):
        return any(_matches(item, wanted) for item in value)
    if isinstance(value, str) and isinstance(wanted, str):
        return value.strip().casefold() == wanted.strip().casefold()
    return bool(value == wanted)


def load_plan(data: dict[str, Any], where: str) -> CompiledPlan:
    """A plan read from a folder (`compiled.json`, perhaps edited by hand): its schema, then what the interpreter
    relies on (`interpreter_problems`), so that a broken plan is refused when it loads, not at a call."""
    try:
        plan = CompiledPlan.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "<root>"
        raise EnvLoadError(f"{where}: not a compiled plan: at '{loc}': {err['msg']}") from None
    problems = interpreter_problems(plan)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise EnvLoadError(f"{where}: the plan cannot be interpreted: {problems[0]}{more}")
    return plan
