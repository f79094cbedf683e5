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
- `plan_problems`: the compiler's rules and what the interpreter relies on (`env.compiled.interpreter_problems`,
  which also runs on every plan read from a folder) — resources named like identifiers, acyclic parents, fields
  and filters naming record fields, integer paging arguments, a transition into a state its status enum
  names, a create that files a child under its parent, read and write tools both — what the interpreter would
  otherwise fail on at a call (a property test drives random revisions through it).

A revision that breaks one of these is refused with every problem named (the Code Agent is re-asked with them);
one that passes is then judged by the gate every compiled environment passes (`build.gate_plan`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envfactory.compiler.compile import CompileSettings, output_schema
from envfactory.compiler.schemas import clean
from envfactory.env.compiled import KIND, CompiledPlan, Operation, Resource, Skipped, interpreter_problems
from envfactory.env.metadata import ToolSpec
from envfactory.errors import EnvError

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
    """What a revised plan must hold beyond its schema: the compiler's rules (at most `max_tools` tools, read and
    write tools both) and the interpreter's (`env.compiled.interpreter_problems`); one line per problem."""
    s = settings or CompileSettings()
    out: list[str] = []
    if len(plan.operations) > s.max_tools:
        out.append(f"{len(plan.operations)} tools: an environment holds at most {s.max_tools}")
    kinds = {o.spec.kind for o in plan.operations}
    if kinds != {"read", "write"}:  # the compiler's rule: an agent must be able to change and to observe it
        out.append(f"only {kinds.pop()} tools: an environment needs both read and write tools")
    return out + interpreter_problems(plan)
