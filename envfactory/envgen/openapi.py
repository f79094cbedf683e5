"""OpenAPI → environment metadata, deterministically (no LLM): the Search Agent's fast path for API docs.

Each operation becomes a tool: its name from `operationId` (snake_cased) or from method and path;
safe HTTP methods (GET, HEAD, OPTIONS, TRACE) are `read` tools, the others `write`; path, query
and header parameters plus the properties of a JSON (or form) request body form the input schema;
the first 2xx JSON response schema is the output schema. Local `$ref`s are inlined (a recursive
reference becomes a stub object). OpenAPI 3.0 and 3.1 are supported, Swagger 2.0 minimally.

Parameter names are snake_cased into Python identifiers, because an environment's tools are
Python functions whose signatures must agree with the metadata.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import keyword
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import unquote

from envfactory.env.metadata import Domain, EnvMetadata, parse_metadata
from envfactory.errors import DataError, EnvFactoryError, MetadataError
from envfactory.inputs import MAX_DEPTH, MAX_INT_DIGITS, parse_json, parse_yaml, read_file_bytes
from envfactory.words import snake_case

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
READ_METHODS = frozenset({"get", "head", "options", "trace"})
_PARAM_LOCATIONS = ("path", "query", "header")
_JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object", "null"})
# loose spellings seen in hand-written docs; Swagger 2's `file` is an uploaded binary string
_TYPE_ALIASES = {
    "int": "integer",
    "long": "integer",
    "float": "number",
    "double": "number",
    "bool": "boolean",
    "str": "string",
    "file": "string",
    "dict": "object",
    "list": "array",
}
# JSON Schema keywords carried over as they are; OpenAPI-only ones (xml, discriminator, readOnly...) are dropped
_KEEP = frozenset(
    {
        "title",
        "description",
        "enum",
        "const",
        "format",
        "default",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "required",
        "examples",
    }
)
_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


class OpenAPIError(MetadataError):
    """An OpenAPI document that cannot be converted; names the file and the JSON path."""


@dataclass(frozen=True)
class _Cycle:
    """A `$ref` met again while it is being expanded."""

    ref: str
    target: Any


def identifier(text: str, fallback: str = "param") -> str:
    """A Python identifier from `text`: snake_cased, never a keyword, never starting with a digit."""
    s = snake_case(text) or fallback
    if s[0].isdigit():
        s = f"{fallback}_{s}"
    return f"{s}_" if keyword.iskeyword(s) else s


def _key(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if re.fullmatch(r"[A-Za-z_$][A-Za-z0-9_$-]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


class SpecChangedError(DataError):
    """A spec file whose bytes are not the ones recorded for it (a cached corpus spec edited since extraction)."""


def load_openapi(path: str | Path, *, sha256: str | None = None) -> dict[str, Any]:
    """Read an OpenAPI document from a JSON or YAML file; with `sha256`, only the very bytes recorded (the ones read
    are the ones checked and parsed)."""
    p = Path(path)

    def cannot_read(message: str) -> OpenAPIError:
        return OpenAPIError(str(p), "<file>", "cannot read: " + message.removeprefix(f"{p}: "))

    data = read_file_bytes(p, what="OpenAPI document", error=cannot_read)
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise SpecChangedError(
            f"{p}: the spec changed since it was recorded (sha256 {sha256[:12]}…): "
            "run `envfactory corpus fetch --force`"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise cannot_read(f"not valid UTF-8 (byte {e.start})") from None
    kind = "JSON" if p.suffix.lower() == ".json" else "YAML"

    def invalid(message: str) -> OpenAPIError:
        problem = message.removeprefix(f"{p}: ")
        problem = problem.removeprefix(f"invalid {kind}") if problem.startswith(f"invalid {kind}") else f": {problem}"
        return OpenAPIError(str(p), "<file>", f"not valid {kind}{problem}")

    if kind == "JSON":
        data = parse_json(text, str(p), error=invalid)
    else:
        data = parse_openapi_yaml(text, str(p), error=invalid)
    if not isinstance(data, dict):
        raise OpenAPIError(str(p), "<root>", f"expected an object, got {type(data).__name__}")
    return data


def parse_openapi_yaml(text: str, source: str, *, error: Any, max_depth: int = MAX_DEPTH) -> Any:
    """A YAML OpenAPI document read as its JSON form would be: YAML 1.2's core scalars (`on`, `yes` and `no`
    are strings, `09:30` is not a base-60 number, `1e3` is a number, a date is its text) and every mapping key a
    string (`200:` is "200"). Every route that reads a spec reads it so (`load_openapi`, the corpus)."""
    return _string_keys(parse_yaml(text, source, error=error, loader=_core_loader(), max_depth=max_depth), {})


@functools.cache
def _core_loader() -> Any:
    """YAML's safe loader with YAML 1.2's core schema for plain scalars (that of JSON): booleans `true`/`false`
    only, decimal integers without leading zeros, floats with or without a dot (`1e3`), no sexagesimal numbers
    and no timestamps. YAML 1.1 reads `on`/`off`/`yes`/`no` as booleans and `09:30` as 570, so an API whose
    record has a field `on` (or an enum of times) would lose its names. (Built on first use: `yaml` is imported
    only when a YAML document is read.)"""
    import yaml

    class CoreLoader(yaml.SafeLoader):
        pass

    replaced = {f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "timestamp")}
    CoreLoader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in replaced]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    CoreLoader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )
    digits = list("-+0123456789")
    CoreLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9]+$"), digits)

    def decimal(loader: Any, node: Any) -> int:  # `012` is twelve (YAML 1.1's constructor reads it as octal)
        text = loader.construct_scalar(node)
        digits = len(text.lstrip("+-").replace("_", ""))
        if digits > MAX_INT_DIGITS:  # as JSON's reader refuses it (CPython reads one in quadratic time, or not)
            problem = f"an integer of {digits} digits (at most {MAX_INT_DIGITS} are read)"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark)
        try:
            return int(text, 10)
        except ValueError:  # an explicit !!int 0x1F
            try:
                return int(yaml.SafeLoader.construct_yaml_int(loader, node))
            except ValueError as e:
                raise yaml.constructor.ConstructorError(None, None, f"not an integer: {e}", node.start_mark) from None

    CoreLoader.add_constructor("tag:yaml.org,2002:int", decimal)
    CoreLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(
            r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
        ),
        list("-+0123456789."),
    )
    return CoreLoader


def _string_keys(value: Any, done: dict[int, Any]) -> Any:
    """`value` with every mapping key as JSON writes it (YAML keys may be numbers or null). A node YAML shares
    (an alias) is converted once and stays shared: a small document of nested aliases is no large one."""
    if isinstance(value, dict | list):
        hit = done.get(id(value))
        if hit is not None:
            return hit
        if isinstance(value, dict):
            out: Any = {}
            done[id(value)] = out
            out.update({_json_key(k): _string_keys(v, done) for k, v in value.items()})
        else:
            out = []
            done[id(value)] = out
            out.extend(_string_keys(v, done) for v in value)
        return out
    return value


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool):
        return json.dumps(key)
    return str(key)


class _Converter:
    def __init__(self, doc: dict[str, Any], source: str) -> None:
        self.doc, self.source = doc, source
        if "openapi" in doc:
            version = str(doc["openapi"])
            if not version.startswith("3."):
                self.fail("openapi", f"unsupported OpenAPI version {version!r} (3.x is supported)")
            self.v2 = False
        elif "swagger" in doc:
            if str(doc["swagger"]) != "2.0":
                self.fail("swagger", f"unsupported Swagger version {doc['swagger']!r} (2.0 is supported)")
            self.v2 = True
        else:
            self.fail("<root>", "not an OpenAPI document: no 'openapi' or 'swagger' key")

    def fail(self, path: str, problem: str) -> NoReturn:
        raise OpenAPIError(self.source, path or "<root>", problem)

    # ---- $ref ------------------------------------------------------------------------------------
    def lookup(self, ref: Any, path: str) -> tuple[Any, str]:
        if not isinstance(ref, str):
            self.fail(_key(path, "$ref"), "must be a string")
        if not ref.startswith("#"):
            self.fail(_key(path, "$ref"), f"external reference {ref!r} is not supported (only '#/...')")
        node: Any = self.doc
        where = ""
        for raw in unquote(ref[1:]).split("/")[1:]:
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                self.fail(_key(path, "$ref"), f"reference {ref!r} does not resolve")
            where = _key(where, part)
        return node, where

    def deref(self, node: Any, path: str, stack: tuple[str, ...] = ()) -> tuple[Any, str, tuple[str, ...]]:
        """Follow `$ref` chains; `stack` holds the refs being expanded (for the cycle guard).

        A reference already on the stack comes back as a `_Cycle` instead of being expanded again.
        """
        hops = 0
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            target, where = self.lookup(ref, path)
            if ref in stack:
                return _Cycle(ref, target), path, stack
            # OpenAPI 3.1 lets a $ref carry its own description/summary: it wins over the target's
            extra = {k: v for k, v in node.items() if k in ("description", "summary")}
            node = {**target, **extra} if extra and isinstance(target, dict) else target
            path, stack = where, (*stack, ref)
            hops += 1
            if hops > 64:
                self.fail(path, "reference chain too long")
        return node, path, stack

    # ---- schemas -----------------------------------------------------------------------------------
    def schema(self, node: Any, path: str, stack: tuple[str, ...] = ()) -> dict[str, Any]:
        node, path, stack = self.deref(node, path, stack)
        if isinstance(node, _Cycle):
            kind = node.target.get("type") if isinstance(node.target, dict) else None
            name = node.ref.rsplit("/", 1)[-1]
            return {
                "type": kind if isinstance(kind, str) and kind in _JSON_TYPES else "object",
                "description": f"recursive reference to {name}",
            }
        if isinstance(node, bool):
            return {} if node else {"not": {}}
        if not isinstance(node, dict):
            self.fail(path, f"expected a schema object, got {type(node).__name__}")
        out: dict[str, Any] = {}
        for i, part in enumerate(node.get("allOf", []) if isinstance(node.get("allOf"), list) else []):
            self.merge(out, self.schema(part, _key(_key(path, "allOf"), i), stack))
        own: dict[str, Any] = {}
        for key, value in node.items():
            at = _key(path, key)
            if key == "type":
                own["type"] = self.json_type(value, at)
            elif key == "properties":
                if not isinstance(value, dict):
                    self.fail(at, "must be an object mapping property names to schemas")
                own["properties"] = {k: self.schema(v, _key(at, k), stack) for k, v in value.items()}
            elif key == "items":
                own["items"] = self.schema(value, at, stack)
            elif key == "additionalProperties":
                own[key] = value if isinstance(value, bool) else self.schema(value, at, stack)
            elif key in ("oneOf", "anyOf"):
                if not isinstance(value, list):
                    self.fail(at, "must be a list of schemas")
                own[key] = [self.schema(v, _key(at, i), stack) for i, v in enumerate(value)]
            elif key == "not":
                own[key] = self.schema(value, at, stack)
            elif key == "example":
                own.setdefault("examples", [value])
            elif key == "required" and not isinstance(value, list):
                continue  # Swagger-style `required: true` on a property: not JSON Schema
            elif key in _KEEP:
                own[key] = value
        self.merge(out, own)
        if node.get("nullable") is True and "type" in out:
            types = out["type"] if isinstance(out["type"], list) else [out["type"]]
            out["type"] = [*types, "null"] if "null" not in types else types
        if "type" not in out:
            if "properties" in out:
                out["type"] = "object"
            elif "items" in out:
                out["type"] = "array"
        return out

    @staticmethod
    def merge(into: dict[str, Any], part: dict[str, Any]) -> None:
        """allOf: properties and required accumulate; for other keywords the later part wins."""
        for key, value in part.items():
            if key == "properties":
                into.setdefault("properties", {}).update(value)
            elif key == "required" and isinstance(value, list):
                names = [n for n in value if isinstance(n, str)]  # (a spec's `required: [{}]` names nothing)
                into["required"] = list(dict.fromkeys([*into.get("required", []), *names]))
            else:
                into[key] = value

    def json_type(self, value: Any, path: str) -> str | list[str]:
        values = value if isinstance(value, list) else [value]
        out: list[str] = []
        for v in values:
            t = _TYPE_ALIASES.get(v, v) if isinstance(v, str) else v
            if not isinstance(t, str) or t not in _JSON_TYPES:
                self.fail(path, f"unknown type {v!r} (expected one of {', '.join(sorted(_JSON_TYPES))})")
            out.append(t)
        return out if isinstance(value, list) else out[0]

    # ---- operations --------------------------------------------------------------------------------
    def operations(self) -> Iterator[tuple[str, str, dict[str, Any], tuple[Any, str], str]]:
        """(route, method, operation, (path-level parameters, their JSON path), operation JSON path)."""
        paths = self.doc.get("paths")
        if not isinstance(paths, dict):
            self.fail("paths", "missing or not an object")
        for route, item in paths.items():
            at = _key("paths", route)
            if str(route).startswith("x-"):
                continue
            item, at, _ = self.deref(item, at)
            if not isinstance(item, dict):
                self.fail(at, "a path item must be an object")
            shared = (item.get("parameters", []), _key(at, "parameters"))
            for method in HTTP_METHODS:
                if method in item:
                    op = item[method]
                    if not isinstance(op, dict):
                        self.fail(_key(at, method), "an operation must be an object")
                    yield str(route), method, op, shared, _key(at, method)

    def parameters(self, shared: tuple[Any, str], own: Any, path: str) -> list[tuple[dict[str, Any], str]]:
        """Path-level and operation-level parameters, the operation's overriding by (name, in)."""
        merged: dict[tuple[str, str], tuple[dict[str, Any], str]] = {}
        for params, base in (shared, (own, _key(path, "parameters"))):
            if not isinstance(params, list):
                self.fail(base, "must be a list")
            for i, raw in enumerate(params):
                p, at, _ = self.deref(raw, _key(base, i))
                if not isinstance(p, dict) or not isinstance(p.get("name"), str) or not isinstance(p.get("in"), str):
                    self.fail(at, "a parameter needs a string 'name' and 'in'")
                merged[(p["name"], p["in"])] = (p, at)
        return list(merged.values())

    def param_schema(self, p: dict[str, Any], at: str) -> dict[str, Any]:
        if "schema" in p:
            schema = self.schema(p["schema"], _key(at, "schema"))
        elif "content" in p and isinstance(p["content"], dict) and p["content"]:
            media = next(iter(p["content"].values()))
            media = media if isinstance(media, dict) else {}  # (`application/json: null`: no schema given)
            schema = self.schema(media.get("schema", {}), _key(at, "content"))
        else:
            # Swagger 2.0 (and sloppy 3.x docs) put the schema keywords on the parameter itself
            fields = {k: v for k, v in p.items() if k in _KEEP or k in ("type", "items")}
            fields.pop("required", None)
            fields.pop("description", None)
            schema = self.schema(fields, at)
            if "type" not in schema:
                schema["type"] = "string"
        if p.get("description") and "description" not in schema:
            schema["description"] = p["description"]
        return schema

    def body(self, op: dict[str, Any], path: str, params: list[tuple[dict[str, Any], str]]) -> tuple[Any, str, bool]:
        """The request body schema (raw), its path, and whether the body is required."""
        if self.v2:
            bodies = [(p, at) for p, at in params if p["in"] == "body"]
            if bodies:
                p, at = bodies[0]
                return p.get("schema", {}), _key(at, "schema"), bool(p.get("required", True))
            form = [(p, at) for p, at in params if p["in"] == "formData"]
            if form:
                props = {p["name"]: self.param_schema(p, at) for p, at in form}
                req = [p["name"] for p, _ in form if p.get("required")]
                return {"type": "object", "properties": props, "required": req}, path, True
            return None, path, False
        if "requestBody" not in op:
            return None, path, False
        rb, at, _ = self.deref(op["requestBody"], _key(path, "requestBody"))
        if not isinstance(rb, dict):
            self.fail(at, "must be an object")
        content = rb.get("content", {})
        if not isinstance(content, dict):
            self.fail(_key(at, "content"), "must be an object")
        media_type = _pick_media(content, _FORM_TYPES)
        if media_type is None:
            return None, path, False
        media = content[media_type]
        if not isinstance(media, dict):
            self.fail(_key(_key(at, "content"), media_type), "must be an object")
        # requestBody.required defaults to false in OpenAPI, yet most docs omit it while meaning a required
        # body: the body's own `required` list counts unless the body is explicitly optional
        schema_at = _key(_key(_key(at, "content"), media_type), "schema")
        return media.get("schema", {}), schema_at, bool(rb.get("required", True))

    def output(self, op: dict[str, Any], path: str) -> dict[str, Any] | None:
        responses = op.get("responses", {})
        at = _key(path, "responses")
        if not isinstance(responses, dict):
            self.fail(at, "must be an object")
        codes = sorted(str(c) for c in responses if str(c).startswith("2"))
        for code in codes:
            resp, rat, _ = self.deref(responses[code] if code in responses else responses[int(code)], _key(at, code))
            if not isinstance(resp, dict):
                self.fail(rat, "a response must be an object")
            if self.v2:
                if "schema" in resp:
                    return self.schema(resp["schema"], _key(rat, "schema"))
                continue
            content = resp.get("content", {})
            if not isinstance(content, dict):
                self.fail(_key(rat, "content"), "must be an object")
            media_type = _pick_media(content, ())
            if media_type is not None and isinstance(content[media_type], dict) and "schema" in content[media_type]:
                return self.schema(
                    content[media_type]["schema"], _key(_key(_key(rat, "content"), media_type), "schema")
                )
        return None

    def tool(self, route: str, method: str, op: dict[str, Any], shared: tuple[Any, str], path: str) -> dict[str, Any]:
        params = self.parameters(shared, op.get("parameters", []), path)
        properties: dict[str, Any] = {}
        required: list[str] = []

        def add(name: str, schema: dict[str, Any], is_required: bool, location: str) -> None:
            key = identifier(name)
            if key in properties:
                key = f"{key}_{location}"
            properties[key] = schema
            if is_required:
                required.append(key)

        for p, at in params:
            if p["in"] in _PARAM_LOCATIONS:
                add(p["name"], self.param_schema(p, at), p["in"] == "path" or bool(p.get("required")), p["in"])
        # a template variable the document forgot to declare is still a required input of the operation
        declared = {p["name"] for p, _ in params if p["in"] == "path"}
        for var in re.findall(r"{([^{}]+)}", route):
            if var not in declared:
                add(var, {"type": "string"}, True, "path")
        raw_body, body_path, body_required = self.body(op, path, params)
        if raw_body is not None:
            body = self.schema(raw_body, body_path)
            if body.get("type") == "object" or "properties" in body:
                body_req = set(body.get("required", [])) if body_required else set()
                for pname, pschema in body.get("properties", {}).items():
                    add(pname, pschema, pname in body_req, "body")
            else:
                add("body", body, bool(body_required), "body")
        summary = str(op.get("summary") or "").strip()
        details = str(op.get("description") or "").strip()
        if summary and details and details != summary:
            description = f"{summary.rstrip('.')}. {details}"
        else:
            description = summary or details or f"{method.upper()} {route}"
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = required
        out: dict[str, Any] = {
            "name": "",
            "description": description,
            "kind": "read" if method in READ_METHODS else "write",
            "input_schema": schema,
        }
        output = self.output(op, path)
        if output is not None:
            out["output_schema"] = output
        return out

    def tools(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        seen: set[str] = set()
        for route, method, op, shared, path in self.operations():
            op_id = op.get("operationId")
            base = identifier(op_id, "op") if isinstance(op_id, str) and op_id.strip() else ""
            base = base or identifier(f"{method} {re.sub(r'[{}]', '', route)}", "op")
            name, n = base, 2
            while name in seen:
                name, n = f"{base}_{n}", n + 1
            seen.add(name)
            tool = self.tool(route, method, op, shared, path)
            tool["name"] = name
            tools.append(tool)
        if not tools:
            self.fail("paths", "the document defines no operations")
        return tools


def _pick_media(content: dict[str, Any], fallbacks: tuple[str, ...]) -> str | None:
    """The JSON media type of a content map (`application/json`, `...+json`, `*/*`), else a fallback."""
    types = [str(t) for t in content]
    for t in types:
        if t.split(";")[0].strip() == "application/json":
            return t
    for t in types:
        base = t.split(";")[0].strip()
        if base.endswith("+json") or base in ("*/*", "application/*"):
            return t
    for t in types:
        if t.split(";")[0].strip() in fallbacks:
            return t
    return None


def openapi_to_metadata(
    doc: dict[str, Any] | str | Path,
    *,
    name: str | None = None,
    domain: Domain,
    description: str | None = None,
) -> EnvMetadata:
    """Environment metadata from an OpenAPI 3.x (or Swagger 2.0) document or file.

    `name` defaults to the snake_cased `info.title`, `description` to `info.description` (else
    the title). Raises `OpenAPIError` naming the file and the JSON path of the problem.
    """
    if isinstance(doc, dict):
        source, data = "<openapi>", doc
    else:
        source, data = str(doc), load_openapi(doc)
    with malformed_as_openapi_error(source):
        return _to_metadata(data, source, name, domain, description)


@contextlib.contextmanager
def malformed_as_openapi_error(source: str) -> Iterator[None]:
    """A document the converter meets in a shape it does not expect — a `$ref` chain deeper than the stack, a
    keyword whose value has a type no spec gives it — is an `OpenAPIError` naming it, not a crash: the document
    is data from outside, and a batch records it as a failure and goes on."""
    try:
        yield
    except RecursionError:
        raise OpenAPIError(source, "<root>", "nested too deeply to convert (a chain of $refs?)") from None
    except (TypeError, AttributeError, KeyError, IndexError, ValueError) as e:
        if isinstance(e, EnvFactoryError):
            raise
        problem = f"a part of it has a shape no OpenAPI document gives it ({type(e).__name__}: {str(e)[:160]})"
        raise OpenAPIError(source, "<document>", problem) from None


def _to_metadata(
    data: dict[str, Any], source: str, name: str | None, domain: Domain, description: str | None
) -> EnvMetadata:
    conv = _Converter(data, source)
    info = data.get("info", {})
    if not isinstance(info, dict):
        conv.fail("info", "must be an object")
    title = str(info.get("title") or "").strip()
    env_name = name or (identifier(title, "api") if title else None)
    if not env_name:
        conv.fail("info.title", "missing: pass name= or give the document a title")
    env_description = description or str(info.get("description") or "").strip() or title
    if not env_description:
        conv.fail("info.description", "missing: pass description= or give the document a description")
    meta = {
        "name": env_name,
        "description": env_description,
        "domain": domain,
        "source": f"openapi:{Path(source).name if source != '<openapi>' else title or 'document'}",
        "tools": conv.tools(),
    }
    return parse_metadata(meta, source)
