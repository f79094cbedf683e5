"""The tool list one training row carries: every tool of its environments, or only those it needs, compact or not.

With `ExportOptions.tools = "needed"` a row's list is the tools its assistant messages call (history and
completion; for an RL row, its history and its ground truth) plus `distractors` other tools of the same
environments, picked by a generator seeded with `ExportOptions.seed` and the row's id — the same row gets the
same list in every export and every format, and the model still has to choose among tools. With no call in the
row (an answer-only turn) the distractors come from the conversation's environments. The list keeps the
environments' own order, so a tool's place says nothing about whether it is needed.

`schemas = "compact"` renders each tool's JSON schema without what carries nothing for the model (`title`,
`$schema`, a `null` default, an empty `required` or description) and cuts descriptions — the tool's and each
parameter's — to their first sentence, at most `DESCRIPTION_CHARS` characters. The schema's meaning (types,
enums, formats, required parameters, non-null defaults, `$ref`s) is kept.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from typing import Any

from envfactory.export.messages import ChatMessage
from envfactory.export.options import ExportOptions
from envfactory.export.tools_schema import FunctionSchema, ToolNamer, ToolSchema

DESCRIPTION_CHARS = 120
# keywords whose value is a map of name → schema, a list of schemas, or one schema
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_SCHEMA_ONE = frozenset(
    {"items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames", "unevaluatedItems"}
)
_NOTHING = frozenset({"title", "$schema", "$comment"})
_SENTENCE_END = re.compile(r"[.!?]\s+(?=[A-Z])")  # a sentence ends before a capital letter...
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "approx.", "incl.", "no.")  # ...unless the period is one of these


def called_names(messages: Iterable[ChatMessage]) -> set[str]:
    """The exported names of the tools the assistant messages call."""
    return {c.function.name for m in messages if m.role == "assistant" for c in m.tool_calls or []}


def short_description(text: str, limit: int = DESCRIPTION_CHARS) -> str:
    """The first sentence of `text` on one line, cut at a word to at most `limit` characters (then `…`)."""
    line = " ".join(text.split())
    first = line
    for end in _SENTENCE_END.finditer(line):
        if not line[: end.start() + 1].lower().endswith(_ABBREVIATIONS):
            first = line[: end.start() + 1]
            break
    if len(first) <= limit:
        return first
    space = first.rfind(" ", 0, limit)  # the last word boundary that leaves room for the `…`
    cut = first[:space] if space > limit // 2 else first[: limit - 1]
    return cut.rstrip(" ,;:") + "…"


def compact_schema(schema: Any) -> Any:
    """A JSON schema without `title`s, `$schema`, null defaults, empty `required` lists and empty descriptions,
    its descriptions shortened; property names (keys of `properties`) are never taken for keywords."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _NOTHING or (key == "default" and value is None) or (key == "required" and value == []):
            continue
        if key == "description" and isinstance(value, str):
            if short := short_description(value):
                out[key] = short
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: compact_schema(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [compact_schema(sub) for sub in value]
        elif key in _SCHEMA_ONE and isinstance(value, dict):
            out[key] = compact_schema(value)
        else:
            out[key] = value
    return out


def compact_tool(tool: ToolSchema) -> ToolSchema:
    fn = tool.function
    return ToolSchema(
        function=FunctionSchema(
            name=fn.name, description=short_description(fn.description), parameters=compact_schema(fn.parameters)
        )
    )


def needed_tools(
    tools: list[ToolSchema], namer: ToolNamer, called: set[str], row_id: str, options: ExportOptions
) -> list[ToolSchema]:
    """The called tools of `tools` plus `options.distractors` others of the same environments (see the module)."""
    needed = {t.function.name for t in tools if t.function.name in called}
    servers = {route[0] for name in needed if (route := namer.resolve(name)) is not None}

    def same_env(name: str) -> bool:
        route = namer.resolve(name)
        return not servers or (route is not None and route[0] in servers)

    others = [t.function.name for t in tools if t.function.name not in needed and same_env(t.function.name)]
    rng = random.Random(f"{options.seed}:{row_id}")
    chosen = set(rng.sample(others, min(options.distractors, len(others))))
    return [t for t in tools if t.function.name in needed or t.function.name in chosen]


def row_tools(
    tools: list[ToolSchema],
    namer: ToolNamer,
    messages: Iterable[ChatMessage],
    row_id: str,
    options: ExportOptions,
) -> list[ToolSchema]:
    """The tool list of one row: `tools` (the conversation's), narrowed and rendered as `options` say."""
    if options.tools == "needed":
        tools = needed_tools(tools, namer, called_names(messages), row_id, options)
    if options.schemas == "compact":
        tools = [compact_tool(t) for t in tools]
    return tools
