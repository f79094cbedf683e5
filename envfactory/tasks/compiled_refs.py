"""Which records a compiled tool's arguments name, how records are filed, and which tools list them.

A compiled environment says exactly what a native one leaves to names: the argument carrying the record an
operation acts on (`id_param`, a record of the operation's resource), the arguments naming where it is
filed (`parents`, outermost first), and the record fields naming other resources' records (a parent's id,
a `companyId`, `compiled_state.references`). The privileged solver reads these instead of guessing from
argument names (`name_2_id`, `tag_id`, `uk_4_id` name nothing by their words), so an id argument takes only
a record of its own resource, filed under the parents the call names.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from envfactory.env.compiled import CompiledEnvironment, CompiledTool, Operation
from envfactory.env.environment import BaseEnvironment
from envfactory.tasks.compiled_state import references


def operation(env: BaseEnvironment, tool: str) -> Operation | None:
    """The compiled operation behind `tool`; None for a tool written in Python."""
    binding = env.binding(tool)
    return binding.op if isinstance(binding, CompiledTool) else None


def id_arguments(env: BaseEnvironment, tool: str) -> dict[str, str]:
    """A compiled tool's arguments that name existing records → the resource whose records they name: its
    parents (outermost first), the record it acts on, and body fields naming another resource's records."""
    op = operation(env, tool)
    if op is None or not isinstance(env, CompiledEnvironment):
        return {}
    out = dict(op.parents)
    if op.id_param is not None:
        out[op.id_param] = op.resource
    named = _references(env).get(op.resource, {})
    for arg, field in op.fields.items():
        if field in named and arg not in out:
            out[arg] = named[field]
    return out


def links(env: CompiledEnvironment, resource: str) -> dict[str, str]:
    """The fields of a resource's records that name another resource's records → that resource: the parent
    field first, then references by name."""
    r = env.resources[resource]
    out = {r.parent_field: r.parent} if r.parent is not None and r.parent_field is not None else {}
    for field, other in _references(env).get(resource, {}).items():
        out.setdefault(field, other)
    return out


def ancestors(env: CompiledEnvironment, resource: str) -> list[str]:
    """The resources a record of `resource` is filed under, nearest first."""
    out: list[str] = []
    parent = env.resources[resource].parent
    while parent is not None and parent not in out:
        out.append(parent)
        parent = env.resources[parent].parent
    return out


def list_tools(env: CompiledEnvironment, resource: str) -> list[str]:
    """The list operations of a resource, fewest required arguments first: what an agent calls to find a
    record's id from what the user knows."""
    ops = [o for o in env.plan.operations if o.semantics == "list" and o.resource == resource]
    return [o.spec.name for o in sorted(ops, key=lambda o: (len(o.spec.required), o.spec.name))]


def id_key(value: Any) -> str:
    """A record id as the state keys it (integer ids are keyed by their text)."""
    return str(value)


def consistent(env: BaseEnvironment, tool: str, args: dict[str, Any], state: dict[str, Any]) -> bool:
    """Whether the records a compiled call's arguments name sit where its path says: each named record
    exists in `state` and is filed under the record its parent argument names (the branch of that app)."""
    op = operation(env, tool)
    if op is None or not isinstance(env, CompiledEnvironment):
        return True
    chain = [*op.parents, *([(op.id_param, op.resource)] if op.id_param is not None else [])]
    previous: tuple[str, Any] | None = None
    for arg, resource in chain:
        if arg not in args:
            previous = None
            continue
        record = state.get(resource, {}).get(id_key(args[arg]))
        r = env.resources[resource]
        if record is None:  # an upsert may name a record that does not exist yet
            return op.semantics == "upsert" and arg == op.id_param
        parent = previous is not None and r.parent == previous[0] and r.parent_field is not None
        if parent and previous is not None and id_key(record.get(r.parent_field)) != id_key(previous[1]):
            return False
        previous = (resource, args[arg])
    return True


def nesting(env: CompiledEnvironment, resource: str) -> int:
    """How deep a resource is filed (0: top level)."""
    return len(ancestors(env, resource))


@lru_cache(maxsize=64)  # per environment object (a pool keeps the ones it loaded)
def _references(env: CompiledEnvironment) -> dict[str, dict[str, str]]:
    return references(env.plan)
