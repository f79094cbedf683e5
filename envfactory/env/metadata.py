"""Environment metadata `m`: what an agent sees of an environment (descriptions and schemas)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from envfactory.errors import MetadataError
from envfactory.inputs import read_json, write_atomic

Domain = Literal["commerce", "finance", "travel", "office", "lifestyle", "research", "utilities"]
DOMAINS: tuple[str, ...] = Domain.__args__  # type: ignore[attr-defined]
ToolKind = Literal["read", "write"]

# names are checked with fullmatch: `$` would also match before a trailing newline ("hotels\n")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_NAME_MAX = 64  # an environment's name is a folder name, a module name and part of file names
ENV_NAME = re.compile(rf"[A-Za-z_][A-Za-z0-9_]{{0,{ENV_NAME_MAX - 1}}}")
M = TypeVar("M", bound=BaseModel)
_JSON_TYPES = {"string", "integer", "number", "boolean", "array", "object", "null"}


class ToolSpec(BaseModel):
    """One tool: name, description, kind, JSON-Schema input parameters, output schema."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = Field(min_length=1)
    kind: ToolKind
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    output_schema: dict[str, Any] | None = None

    @field_validator("name")
    @classmethod
    def _identifier(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(f"'{v}' is not a valid tool name (letters, digits, underscore; not starting with a digit)")
        return v

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v.get("type") != "object":
            raise ValueError('must be a JSON Schema with "type": "object"')
        props = v.get("properties", {})
        if not isinstance(props, dict):
            raise ValueError("'properties' must be an object mapping parameter names to schemas")
        for pname, pschema in props.items():
            if not isinstance(pschema, dict):
                raise ValueError(f"parameter '{pname}' must have a schema object")
            ptype = pschema.get("type")
            types = ptype if isinstance(ptype, list) else [ptype] if ptype else []
            bad = [t for t in types if t not in _JSON_TYPES]
            if bad:
                raise ValueError(f"parameter '{pname}' has unknown JSON type {bad[0]!r}")
        required = v.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise ValueError("'required' must be a list of parameter names")
        missing = [r for r in required if r not in props]
        if missing:
            raise ValueError(f"'required' names '{missing[0]}', which is not in 'properties'")
        return v

    @property
    def parameters(self) -> dict[str, dict[str, Any]]:
        return dict(self.input_schema.get("properties", {}))

    @property
    def required(self) -> list[str]:
        return list(self.input_schema.get("required", []))


class _EnvHead(BaseModel):
    """The fields of an environment's metadata besides its tools."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = Field(min_length=1)
    domain: Domain
    version: str = "1"
    source: str | None = Field(default=None, description="where it came from: hand-written, bfcl:<class>, envgen")

    @field_validator("name")
    @classmethod
    def _identifier(cls, v: str) -> str:
        if not ENV_NAME.fullmatch(v):
            shown = v if len(v) <= 80 else v[:77] + "..."
            raise ValueError(
                f"{shown!r} is not a valid environment name"
                f" (letters, digits, underscore; at most {ENV_NAME_MAX} characters)"
            )
        return v


class EnvMetadata(_EnvHead):
    """Metadata of one environment, as stored in `envs/<name>/metadata.json`."""

    tools: list[ToolSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_tools(self) -> EnvMetadata:
        seen: set[str] = set()
        for t in self.tools:
            if t.name in seen:
                raise ValueError(f"tool '{t.name}' is defined twice")
            seen.add(t.name)
        return self

    def tool(self, name: str) -> ToolSpec:
        for t in self.tools:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.tools]


class _ToolHead(BaseModel):
    """A tool as a listing reads it: its name and kind (its schemas are checked when the environment is built)."""

    name: str
    kind: ToolKind


class _MetadataHead(_EnvHead):
    tools: list[_ToolHead] = Field(min_length=1)


class MetadataSummary(_EnvHead):
    """What a listing shows of an environment's metadata: its fields and how many tools (write tools) it has.

    Read from `metadata.json` without validating every tool's schemas (`summarize_metadata`): listing a
    pool of hundreds of environments, some with megabytes of schemas, costs a parse, not a build."""

    tools: int
    write_tools: int

    @classmethod
    def of(cls, meta: EnvMetadata) -> MetadataSummary:
        head = meta.model_dump(exclude={"tools"})
        return cls(**head, tools=len(meta.tools), write_tools=sum(t.kind == "write" for t in meta.tools))


def _field_path(loc: tuple[int | str, ...], data: Any) -> str:
    """Render a pydantic error location with tool names instead of list indices where possible."""
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, int) and isinstance(node, list) and 0 <= item < len(node):
            elem = node[item]
            name = elem.get("name") if isinstance(elem, dict) else None
            parts.append(f"[{item}]" + (f"({name})" if name else ""))
            node = elem
        else:
            parts.append(("." if parts else "") + str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts) or "<root>"


def _validated(model: type[M], data: Any, source: str) -> M:
    if not isinstance(data, dict):
        raise MetadataError(source, "<root>", f"expected a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        more = f" (and {e.error_count() - 1} more problems)" if e.error_count() > 1 else ""
        raise MetadataError(source, _field_path(tuple(err["loc"]), data), msg + more) from None


def parse_metadata(data: Any, source: str = "<metadata>") -> EnvMetadata:
    """Validate a metadata object; errors name the source, the field and the problem."""
    return _validated(EnvMetadata, data, source)


def summarize_metadata(data: Any, source: str = "<metadata>") -> MetadataSummary:
    """A metadata object's summary: its fields checked as `parse_metadata` checks them, each tool's name and
    kind, nothing of its schemas (so a listing does not pay for them; the build checks them all)."""
    head = _validated(_MetadataHead, data, source)
    seen: set[str] = set()
    for t in head.tools:
        if t.name in seen:
            raise MetadataError(source, "tools", f"tool '{t.name}' is defined twice")
        seen.add(t.name)
    fields = head.model_dump(exclude={"tools"})
    return MetadataSummary(**fields, tools=len(head.tools), write_tools=sum(t.kind == "write" for t in head.tools))


def load_metadata(path: str | Path) -> EnvMetadata:
    """Load and validate `metadata.json`."""
    p = Path(path)
    data = read_json(
        p,
        what="metadata file",
        error=lambda m: MetadataError(str(p), "<file>", "cannot read: " + m.removeprefix(f"{p}: ")),
    )
    return parse_metadata(data, str(p))


def metadata_json(meta: EnvMetadata) -> str:
    """`metadata.json`'s text."""
    return json.dumps(meta.model_dump(mode="json", exclude_none=True), indent=2) + "\n"


def dump_metadata(meta: EnvMetadata, path: str | Path) -> None:
    write_atomic(Path(path), metadata_json(meta))
