"""A model's revision of a compiled plan: data in the plan's own models, applied, cleaned and checked here.

EnvGen's Code Agent, given a compiled environment as its draft, answers with a `PlanRevision`: resources and
operations to add or replace (by name), tools to remove, a new description, and notes on what it changed.
It writes no code. `apply_revision` merges the revision into the plan and holds the result to everything
the compiler guarantees by construction:

- the plan's own schema (`CompiledPlan`: unknown keys refused, tool names unique, kinds and id arguments
  consistent) — the revision cannot touch the name, domain, source, provenance or clock;
- every JSON Schema it brings (records, tool inputs) goes through the compiler's `clean`, as a spec's do: only
  known keywords, no regular expression that can hang `re`, strings and lists bounded; records stay closed
  (`additionalProperties: false`) and require their id, parent and scope fields;
- a tool's kind follows from its semantics, and its output schema is derived from its resource's record, as
  the compiler derives it;
- `plan_problems`: what the interpreter relies on — resources named like identifiers, acyclic parents, fields
  and filters naming record fields, integer paging arguments, a transition into a state its status enum
  names, a create that files a child under its parent, read and write tools both — what the interpreter would
  otherwise fail on at a call (a property test drives random revisions through it).

A revision that breaks one of these is refused with every problem named (the Code Agent is re-asked with them);
one that passes is then judged by the gate every compiled environment passes (`build.gate_plan`).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envfactory.compiler.compile import CompileSettings, output_schema
from envfactory.compiler.schemas import clean
from envfactory.env.compiled import KIND, CompiledPlan, Operation, Resource, Skipped, type_of
from envfactory.env.metadata import ToolSpec
from envfactory.errors import EnvError

_RESOURCE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,59}$")
_ID_PREFIX = re.compile(r"^[A-Z][A-Z0-9]{0,9}$")
MAX_ITEMS = 100  # resources, operations or removals in one revision


class PlanRevision(BaseModel):
    """What the Code Agent answers for a compiled plan: what to change, in the plan's own models."""

    model_config = ConfigDict(extra="forbid")

    notes: str = Field(default="", max_length=2000, description="what was changed and why, in a few sentences")
    description: str | None = Field(
        default=None, max_length=1000, description="a new description of the environment; null keeps the current one"
    )
    resources: list[Resource] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="resources added, or replacing the resource of the same name (complete: every field)",
    )
    operations: list[Operation] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="tools added, or replacing the tool of the same spec.name (complete: every field)",
    )
    remove: list[str] = Field(default_factory=list, max_length=MAX_ITEMS, description="names of tools to remove")

    def changes(self) -> bool:
        return bool(self.description or self.resources or self.operations or self.remove)


class RevisionError(EnvError):
    """A revision that does not give a valid plan; `problems` lists every reason."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "\n".join(f"- {p}" for p in problems[:20])
        more = f"\n- ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"the revision does not give a valid plan ({len(problems)} problems):\n{shown}{more}")


def _record_schema(r: Resource) -> dict[str, Any]:
    """A revised resource's record schema, cleaned like a spec's, closed, requiring its structural fields."""
    cleaned = clean(r.record_schema)
    props = cleaned.get("properties", {})
    structural = [r.id_field, *([r.parent_field] if r.parent_field else []), *r.scope_fields]
    required = [f for f in dict.fromkeys([*structural, *cleaned.get("required", [])]) if f in props]
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    out["additionalProperties"] = False
    return out


def _input_schema(schema: dict[str, Any]) -> dict[str, Any]:
    cleaned = clean(schema)
    return {"type": "object", "properties": cleaned.get("properties", {}), **_required(cleaned)}


def _required(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": schema["required"]} if schema.get("required") else {}


def _operation(o: Operation, settings: CompileSettings) -> dict[str, Any]:
    """A revised operation as plan data: its input schema cleaned, its kind from its semantics, its description
    bounded as the compiler bounds one; the output schema is derived once the plan holds together."""
    text = " ".join(o.spec.description.split())
    limit = settings.max_description
    spec = {
        "name": o.spec.name,
        "description": text if len(text) <= limit else text[: limit - 3].rstrip() + "...",
        "kind": KIND[o.semantics],
        "input_schema": _input_schema(o.spec.input_schema),
    }
    return {**o.model_dump(mode="json"), "spec": spec}


def _validation_problems(e: ValidationError) -> list[str]:
    out = []
    for err in e.errors()[:20]:
        loc = ".".join(str(p) for p in err["loc"])
        out.append(f"{loc}: {err['msg']}" if loc else str(err["msg"]))
    return out


def apply_revision(plan: CompiledPlan, revision: PlanRevision, settings: CompileSettings | None = None) -> CompiledPlan:
    """`plan` with `revision` applied, cleaned and checked; raises `RevisionError` naming every problem.

    Resources and tools given replace the ones of the same name in place (new ones are appended); removed
    tools are recorded with the operations the plan leaves out; a resource no tool uses (and no used resource
    is filed under) is dropped, as the compiler drops it; what changed is logged in the plan's provenance."""
    s = settings or CompileSettings()
    problems: list[str] = []
    given = [o.spec.name for o in revision.operations]
    twice = sorted(n for n, k in Counter(given).items() if k > 1)
    problems += [f"operations: the tool '{n}' is given twice" for n in twice]
    twice_r = sorted(n for n, k in Counter(r.name for r in revision.resources).items() if k > 1)
    problems += [f"resources: the resource '{n}' is given twice" for n in twice_r]
    current = {o.spec.name: o for o in plan.operations}
    removals = []
    for name in revision.remove:
        if name in given:
            problems.append(f"remove: '{name}' is both removed and given in operations")
        elif name not in current:
            problems.append(f"remove: the plan has no tool '{name}' (its tools: {', '.join(current)})")
        else:
            removals.append(name)

    resources: dict[str, dict[str, Any]] = {r.name: r.model_dump(mode="json") for r in plan.resources}
    for r in revision.resources:
        resources[r.name] = {**r.model_dump(mode="json"), "record_schema": _record_schema(r)}
    operations: dict[str, dict[str, Any]] = {o.spec.name: o.model_dump(mode="json") for o in plan.operations}
    for name in removals:
        del operations[name]
    for o in revision.operations:
        operations[o.spec.name] = _operation(o, s)
    keep: set[str] = set()
    for name in {o["resource"] for o in operations.values()}:  # a resource a tool uses, and those it is filed under
        while name in resources and name not in keep:
            keep.add(name)
            name = resources[name]["parent"]
    kept = [r for r in resources.values() if r["name"] in keep]
    removed = [
        Skipped(method=current[n].method, route=current[n].route, reason=f"removed by EnvGen's revision ('{n}')")
        for n in removals
    ]
    covered = {(o["method"].upper(), o["route"]) for o in operations.values()}
    skipped = [k for k in plan.skipped if (k.method.upper(), k.route) not in covered] + removed
    change = {
        "notes": revision.notes,
        "added": [n for n in given if n not in current],
        "replaced": [n for n in given if n in current],
        "removed": removals,
        "resources": [r.name for r in revision.resources],
    }
    log = plan.provenance.get("envgen_revisions")
    provenance = {**plan.provenance, "envgen_revisions": [*(log if isinstance(log, list) else []), change]}
    data = {
        **plan.model_dump(mode="json", exclude={"resources", "operations", "skipped", "provenance", "description"}),
        "description": " ".join((revision.description or plan.description).split())[:1000] or plan.description,
        "provenance": provenance,
        "resources": kept,
        "operations": list(operations.values()),
        "skipped": [k.model_dump(mode="json") for k in skipped],
    }
    try:
        revised = CompiledPlan.model_validate(data)
    except ValidationError as e:  # the plan does not hold together: what the interpreter needs is not checked yet
        raise RevisionError(problems + _validation_problems(e)) from None
    problems += plan_problems(revised, s)
    if problems:
        raise RevisionError(problems)
    return _with_outputs(revised)


def _with_outputs(plan: CompiledPlan) -> CompiledPlan:
    """Every tool's output schema derived from its resource's record (what the interpreter returns)."""
    records = {r.name: r for r in plan.resources}
    ops = []
    for o in plan.operations:
        r = records[o.resource]
        out = output_schema(o.semantics, r.id_field, r.record_schema["properties"])
        spec = ToolSpec.model_validate({**o.spec.model_dump(), "output_schema": out})
        ops.append(o.model_copy(update={"spec": spec}))
    return plan.model_copy(update={"operations": ops})


def plan_problems(plan: CompiledPlan, settings: CompileSettings | None = None) -> list[str]:
    """What a plan must hold for the interpreter beyond its schema (the compiler's plans hold it by construction;
    a revised plan is checked): one line per problem, naming the resource or tool."""
    s = settings or CompileSettings()
    out: list[str] = []
    if len(plan.operations) > s.max_tools:
        out.append(f"{len(plan.operations)} tools: an environment holds at most {s.max_tools}")
    kinds = {o.spec.kind for o in plan.operations}
    if kinds != {"read", "write"}:  # the compiler's rule: an agent must be able to change and to observe it
        out.append(f"only {kinds.pop()} tools: an environment needs both read and write tools")
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
        if r.id_field not in props:
            out.append(f"{where}: record_schema has no property '{r.id_field}' (its id_field)")
        elif type_of(props[r.id_field]) != r.id_type:
            out.append(f"{where}: the id field '{r.id_field}' must be of type '{r.id_type}' (its id_type)")
        if r.parent_field is not None and r.parent_field not in props:
            out.append(f"{where}: record_schema has no property '{r.parent_field}' (its parent_field)")
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
    props = r.record_schema.get("properties") or {}
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
    for arg in (o.limit_param, o.offset_param, o.page_param):
        if arg is not None and type_of(params[arg]) != "integer":
            out.append(f"{where}: the paging argument '{arg}' must be of type 'integer'")
    if o.semantics == "transition":
        enum = (props.get(o.status_field) or {}).get("enum") if o.status_field else None
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
