"""Deterministic compile: an OpenAPI document → a `CompiledPlan`, no model involved.

Resources come from the paths (`routes.shape`): a collection route and its item route make one
resource, nested under the resource above it where the path says so. A record's schema is read from
what the spec says a record looks like (the item's response, the create body, the list's items).
Each operation becomes a tool only when its method and shape give it honest semantics:

| route and method              | tool                                                                   |
|-------------------------------|------------------------------------------------------------------------|
| POST collection               | create: body fields → record fields; the id from a counter             |
| GET collection                | list: query parameters that name record fields filter; limit/offset/page |
| GET item                      | read                                                                   |
| PUT / PATCH item              | update: the body's fields (an unknown id: not found)                   |
| PUT item, no POST to create   | upsert (create or replace), unless its operation id says update        |
| DELETE item                   | delete (the records filed under it go with it)                         |
| POST/PUT/PATCH item/verb      | transition, only where the record's status enum names the verb's state |

Everything else is left out and counted with the reason: an action with no state it moves to, a
required parameter the tool could not honour, a route the grammar cannot read, a record the spec
never describes, a POST that is an action though its path looks like a collection (`/invitation/delete`,
an operation id `deregisterAccount`), a GET on a collection route that answers one object (a count), a
custom method (`/jobs:search`), a second top-level route to the same records (`/insights/assessments/{id}`
beside `/assessments/{id}`: two collections would not see each other's writes). Parameters a tool cannot
honour (a query parameter naming no record field, a header) are not offered. Names from the spec become
identifiers and dictionary keys, never Python source; its prose becomes plain text (HTML tags dropped).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from envfactory.compiler.routes import Shape, normalize, shape
from envfactory.compiler.schemas import clean, plain_text, scalar
from envfactory.env.compiled import CompiledPlan, Operation, Resource, Semantics, Skipped, type_of
from envfactory.env.metadata import Domain, ToolSpec
from envfactory.envgen.openapi import OpenAPIError, _Converter, identifier, malformed_as_openapi_error, snake_case
from envfactory.errors import EnvError
from envfactory.words import singular

_LIMIT = frozenset({"limit", "per_page", "page_size", "pagesize", "max_results", "maxresults", "top", "size", "count"})
_OFFSET = frozenset({"offset", "skip", "start", "start_index"})
_PAGE = frozenset({"page", "page_number", "pagenumber", "page_no"})
# parameters that carry transport, not meaning: an auth key, a response format, an API version
_TRANSPORT = re.compile(
    r"(^|_)(api_?key|key|token|access_token|auth|authorization|signature|sig|format|callback|version|api_version"
    r"|fields|expand|include|pretty|prettyprint|alt|quota_user|user_ip|upload_type|upload_protocol|oauth_token"
    r"|x_.*)$"
)
# the keys of a page beside its one array of records, snake_cased (`nextPageToken`, `@odata.nextLink`, `_links`):
# paging, counts, links, and what a response says about itself (errors, warnings, its version, its kind)
_PAGE_KEY = re.compile(
    r"^(links?|meta|metadata|paging|pagination|page_info|errors?|warnings?|messages?|version|api_version|href|kind"
    r"|etag|self_link|odata_.*|timeframe|took|status|success|code|request_id|query|attributes|has_more|more"
    r"|is_truncated|truncated|marker|cursor|offset|limit|size|count|total|next|prev|previous|page|pages|per_page"
    r"|object|url|unreachable|warning|included|incomplete_results|length|embedded)$"
    r"|^(next|prev|previous|page|total|start|end|continuation|result|results|items)_"
    r"|_(count|total|token|cursor|link|links|url|page|pages|size|index|number|marker)$"
)
_IRREGULAR = {
    "cancel": ("cancelled", "canceled"),
    "open": ("open", "opened"),
    "close": ("closed",),
    "activate": ("active", "activated"),
    "deactivate": ("inactive", "deactivated"),
    "resume": ("active", "resumed", "running"),
    "start": ("started", "running", "active"),
    "stop": ("stopped",),
    "pause": ("paused",),
    "void": ("void", "voided"),
    "ship": ("shipped",),
    "submit": ("submitted",),
    "complete": ("complete", "completed"),
    "finalize": ("finalized", "final"),
    "publish": ("published", "live"),
    "unpublish": ("unpublished", "draft"),
    "archive": ("archived",),
    "unarchive": ("active", "unarchived"),
    "approve": ("approved",),
    "reject": ("rejected",),
    "decline": ("declined",),
    "accept": ("accepted",),
    "confirm": ("confirmed",),
    "enable": ("enabled", "active"),
    "disable": ("disabled", "inactive"),
    "lock": ("locked",),
    "unlock": ("unlocked",),
    "suspend": ("suspended",),
    "block": ("blocked",),
    "unblock": ("active", "unblocked"),
    "refund": ("refunded",),
    "pay": ("paid",),
    "send": ("sent",),
    "restore": ("active", "restored"),
    "verify": ("verified",),
    "resolve": ("resolved",),
    "reopen": ("open", "reopened"),
    "assign": ("assigned",),
    "unassign": ("unassigned",),
}
_STATUS_NAMES = re.compile(r"(^|_)(status|state)$")
# an operation id that says what it does, against what its method and path would make it
_NOT_A_CREATE = frozenset(
    {"list", "get", "describe", "search", "query", "find", "fetch", "lookup", "batch", "check", "validate", "count",
     "test", "preview", "estimate", "calculate", "export", "send", "run", "start", "stop", "execute", "invoke",
     "tag", "untag", "verify", "simulate", "generate", "render", "convert", "translate", "analyze", "detect"}
)  # fmt: skip
# verbs that act on records that exist (remove, switch off, link, undo): an operation id starting with one, or a
# route whose last segment is one (`POST /invitation/delete`, `POST /account/deregisterAccount`), is no create
# and no update of fields, whatever its method and path would make it
_ACTS_ON_RECORDS = frozenset(
    {"delete", "remove", "deregister", "unregister", "disable", "enable", "cancel", "decline", "reject", "accept",
     "approve", "archive", "unarchive", "associate", "disassociate", "attach", "detach", "revoke", "reset",
     "restore", "purge", "clear", "terminate", "reboot", "restart", "abort", "revert", "rollback", "undo", "close",
     "reopen", "leave", "unsubscribe", "unfollow", "unlink", "disconnect", "invalidate", "expire", "deactivate",
     "activate", "suspend", "resume", "pause", "lock", "unlock", "block", "unblock", "void", "refund", "confirm",
     "resolve", "unassign", "acknowledge", "dismiss", "mute", "unmute", "flush", "erase", "destroy", "drop", "mark",
     "retry", "finalize", "broadcast"}
)  # fmt: skip
# verbs that change a record that exists: no create (a POST to `/x/update`), and a PUT named so is an update
# that refuses an unknown id, not a create-or-replace
_CHANGES_A_RECORD = frozenset({"update", "modify", "edit", "change", "patch", "rename"})
# words of an operation id that say it makes a record, whatever its first word (`updateOrCreateContacts`)
_CREATES = frozenset({"create", "add", "insert", "new", "upsert"})


class CompileSettings(BaseModel):
    """How much of a spec one environment takes."""

    max_tools: int = Field(default=48, ge=2, description="tools per environment (resources taken in path order)")
    max_description: int = Field(default=600, ge=40, description="characters of a tool's description")
    schema_budget: int = Field(default=200_000, ge=1000, description="schema nodes expanded per spec, at most")


class CompileError(EnvError):
    """A spec that yields no honest environment (no resource with both reads and writes); says why."""

    def __init__(self, message: str, skipped: list[Skipped] | None = None) -> None:
        super().__init__(message)
        self.skipped = skipped or []


@dataclass
class _Op:
    route: str
    method: str
    op: dict[str, Any]
    shared: tuple[Any, str]
    path: str
    shape: Shape


@dataclass
class _Draft:
    """A resource while it is being read: its ops by semantics, its id variable, its parent."""

    collection: str
    parent: str | None
    ops: dict[str, list[_Op]] = field(default_factory=dict)
    actions: list[_Op] = field(default_factory=list)

    def add(self, semantics: str, op: _Op) -> None:
        self.ops.setdefault(semantics, []).append(op)


def _words(text: str) -> str:
    return snake_case(text).replace("_", " ").strip()


def _label(collection: str) -> str:
    last = [s for s in collection.split("/") if s and "{" not in s][-1]
    words = snake_case(last.split(".")[-1]).split("_") or ["record"]
    return " ".join([*words[:-1], singular(words[-1])]).strip() or "record"


def _collection_name(collection: str, taken: set[str]) -> str:
    literals = [s for s in collection.split("/") if s and "{" not in s]
    base = identifier(literals[-1].split(".")[-1], "items")[:40] if literals else "items"
    if base in ("clock", "counters"):
        base = f"{base}_records"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def _prefix(label: str, taken: set[str]) -> str:
    letters = re.sub(r"[^A-Z]", "", label.upper().replace(" ", ""))
    base = (letters[:3] or "REC").ljust(2, "X")
    prefix, n = base, 2
    while prefix in taken:
        prefix, n = f"{base}{n}", n + 1
    taken.add(prefix)
    return prefix


class _Budgeted(_Converter):
    """The OpenAPI converter with a bound on the schema nodes it expands for one spec (a few specs' `$ref`
    webs expand into millions of nodes)."""

    def __init__(self, doc: dict[str, Any], source: str, budget: int) -> None:
        super().__init__(doc, source)
        self.left = budget

    def schema(self, node: Any, path: str, stack: tuple[str, ...] = ()) -> dict[str, Any]:
        self.left -= 1
        if self.left < 0:
            raise _TooLarge(self.source, path, "its schemas expand past the compiler's budget")
        return super().schema(node, path, stack)


class _TooLarge(OpenAPIError):
    """A spec whose schemas expand past `CompileSettings.schema_budget` nodes."""


class _Compiler:
    def __init__(self, doc: dict[str, Any], source: str, settings: CompileSettings) -> None:
        self.conv = _Budgeted(doc, source, settings.schema_budget)
        self.s = settings
        self.skipped: list[Skipped] = []
        self._outputs: dict[str, dict[str, Any]] = {}  # an operation's response schema, by its place in the spec

    def skip(self, method: str, route: str, reason: str) -> None:
        self.skipped.append(Skipped(method=method.upper(), route=route, reason=reason))

    # ---- reading the paths -----------------------------------------------------------------------
    def ops(self) -> Iterator[_Op]:
        for route, method, op, shared, path in self.conv.operations():
            route = normalize(route)
            if method in ("head", "options", "trace"):
                self.skip(method, route, f"{method.upper()} is not an operation an agent calls")
                continue
            s = shape(route)
            if isinstance(s, str):
                self.skip(method, route, s)
                continue
            if ":" in re.sub(r"\{[^{}]*\}", "", route.rsplit("/", 1)[-1]):  # not `{path:.*}`, a variable's pattern
                verb = route.rsplit(":", 1)[-1]
                self.skip(method, route, f"a custom method (':{verb}') is an action the compiler does not model")
                continue
            yield _Op(route, method, op, shared, path, s)

    def drafts(self) -> dict[str, _Draft]:
        drafts: dict[str, _Draft] = {}
        pending_tails: list[_Op] = []

        def draft(s: Shape) -> _Draft:
            c = s.collection
            if c not in drafts:
                parent = s.parents[-1].collection if s.parents else None
                drafts[c] = _Draft(c, parent)
            return drafts[c]

        for o in self.ops():
            s, m = o.shape, o.method
            if s.ends == "collection":
                if m == "get":
                    if self.answers_records(o):
                        draft(s).add("list", o)
                elif m == "post":
                    draft(s).add("create", o)
                else:
                    self.skip(m, o.route, f"a {m.upper()} on a whole collection has no record semantics")
            elif s.ends == "item":
                item = Shape(s.levels, "item")
                if m == "get":
                    draft(item).add("read", o)
                elif m in ("put", "patch"):
                    draft(item).add("update", o)
                elif m == "delete":
                    draft(item).add("delete", o)
                else:
                    self.skip(m, o.route, f"a {m.upper()} on one record has no record semantics")
            else:
                pending_tails.append(o)
        for o in pending_tails:  # a tail is a child collection if it is used as one, else an action
            s, m = o.shape, o.method
            if s.collection in drafts or m == "get":
                if m == "get":
                    if self.answers_records(o):
                        draft(s).add("list", o)
                elif m == "post":
                    draft(s).add("create", o)
                else:
                    self.skip(m, o.route, f"a {m.upper()} on a whole collection has no record semantics")
            elif m in ("post", "put", "patch") and s.parents and s.parents[-1].collection in drafts:
                drafts[s.parents[-1].collection].actions.append(o)
            else:
                self.skip(m, o.route, "an action on a record the spec defines no operations for")
        return self.one_collection_a_name(drafts)

    def one_collection_a_name(self, drafts: dict[str, _Draft]) -> dict[str, _Draft]:
        """`/assessments/{assessmentId}` and `/insights/assessments/{assessmentId}` name the same records by the
        same id, but two collections would not see each other's writes (a record one creates is `not_found` in
        the other): of top-level collections with the same name and id variable, the shortest route is the
        resource and the others' operations are left out, with the reason. (A child of another resource,
        `/groups/{groupId}/users/{userId}`, is a collection of its own.)"""
        kept: dict[tuple[str, str], str] = {}
        order = {c: i for i, c in enumerate(drafts)}
        for c in sorted(drafts, key=lambda c: (c.count("/"), order[c])):
            d = drafts[c]
            ops = [o for group in d.ops.values() for o in group]
            var = next((o.shape.levels[-1].var for o in ops if o.shape.ends == "item"), None)
            if var is None or d.parent is not None or any(lv.var for o in ops[:1] for lv in o.shape.parents):
                continue
            key = (c.rsplit("/", 1)[-1].lower(), identifier(var))
            first = kept.get(key)
            defines = first is not None and any(drafts[first].ops.get(k) for k in ("read", "create"))
            if first is None or not (defines and c.lower().endswith(first.lower())):  # `/providers/invoices` is
                kept.setdefault(key, c)  # not `/customers/invoices`: only a prefix before the same route is a view
                continue
            for o in [*ops, *d.actions]:
                self.skip(o.method, o.route, f"it names the records of {kept[key]} under another prefix")
            del drafts[c]
        return drafts

    # ---- records ----------------------------------------------------------------------------------
    def converted(self, raw: Any, path: str) -> dict[str, Any]:
        try:
            return self.conv.schema(raw, path)
        except _TooLarge:
            raise
        except OpenAPIError:
            return {}

    def output(self, o: _Op) -> dict[str, Any]:
        if o.path not in self._outputs:
            try:
                self._outputs[o.path] = self.conv.output(o.op, o.path) or {}
            except _TooLarge:
                raise
            except OpenAPIError:
                self._outputs[o.path] = {}
        return self._outputs[o.path]

    def answers_records(self, o: _Op) -> bool:
        """Whether a GET on a collection route answers records: an answer that holds an array anywhere in its first
        three levels (a list, a page however it is wrapped: Stripe's, Google's, HAL's, Open Banking's) or that the
        spec leaves undescribed. One object with no list in it (`{"invitationsCount": 2}`, an account's settings)
        is no list of records; such a GET is left out, with the reason."""
        answer = self.output(o)
        if not isinstance(answer.get("properties"), dict) or not answer["properties"] or type_of(answer) == "array":
            return True  # a list, or an answer the spec does not describe: as the route says
        level = [answer]
        for _ in range(3):
            if any(type_of(v) == "array" or isinstance(v.get("items"), dict) for v in level):
                return True
            level = [v for s in level for v in (s.get("properties") or {}).values() if isinstance(v, dict)]
        self.skip(o.method, o.route, "a GET that answers one object (a count, a setting, a summary), not a list")
        return False

    def body(self, o: _Op) -> tuple[dict[str, Any], bool]:
        """The request body as an object schema (properties, required) and whether it is required."""
        try:
            params = self.conv.parameters(o.shared, o.op.get("parameters", []), o.path)
            raw, at, required = self.conv.body(o.op, o.path, params)
        except _TooLarge:
            raise
        except OpenAPIError:
            return {}, False
        if raw is None:
            return {}, False
        schema = self.converted(raw, at)
        return (schema, required) if isinstance(schema.get("properties"), dict) else ({}, required)

    @staticmethod
    def unwrap(schema: dict[str, Any], listing: bool = False) -> dict[str, Any]:
        """The record inside a response: an array's items, a one-key envelope's content, a page's items."""
        for _ in range(3):
            if type_of(schema) == "array" and isinstance(schema.get("items"), dict):
                schema = schema["items"]
                continue
            props = schema.get("properties")
            if not isinstance(props, dict):
                return schema
            page = _page_of(props) if listing else None
            if page is not None:
                schema = props[page]
                continue
            inner = _envelope_of(props) if listing else None  # HAL's `_embedded`, Open Banking's `Data`
            if inner is not None:
                schema = props[inner]
                continue
            objects = [v for v in props.values() if isinstance(v, dict) and isinstance(v.get("properties"), dict)]
            if len(props) == 1 and len(objects) == 1:
                schema = objects[0]
                continue
            return schema
        return schema

    def record_schema(self, d: _Draft) -> dict[str, Any] | None:
        props: dict[str, Any] = {}
        sources: list[dict[str, Any]] = []
        for o in d.ops.get("read", []):
            sources.append(self.unwrap(self.output(o)))
        for o in d.ops.get("create", []):
            sources.append(self.body(o)[0])
            sources.append(self.unwrap(self.output(o)))
        for o in d.ops.get("list", []):
            sources.append(self.unwrap(self.output(o), listing=True))
        for o in d.ops.get("update", []):
            sources.append(self.body(o)[0])
        for s in sources:
            for k, v in (s.get("properties") or {}).items():
                if k not in props and isinstance(v, dict):
                    props[k] = clean(v)
        return {"type": "object", "properties": props} if props else None

    # ---- parameters ---------------------------------------------------------------------------------
    def params(self, o: _Op) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(parameter, its cleaned schema) of the operation's path, query, header and cookie parameters."""
        try:
            raw = self.conv.parameters(o.shared, o.op.get("parameters", []), o.path)
        except OpenAPIError:
            return []
        out = []
        for p, at in raw:
            if p.get("in") not in ("path", "query", "header", "cookie"):
                continue
            try:
                schema = clean(self.conv.param_schema(p, at))
            except _TooLarge:
                raise
            except OpenAPIError:
                schema = {"type": "string"}
            out.append((p, schema or {"type": "string"}))
        return out

    def description(self, o: _Op, fallback: str) -> str:
        summary = str(o.op.get("summary") or "").strip()
        details = str(o.op.get("description") or "").strip()
        text = f"{summary.rstrip('.')}. {details}" if summary and details and details != summary else summary or details
        return plain_text(text, self.s.max_description) or fallback


@dataclass
class _Tool:
    properties: dict[str, Any] = field(default_factory=dict)
    required: list[str] = field(default_factory=list)

    def add(self, raw_name: str, schema: dict[str, Any], required: bool, suffix: str = "") -> str:
        name = identifier(raw_name)[:60]
        if name in self.properties:
            name = f"{name}_{suffix or 'arg'}"
        n = 2
        base = name
        while name in self.properties:
            name, n = f"{base}_{n}", n + 1
        self.properties[name] = schema
        if required:
            self.required.append(name)
        return name

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "properties": self.properties}
        if self.required:
            out["required"] = self.required
        return out


def _id_field(record: dict[str, Any], var: str | None, label: str) -> str:
    props = record["properties"]
    candidates = ["id"]
    if var:
        candidates += [var, identifier(var)]
    words = label.replace(" ", "_")
    candidates += [f"{words}_id", f"{words}Id", "uuid", "key"]
    for c in candidates:
        if c in props and type_of(props[c]) in ("string", "integer"):
            return c
    return "id"


def _page_of(props: dict[str, Any]) -> str | None:
    """The key of a page's records: its one array (of records, not of messages) when every other key is about the
    page (`_PAGE_KEY`: `{"accounts": [...], "next_page_token": ..., "total_records": ...}`); None for anything
    else (a record that holds a list: `{"id": ..., "email": ..., "orgs": [...]}`)."""
    meta = _page_keys(props)
    arrays = [k for k, v in props.items() if isinstance(v, dict) and type_of(v) == "array"]
    records = [k for k in arrays if k not in meta] or (arrays if len(arrays) == 1 else [])
    if len(records) != 1:
        return None
    return records[0] if all(k in meta for k in props if k != records[0]) else None


def _envelope_of(props: dict[str, Any]) -> str | None:
    """The one key holding an object beside keys about the page (`{"_embedded": {...}, "_links": ..., "page": ...}`,
    `{"Data": {...}, "Links": ..., "Meta": ...}`): the records are inside it; None for anything else."""
    objects = [k for k, v in props.items() if isinstance(v, dict) and isinstance(v.get("properties"), dict)]
    meta = _page_keys(props)
    inner = [k for k in objects if k not in meta or k.strip("_").lower() == "embedded"]
    if len(inner) != 1:
        return None
    return inner[0] if all(k in meta for k in props if k != inner[0]) else None


def _page_keys(props: dict[str, Any]) -> set[str]:
    """The keys of a response object that are about the page, not its records (`_PAGE_KEY`)."""
    return {k for k in props if _PAGE_KEY.search(snake_case(k.replace(".", "_")).strip("_"))}


def _targets(verb: str) -> list[str]:
    v = verb.lower()
    out = list(_IRREGULAR.get(v, ()))
    out += [v + "ed", v + "d", v[:-1] + "ied" if v.endswith("y") else "", v + v[-1:] + "ed", v]
    return [t for t in dict.fromkeys(out) if t]


def _status_field(record: dict[str, Any]) -> tuple[str, list[Any]] | None:
    for name, schema in record["properties"].items():
        if _STATUS_NAMES.search(snake_case(name)) and isinstance(schema.get("enum"), list) and len(schema["enum"]) > 1:
            return name, schema["enum"]
    return None


def compile_spec(
    doc: dict[str, Any],
    *,
    name: str,
    domain: Domain,
    source: str,
    description: str | None = None,
    provenance: dict[str, Any] | None = None,
    settings: CompileSettings | None = None,
) -> tuple[CompiledPlan, list[Skipped]]:
    """The plan of the environment `doc` describes, and every operation left out with its reason.

    Raises `OpenAPIError` for a document that is not OpenAPI, `CompileError` when no resource has
    both a read and a write tool (an environment an agent could not change or could not observe)."""
    with malformed_as_openapi_error(source):
        c = _Compiler(doc, source, settings or CompileSettings())
        try:
            drafts = c.drafts()
            return _compile(c, drafts, name, domain, source, description, provenance)
        except _TooLarge as e:
            raise CompileError(f"the spec is too large to compile: {e}", c.skipped) from None


def _compile(
    c: _Compiler,
    drafts: dict[str, _Draft],
    name: str,
    domain: Domain,
    source: str,
    description: str | None,
    provenance: dict[str, Any] | None,
) -> tuple[CompiledPlan, list[Skipped]]:
    resources: dict[str, Resource] = {}
    operations: list[Operation] = []
    taken_names: set[str] = set()
    taken_prefixes: set[str] = set()
    taken_tools: set[str] = set()
    by_route: dict[str, str] = {}  # collection route -> resource name
    for d in sorted(drafts.values(), key=lambda d: d.collection.count("{")):  # parents first
        all_ops = [o for ops in d.ops.values() for o in ops] + d.actions
        record = c.record_schema(d)
        if record is None:
            for o in all_ops:
                c.skip(o.method, o.route, "the spec never says what a record of this collection holds")
            continue
        if len(operations) + len(all_ops) > c.s.max_tools:
            for o in all_ops:
                c.skip(o.method, o.route, f"over the environment's {c.s.max_tools}-tool limit")
            continue
        label = _label(d.collection)
        item_vars = [o.shape.levels[-1].var for k in ("read", "update", "delete") for o in d.ops.get(k, [])]
        var = next((v for v in item_vars if v), None)
        # a record's key is always `id` (the spec's own name for it, e.g. `petId`, is folded into it), and a
        # child names its parent as `<parent>_id`: the names the solver, the tool graph and agents expect
        spec_id = _id_field(record, var, label)
        props = record["properties"]
        id_schema = props.pop(spec_id, None) or {}
        props.pop("id", None)
        id_field = "id"
        id_type = "integer" if type_of(id_schema) == "integer" else "string"
        id_desc = {"description": id_schema["description"]} if "description" in id_schema else {}
        props = record["properties"] = {"id": {"type": id_type, **id_desc}, **props}
        rname = _collection_name(d.collection, taken_names)
        # the levels above the collection: the nearest that is a resource is its parent, the ones that are
        # no resource (no operations of their own) are scopes: namespace keys every record carries
        above = next(o.shape.levels[:-1] for ops in d.ops.values() for o in ops)
        parent_name = parent_field = None
        scope_fields: list[str] = []
        taken_fields = {id_field}
        for level in above:
            assert level.var is not None
            if level.collection in by_route:
                parent_name = by_route[level.collection]
                for k in (level.var, identifier(level.var)):
                    if k != id_field:
                        props.pop(k, None)  # the spec's own field for the parent's id: the parent field below
                parent_field = _free(f"{singular(parent_name)}_id", {}, taken_fields)
                taken_fields.add(parent_field)
                continue
            fname = next((k for k in (level.var, identifier(level.var)) if k in props and k not in taken_fields), None)
            fname = fname or _free(identifier(level.var), props, taken_fields)
            taken_fields.add(fname)
            scope_fields.append(fname)
            props[fname] = {"type": "string", "description": f"the {_words(level.var)} it is filed under"}
        if parent_name is not None and parent_field is not None:
            ptype = resources[parent_name].id_type
            props[parent_field] = {"type": ptype, "description": f"the {resources[parent_name].label} it belongs to"}
        record["required"] = [id_field, *([parent_field] if parent_field else []), *scope_fields]
        record["additionalProperties"] = False
        res = Resource(
            name=rname,
            label=label,
            id_field=id_field,
            id_type=id_type,
            id_prefix=_prefix(label, taken_prefixes),
            parent=parent_name,
            parent_field=parent_field,
            scope_fields=scope_fields,
            record_schema=record,
        )
        made = _operations(c, d, res, resources, by_route, record, taken_tools)
        if not made:
            continue
        create_required = _create_required(made, record)
        record["required"] = list(dict.fromkeys([*record["required"], *create_required]))
        resources[rname] = res.model_copy(update={"record_schema": record})
        by_route[d.collection] = rname
        operations.extend(made)
    kinds = {o.spec.kind for o in operations}
    if kinds != {"read", "write"}:
        have = "no tools" if not kinds else f"only {kinds.pop()} tools"
        raise CompileError(f"no resource with both reads and writes ({have})", c.skipped)
    used = {o.resource for o in operations}
    plan_resources = [
        r for r in resources.values() if r.name in used or any(x.parent == r.name for x in resources.values())
    ]
    try:
        plan = CompiledPlan(
            name=name,
            description=" ".join((description or name).split())[:1000] or name,
            domain=domain,
            source=source,
            provenance=provenance or {},
            resources=plan_resources,
            operations=operations,
            skipped=c.skipped,
        )
    except ValidationError as e:
        raise CompileError(f"the compiled plan is inconsistent: {e.errors()[0]['msg']}", c.skipped) from None
    return plan, c.skipped


def _free(name: str, props: dict[str, Any], taken: set[str]) -> str:
    """`name`, or `name_2`..., not a property of the record and not taken."""
    out, n = name, 2
    while out in props or out in taken:
        out, n = f"{name}_{n}", n + 1
    return out


def _create_required(ops: list[Operation], record: dict[str, Any]) -> list[str]:
    """Record fields every create requires: a record made any other way must have them too."""
    creates = [o for o in ops if o.semantics in ("create", "upsert")]
    if not creates:
        return []
    sets = [{o.fields[a] for a in o.spec.required if a in o.fields} for o in creates]
    return sorted(set.intersection(*sets) & set(record["properties"]))


def output_schema(semantics: Semantics, id_field: str, props: dict[str, Any]) -> dict[str, Any]:
    """What a tool of these semantics returns: the record, a list of records, or what a delete says."""
    record_out = {"type": "object", "properties": props}
    if semantics == "list":
        return {"type": "array", "items": record_out}
    if semantics == "delete":
        return {
            "type": "object",
            "properties": {
                "deleted": {"type": "boolean"},
                id_field: props[id_field],
                "also_deleted": {"type": "object", "description": "records filed under it, deleted with it, by kind"},
            },
        }
    return record_out


def _operations(
    c: _Compiler,
    d: _Draft,
    res: Resource,
    resources: dict[str, Resource],
    by_route: dict[str, str],
    record: dict[str, Any],
    taken: set[str],
) -> list[Operation]:
    out: list[Operation] = []
    props = record["properties"]
    status = _status_field(record)
    order: tuple[Semantics, ...] = ("create", "list", "read", "update", "delete")
    for semantics in order:
        for o in d.ops.get(semantics, []):
            words = snake_case(str(o.op.get("operationId") or "")).split("_")  # `deregisterAccount`: its two words
            verb = words[0]
            refused = _NOT_A_CREATE | _ACTS_ON_RECORDS | (_CHANGES_A_RECORD if semantics == "create" else frozenset())
            says_create = not _CREATES.isdisjoint(words)
            if semantics in ("create", "update") and verb in refused and not says_create:  # not `updateOrCreateX`
                c.skip(o.method, o.route, f"its operation id says it does something else ('{verb}'), not a {semantics}")
                continue
            # the path's last segment a verb alone (`/invitation/delete`; not `/check-runs`, `/reset-tokens`)
            last = snake_case(re.sub(r"\.(json|xml|yaml|csv)$", "", o.route.rsplit("/", 1)[-1]).split(".")[-1])
            if semantics == "create" and last in _NOT_A_CREATE | _ACTS_ON_RECORDS | _CHANGES_A_RECORD:
                c.skip(o.method, o.route, f"its path ends in a verb ('{last}'): an action, not a create")
                continue
            # with no POST to create records, a PUT on an item creates or replaces it (Azure's createOrUpdate) —
            # unless its operation id says it changes a record that exists (`updateAuthorizer`: unknown id, not found)
            upsert = semantics == "update" and o.method == "put" and not d.ops.get("create")
            upsert = upsert and verb not in _CHANGES_A_RECORD
            made = _operation(c, o, "upsert" if upsert else semantics, res, resources, by_route, props, taken)
            if made is not None:
                out.append(made)
    for o in d.actions:
        verb = (o.shape.tail or "").split(".")[-1]
        words = snake_case(verb).split("_")
        target = None
        if status is not None:
            wanted = _targets(words[0]) + _targets(words[-1])
            target = next((v for t in wanted for v in status[1] if isinstance(v, str) and v.lower() == t), None)
        if target is None:
            c.skip(o.method, o.route, "an action whose record schema names no state it moves to")
            continue
        assert status is not None
        made = _operation(c, o, "transition", res, resources, by_route, props, taken, status=(status[0], target))
        if made is not None:
            out.append(made)
    return out


def _operation(
    c: _Compiler,
    o: _Op,
    semantics: Semantics,
    res: Resource,
    resources: dict[str, Resource],
    by_route: dict[str, str],
    props: dict[str, Any],
    taken: set[str],
    status: tuple[str, Any] | None = None,
) -> Operation | None:
    tool = _Tool()
    parents: list[tuple[str, str]] = []
    scopes: list[tuple[str, str]] = []
    levels = o.shape.levels
    item = semantics in ("read", "update", "upsert", "delete", "transition")
    above = levels[:-2] if semantics == "transition" else levels[:-1]
    scope_fields = iter(res.scope_fields)
    for level in above:
        assert level.var is not None
        owner = by_route.get(level.collection)
        if owner is not None:
            above_res = resources[owner]
            desc = f"the {above_res.label}'s id"
            arg = tool.add(f"{singular(owner)}_id", {"type": above_res.id_type, "description": desc}, True, "path")
            parents.append((arg, owner))
            continue
        field_name = next(scope_fields, None)
        if field_name is None:
            c.skip(o.method, o.route, "its path nests differently from the other routes of its collection")
            return None
        desc = f"the {_words(level.var)} it is filed under"
        scopes.append((tool.add(level.var, {"type": "string", "description": desc}, True, "path"), field_name))
    id_param = None
    if item:
        desc = f"the {res.label}'s id"
        id_param = tool.add(f"{singular(res.name)}_id", {"type": res.id_type, "description": desc}, True, "path")
    fields: dict[str, str] = {}
    limit = offset = page = None
    for p, schema in c.params(o):
        where, raw = p.get("in"), str(p["name"])
        if where == "path":
            continue
        transport = bool(_TRANSPORT.search(snake_case(raw))) or where in ("header", "cookie")
        match = next((k for k in props if k == raw or identifier(k) == identifier(raw)), None)
        low = snake_case(raw)
        if semantics == "list" and where == "query" and low in _LIMIT and limit is None:
            limit = tool.add(
                raw, {"type": "integer", "minimum": 0, "maximum": 1000, "description": "at most this many"}, False
            )
        elif semantics == "list" and where == "query" and low in _OFFSET and offset is None:
            offset = tool.add(raw, {"type": "integer", "minimum": 0, "description": "skip this many first"}, False)
        elif semantics == "list" and where == "query" and low in _PAGE and page is None:
            page = tool.add(raw, {"type": "integer", "minimum": 1, "description": "which page (with the limit)"}, False)
        elif (
            semantics == "list"
            and where == "query"
            and match is not None
            and match not in (res.parent_field, *res.scope_fields)
            and scalar(props[match])
        ):
            schema = props[match] if type_of(schema) != type_of(props[match]) else schema
            fields[tool.add(raw, schema, False, "query")] = match
        elif p.get("required") and not transport:
            c.skip(o.method, o.route, f"it requires the {where} parameter {raw!r}, which the compiler cannot honour")
            return None
    body, body_required = c.body(o)
    if semantics in ("create", "update", "upsert"):
        bprops = body.get("properties") or {}
        breq = set(body.get("required") or []) if body_required else set()
        # the record's own fields, and any body field whose argument name would read as one ("id " is `id`, and
        # an agent setting `id` believes it set the record's id)
        structural = {identifier(f) for f in (res.id_field, res.parent_field, *res.scope_fields) if f}
        for k in bprops:
            if k == res.id_field or k == res.parent_field or k in res.scope_fields or k not in props:
                continue
            if identifier(k) in structural:
                continue
            required = k in breq and (semantics in ("create", "upsert") or o.method == "put")
            fields[tool.add(k, props[k], required, "body")] = k
        if semantics in ("update", "upsert") and not fields:
            c.skip(o.method, o.route, "an update whose body names no field of the record")
            return None
    elif body.get("required") and body_required:
        c.skip(o.method, o.route, "it requires a request body the compiler cannot honour")
        return None
    output = output_schema(semantics, res.id_field, props)
    op_id = o.op.get("operationId")
    base = identifier(op_id, "op") if isinstance(op_id, str) and op_id.strip() else ""
    base = (base or identifier(f"{o.method} {re.sub(r'[{}]', '', o.route)}", "op"))[:64]
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    fallback = {
        "create": f"Create a {res.label}.",
        "list": f"List {res.label} records.",
        "read": f"Get one {res.label} by id.",
        "update": f"Update a {res.label}.",
        "upsert": f"Create or replace the {res.label} with this id.",
        "delete": f"Delete a {res.label} (and what is filed under it).",
        "transition": f"Move a {res.label} to '{status[1] if status else ''}'.",
    }[semantics]
    try:
        spec = ToolSpec(
            name=name,
            description=c.description(o, fallback),
            kind="read" if semantics in ("read", "list") else "write",
            input_schema=tool.schema(),
            output_schema=output,
        )
    except ValidationError as e:
        c.skip(o.method, o.route, f"its schema is not usable: {e.errors()[0]['msg']}")
        return None
    taken.add(name)
    return Operation(
        spec=spec,
        semantics=semantics,
        resource=res.name,
        method=o.method.upper(),
        route=o.route,
        id_param=id_param,
        parents=parents,
        scopes=scopes,
        fields=fields,
        limit_param=limit,
        offset_param=offset,
        page_param=page,
        status_field=status[0] if status else None,
        target=status[1] if status else None,
    )
