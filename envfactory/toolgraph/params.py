"""Tool sources and their parameters: inputs from input schemas, outputs from output schemas (or descriptions).

Output rules (what a tool can hand to a later tool):

- every named property of the output, at any depth, through `$ref`/`$defs`, `items`, `anyOf`/`oneOf`,
  is an output parameter (`search_hotels` → `city`, `price_per_night`...), shallowest first; a name
  met twice keeps its shallowest occurrence;
- **an `id` field of a record named X is exposed as `x_id`**, with the head noun's id and plain `id`
  as aliases. X is the `$defs` name the field's object comes from (`HotelSummary` → `hotel_id`;
  decoration words like Summary, Details, Info are dropped), else the schema `title`, else — for the
  top-level object — the tool's return type (`book_room -> Booking` → `booking_id`), else the
  property that holds the object (`invoice.id` → `invoice_id`), else the tool's noun
  (`get_order_details` → `order_id`);
- a tool without an output schema outputs its noun (`get_ticket` → `ticket`) and that noun's id
  (`ticket_id`), of unknown type, described by the tool's description; a primitive top-level result
  is one parameter named after the record or noun.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envfactory.env.metadata import ToolSpec
from envfactory.words import record_id_names, record_words, snake, split_words, tokens, tool_noun, unqualified

Direction = Literal["input", "output"]
Origin = Literal["schema", "record_id", "description"]
_MAX_DEPTH = 4  # nested records deeper than this carry nothing a later call takes
_MAX_TEXT = 300  # characters of description embedded: long BFCL docs add cost, not meaning


class ToolSource(BaseModel):
    """One tool of the pool, as the graph builder sees it."""

    model_config = ConfigDict(extra="forbid")

    env: str
    domain: str = ""
    env_description: str = ""
    spec: ToolSpec
    return_type: str | None = Field(
        default=None, description="class name of the tool's return annotation (native tools), e.g. Booking"
    )

    @property
    def tool_id(self) -> str:
        return f"{self.env}.{self.spec.name}"


class ParamSpec(BaseModel):
    """One input or output parameter of one tool: a Parameter node of the graph."""

    model_config = ConfigDict(extra="forbid")

    tool: str  # "env.tool"
    env: str
    direction: Direction
    name: str
    aliases: list[str] = Field(default_factory=list)
    json_type: str = "any"  # string, integer, number, boolean, object, array<string>, any
    description: str = ""
    required: bool = False
    enum: bool = False
    format: str | None = None
    origin: Origin = "schema"
    path: str = ""

    @property
    def node_id(self) -> str:
        return param_node_id(self.tool, self.direction, self.name)

    @property
    def names(self) -> list[str]:
        """Every name the parameter goes by: its own first, then its aliases."""
        return [self.name, *(a for a in self.aliases if a != self.name)]

    @property
    def text(self) -> str:
        """What is embedded: `name (type): description`."""
        return f"{self.name} ({self.json_type}): {self.description[:_MAX_TEXT]}".strip()


def param_node_id(tool: str, direction: Direction, name: str) -> str:
    return f"{tool}:{'in' if direction == 'input' else 'out'}:{name}"


# ---- JSON Schema helpers ----------------------------------------------------------------------------


def _deref(node: Any, defs: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The schema a `$ref` points to and the definition's name (None when `node` is no reference)."""
    if not isinstance(node, dict):
        return {}, None
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        target = defs.get(name)
        if isinstance(target, dict):
            return target, name
        return {}, name
    return node, None


def _branches(node: dict[str, Any]) -> list[Any]:
    for key in ("anyOf", "oneOf"):
        options = node.get(key)
        if isinstance(options, list):
            return [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
    return []


def schema_type(node: Any, defs: dict[str, Any]) -> str:
    """`string`, `integer`, `number`, `boolean`, `object`, `array<item type>` or `any`."""
    node, _ = _deref(node, defs)
    t = node.get("type")
    if isinstance(t, list):
        concrete = [x for x in t if x != "null"]
        t = concrete[0] if len(concrete) == 1 else None
    if t is None:
        branches = _branches(node)
        if len(branches) == 1:
            return schema_type(branches[0], defs)
        if "properties" in node:
            return "object"
        if "enum" in node and node["enum"] and all(isinstance(v, str) for v in node["enum"]):
            return "string"
        return "any"
    if t == "array":
        item = schema_type(node.get("items"), defs) if isinstance(node.get("items"), dict) else "any"
        return f"array<{item.split('<', 1)[0]}>"
    return str(t)


def _is_enum(node: dict[str, Any], defs: dict[str, Any]) -> bool:
    node, _ = _deref(node, defs)
    if "enum" in node:
        return True
    items = node.get("items")
    return isinstance(items, dict) and "enum" in _deref(items, defs)[0]


# ---- inputs -------------------------------------------------------------------------------------------


def input_params(source: ToolSource) -> list[ParamSpec]:
    """The top-level input properties, in schema order, with `required` and the qualifier-free alias."""
    schema = source.spec.input_schema
    defs = schema.get("$defs", {}) if isinstance(schema.get("$defs"), dict) else {}
    required = set(source.spec.required)
    out: list[ParamSpec] = []
    for name, prop in source.spec.parameters.items():
        resolved, _ = _deref(prop, defs)
        plain = snake(unqualified(name))
        out.append(
            ParamSpec(
                tool=source.tool_id,
                env=source.env,
                direction="input",
                name=name,
                aliases=[plain] if plain != snake(tokens(name)) else [],
                json_type=schema_type(prop, defs),
                description=str(prop.get("description") or resolved.get("description") or " ".join(split_words(name))),
                required=name in required,
                enum=_is_enum(prop, defs),
                format=prop.get("format") or resolved.get("format"),
                origin="schema",
                path=name,
            )
        )
    return out


# ---- outputs ------------------------------------------------------------------------------------------


def _field_description(name: str, record: list[str]) -> str:
    words = " ".join(split_words(name))
    return f"{words} of the {' '.join(record)}" if record else words


def output_params(source: ToolSource) -> list[ParamSpec]:
    """Output parameters by the rules in the module docstring."""
    spec = source.spec
    top_record = record_words(source.return_type) if source.return_type else tool_noun(spec.name)
    schema = spec.output_schema
    if not schema:
        return _from_description(source, top_record)
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            defs.update(schema[key])
    title = schema.get("title")
    if isinstance(title, str) and title:
        top_record = record_words(title)

    found: dict[str, ParamSpec] = {}

    def emit(p: ParamSpec) -> None:
        found.setdefault(p.name, p)

    queue: deque[tuple[Any, str, list[str], int]] = deque([(schema, "", top_record, 0)])
    while queue:
        raw, path, record, depth = queue.popleft()
        node, ref = _deref(raw, defs)
        if ref:
            record = record_words(ref)
        elif isinstance(node.get("title"), str) and depth > 0:
            record = record_words(node["title"])
        branches = _branches(node)
        if branches and "type" not in node:
            queue.extend((b, path, record, depth) for b in branches)
            continue
        t = schema_type(node, defs)
        if t.startswith("array") and isinstance(node.get("items"), dict):
            queue.append((node["items"], f"{path}[]", record, depth))
            continue
        props = node.get("properties")
        if isinstance(props, dict) and props:
            for name, sub in props.items():
                if not isinstance(sub, dict):
                    continue
                resolved, sub_ref = _deref(sub, defs)
                field_path = f"{path}.{name}" if path else name
                if tokens(name) == ["id"]:
                    names = record_id_names(record)
                    param_name, aliases, origin = names[0], names[1:], "record_id"
                    default_desc = f"id of the {' '.join(record)}" if record else "id"
                else:
                    param_name, aliases, origin = name, [], "schema"
                    default_desc = _field_description(name, record)
                plain = snake(unqualified(param_name))
                if origin == "schema" and plain != snake(tokens(param_name)):
                    aliases = [plain]
                emit(
                    ParamSpec(
                        tool=source.tool_id,
                        env=source.env,
                        direction="output",
                        name=param_name,
                        aliases=aliases,
                        json_type=schema_type(sub, defs),
                        description=str(sub.get("description") or resolved.get("description") or default_desc),
                        enum=_is_enum(sub, defs),
                        format=sub.get("format") or resolved.get("format"),
                        origin=origin,
                        path=field_path,
                    )
                )
                if depth < _MAX_DEPTH and (resolved.get("properties") or resolved.get("items") or _branches(resolved)):
                    child = record_words(sub_ref) if sub_ref else [t for t in tokens(name) if t != "id"] or record
                    queue.append((sub, field_path, child, depth + 1))
        elif depth == 0 and path == "":
            # a bare value (a string, a number, a free-form object): one parameter named after what it is
            name = snake(top_record) or "result"
            emit(
                ParamSpec(
                    tool=source.tool_id,
                    env=source.env,
                    direction="output",
                    name=name,
                    json_type=t,
                    description=str(node.get("description") or spec.description),
                    origin="schema",
                )
            )
    return list(found.values())


def _from_description(source: ToolSource, noun: list[str]) -> list[ParamSpec]:
    """No output schema: the tool returns what its name is about, and that thing's id (types unknown)."""
    if not noun:
        return []
    tool, env, desc = source.tool_id, source.env, source.spec.description
    names = record_id_names(noun)
    return [
        ParamSpec(
            tool=tool, env=env, direction="output", name=snake(noun), json_type="any", description=desc,
            origin="description",
        ),
        ParamSpec(
            tool=tool, env=env, direction="output", name=names[0], aliases=names[1:], json_type="any",
            description=f"id of the {' '.join(noun)}", origin="description",
        ),
    ]  # fmt: skip
