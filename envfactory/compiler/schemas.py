"""JSON Schemas taken from a spec, made safe to validate with: known keywords only, checked, bounded.

A spec's schema is data from outside. Before a compiled environment validates arguments or records
with it, it keeps only the JSON Schema keywords it understands with well-formed values, drops regular
expressions that are long or nest quantifiers (Python's `re` has no time limit: a catastrophic
pattern would let one argument hang a server), bounds nesting, and must pass `check_schema`.
"""

from __future__ import annotations

import html
import importlib
import re
import warnings
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from envfactory.env.compiled import schema_problems, type_of, validator_for
from envfactory.env.json_schema import parse_pattern

_JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object", "null"})
_SCALARS = frozenset({"string", "integer", "number", "boolean"})
_NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_TEXT = ("description", "title", "format")
MAX_DEPTH = 8
MAX_PATTERN = 120
MAX_STRING = 10_000  # characters of a string argument or field whose schema states no limit
MAX_ITEMS = 1_000  # items of a list argument or field whose schema states no limit
MAX_PROPERTIES = 200  # properties an object schema keeps
_COUNT_CAP = {"Length": MAX_STRING, "Items": MAX_ITEMS, "Properties": MAX_PROPERTIES}
_LIST_READ = 2_000  # items of a spec's enum or required list read (an enum keeps 200, properties are 200 at most)
# the node kinds of a parsed pattern (`parse_pattern`; a private module, the same since 3.11): what `_ambiguous` reads
_c: Any = importlib.import_module("re._constants")
# a group holding a quantifier, itself quantified: (a+)+, (\w*x)*, (a|aa){2,}
_NESTED_QUANTIFIER = re.compile(r"\([^()]*[+*}][^()]*\)\s*[+*{?]")


# HTML a spec's prose carries (AWS's and Azure's descriptions are HTML): block tags end a line, others go
_BLOCK_TAG = re.compile(r"</?(?:p|br|li|ul|ol|div|h[1-6]|tr|td|th|table|pre|dd|dt|dl)\b[^<>]{0,300}>", re.IGNORECASE)
# only HTML's own elements and AWS's documentation tags: `List<String>`, `projects/<project>`, `Bearer <token>` stay
_TAG = re.compile(
    r"</?(?:a|b|i|u|em|strong|code|tt|kbd|var|samp|cite|abbr|span|small|big|sup|sub|img|hr|section|note"
    r"|important|fullname|para|emphasis|ulink|link|br|p|li|ul|ol|div|h[1-6]|tr|td|th|table|tbody|thead|pre"
    r"|blockquote|dd|dt|dl)\b(?:\s[^<>]{0,300})?/?>",
    re.IGNORECASE,
)


def plain_text(text: str, limit: int) -> str:
    """A spec's prose as a model should read it: HTML tags gone (the text inside kept), entities decoded,
    whitespace one space, cut at a word to at most `limit` characters (with "...")."""
    text = " ".join(html.unescape(_TAG.sub("", _BLOCK_TAG.sub(" ", text))).split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    word = cut.rsplit(" ", 1)[0]
    return (word if len(word) >= limit // 2 else cut).rstrip(" ,;:") + "..."


def safe_pattern(pattern: Any) -> str | None:
    """`pattern` if it is short, compiles, backtracks in no exponential way we can see (`_ambiguous`), and matches
    no string shorter than `MAX_STRING` can hold; else None (the keyword is dropped: values are checked less)."""
    if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN or _NESTED_QUANTIFIER.search(pattern):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "possible nested set": a FutureWarning, not an error
            re.compile(pattern)
        tree = parse_pattern(pattern)
        if _ambiguous(tree.data, False) or tree.getwidth()[0] > MAX_STRING:  # `x{30000000}`: its shortest match
            return None
    except (re.error, RecursionError, OverflowError):
        return None
    return pattern


def _ambiguous(items: list[tuple[Any, Any]], repeated: bool) -> bool:
    """Whether a part of a parsed pattern repeated more than 4 times (or without bound) holds an alternation or a
    repeat of varying length: what lets a match fail in exponentially many ways (`(a|a){40}`, `((a+))+`, which the
    text rule misses). Fixed-width repeats inside (`(\\d{3})+`) and alternations that are one character class
    (`(a|b)+`, the parser's `[ab]+`) are fine; a bounded count over one (`(a+){4}`) is polynomial, and what slips
    through is matched under a time limit everywhere (`env/json_schema.py`, `tasks/values.py`). Of the 2,872
    distinct patterns of the corpus's specs the text rule keeps, 56 go (2 %)."""
    for op, av in items:
        if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
            low, high, sub = av
            if repeated and low != high:
                return True
            if _ambiguous(list(sub), repeated or high == _c.MAXREPEAT or high > 4):
                return True
        elif (op is _c.BRANCH and repeated and len(av[1]) > 1) or any(
            _ambiguous(list(part), repeated) for part in _parts(op, av)
        ):
            return True
    return False


def _parts(op: Any, av: Any) -> list[Any]:
    """The sub-patterns of a parsed node that is no repeat: a group's, an assertion's, an alternation's."""
    if op is _c.SUBPATTERN:
        return [av[-1]]
    if op in (_c.ASSERT, _c.ASSERT_NOT):
        return [av[1]]
    if op is _c.ATOMIC_GROUP:
        return [av]
    if op is _c.BRANCH:
        return list(av[1])
    if op is _c.GROUPREF_EXISTS:
        return [x for x in av[1:] if x is not None]
    return []


def clean(schema: Any, depth: int = 0) -> dict[str, Any]:
    """A copy of `schema` with only understood, well-formed keywords (an empty schema if nothing is left)."""
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return {}
    out: dict[str, Any] = {}
    t = schema.get("type")
    if isinstance(t, str) and t in _JSON_TYPES:
        out["type"] = t
    elif isinstance(t, list) and t and all(isinstance(x, str) and x in _JSON_TYPES for x in t[:16]):
        out["type"] = list(dict.fromkeys(t[:16]))
    for key in _TEXT:
        if isinstance(schema.get(key), str):
            out[key] = plain_text(schema[key], 1000) if key != "format" else schema[key][:40]
    for key in _NUMBERS:
        v = schema.get(key)
        number = v if isinstance(v, int | float) and not isinstance(v, bool) and v == v and abs(v) < 1e300 else None
        if number is not None and (key != "multipleOf" or number > 0):
            out[key] = number
    for key in _COUNTS:
        v = schema.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            # a minimum past the bounds below (a spec asked for 400 million characters): no value is made to it
            out[key] = min(v, _COUNT_CAP[key[3:]]) if key.startswith("min") else v
    # a list is read only as far as it is kept (and a little past: duplicates): one list a spec's schemas share by
    # reference (an enum of 100k values in 1,000 properties) is otherwise scanned whole at every use (54 s)
    enum = schema.get("enum")
    head = enum[:_LIST_READ] if isinstance(enum, list) else None
    if head and all(isinstance(x, str | int | float | bool) or x is None for x in head):
        out["enum"] = list(dict.fromkeys(head))[:200]  # 1 and True are one key
    if "default" in schema and isinstance(schema["default"], str | int | float | bool):
        out["default"] = schema["default"]
    pattern = safe_pattern(schema.get("pattern"))
    if pattern is not None:
        out["pattern"] = pattern
    props = schema.get("properties")
    if isinstance(props, dict):
        out["properties"] = {str(k): clean(v, depth + 1) for k, v in list(props.items())[:MAX_PROPERTIES] if str(k)}
    req = schema.get("required")
    if isinstance(req, list) and "properties" in out:
        names = [r for r in req[:_LIST_READ] if isinstance(r, str)]
        out["required"] = [r for r in dict.fromkeys(names) if r in out["properties"]]
        if not out["required"]:
            del out["required"]
    if "items" in schema and isinstance(schema["items"], dict):
        out["items"] = clean(schema["items"], depth + 1)
    for key in ("anyOf", "oneOf"):
        v = schema.get(key)
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            out["anyOf"] = [clean(x, depth + 1) for x in v[:20]]  # oneOf's exclusivity is not ours to police
            break
    if "uniqueItems" in schema and isinstance(schema["uniqueItems"], bool):
        out["uniqueItems"] = schema["uniqueItems"]
    if "examples" in schema and isinstance(schema["examples"], list):
        out["examples"] = [x for x in schema["examples"][:3] if isinstance(x, str | int | float | bool)]
        if not out["examples"]:
            del out["examples"]
    if "type" not in out and "properties" in out:
        out["type"] = "object"
    # what any real server bounds: a string or a list with no stated limit still has one
    if type_of(out) == "string" and "enum" not in out:
        out["maxLength"] = min(out.get("maxLength", MAX_STRING), MAX_STRING)
    if type_of(out) == "array":
        out["maxItems"] = min(out.get("maxItems", MAX_ITEMS), MAX_ITEMS)
    if "default" in out and schema_problems(validator_for(out), out["default"], "default"):
        # a default its own schema refuses ("age": integer, default "notint"): filled into every record a create
        # left it out of, it made the tool refuse calls its schema allows
        del out["default"]
    return out


def checked(schema: dict[str, Any]) -> dict[str, Any] | None:
    """`schema` if `jsonschema` accepts it as a Draft 2020-12 schema, else None (slow: ~5 ms; `clean`'s output
    always passes, which the tests check, so the compiler does not call it)."""
    try:
        Draft202012Validator.check_schema(schema)
    except (SchemaError, RecursionError):
        return None
    return schema


def scalar(schema: dict[str, Any]) -> bool:
    """A schema of one plain value (a string, a number, a boolean, an enum of those)."""
    t = schema.get("type")
    types = t if isinstance(t, list) else [t]
    return bool(schema.get("enum")) or (
        bool(types) and all(x in _SCALARS or x == "null" for x in types) and None not in types
    )
