"""One spec: its document (JSON or YAML, bounded), its provenance, its operations.

Operations are listed through the OpenAPI converter EnvGen uses (`envfactory.envgen.openapi`): it
checks the version (OpenAPI 3.x or Swagger 2.0) and resolves `$ref`s, here those of path items; the
full conversion of an operation's schemas happens when a spec is used (EnvGen, the compiler), not
for every spec of the corpus. Every string is the spec's own: it is kept as data and shown escaped.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from envfactory.corpus.domains import domain_of
from envfactory.corpus.models import CorpusError, Operation, SpecEntry
from envfactory.env.metadata import ENV_NAME_MAX
from envfactory.envgen.openapi import OpenAPIError, _Converter, identifier, parse_openapi_yaml
from envfactory.inputs import parse_json

_SUMMARY_CHARS = 200

# (pattern over the licence's url, pattern over its name) → id; the first match wins, so the
# restricted Creative Commons variants come before plain CC-BY
_LICENCES: tuple[tuple[str, str, str], ...] = (
    ("CC-BY-NC-ND-4.0", r"by-nc-nd/4\.0", r"\bBY-NC-ND[- ]4\.0\b"),
    ("CC-BY-NC-ND-2.0", r"by-nc-nd/2\.0", r"\bBY-NC-ND\b"),
    ("CC-BY-NC-SA-4.0", r"by-nc-sa/4\.0", r"NonCommercial-ShareAlike"),
    ("CC-BY-NC-4.0", r"by-nc/4\.0", r"\bBY-NC\b|NonCommercial"),
    ("CC-BY-SA-2.0", r"CC-BY-SA-2\.0|by-sa/2\.0", r"\bCC-BY-SA[- ]2\.0\b"),
    ("CC-BY-SA-3.0", r"by-sa/3\.0", r"^CC-BY-SA$"),
    ("CC-BY-3.0", r"creativecommons\.org/licenses/by/3\.0", r"Creative Commons Attribution 3\.0"),
    ("CC-BY-4.0", r"creativecommons\.org/licenses/by/4\.0", r"\bCC-BY 4\.0\b|Attribution 4\.0"),
    ("CC-BY", r"$^", r"^CC-BY$"),
    ("CC0-1.0", r"publicdomain/zero", r"\bCC0\b"),
    ("Apache-2.0", r"apache\.org/licenses|licenses/Apache-2\.0", r"\bApache\b.*\b(2(\.0)?|v2)\b"),
    ("MIT", r"opensource\.org/licenses/MIT|spdx\.org/licenses/MIT\b", r"\bMIT\b"),
    ("BSD-3-Clause", r"$^", r"\bBSD-?3\b"),
    ("MPL-2.0", r"mozilla\.org/MPL/2\.0", r"Mozilla Public License 2\.0"),
    ("AGPL-3.0", r"agpl-3\.0|AGPL-3\.0", r"\bAGPL|Affero"),
    ("LGPL-2.1", r"lgpl-2\.1", r"\bLGPL-2\.1\b"),
    ("LGPL-3.0", r"gnu\.org/licenses/lgpl\.html", r"\bLGPL\b.*\b3\b|Lesser General Public"),
    ("GPL-2.0", r"gpl-2\.0|COPYING$", r"General Public License v2"),
    ("GPL-3.0", r"gpl-3\.0|gnu\.org/licenses/gpl\.html", r"\bGPLv3\b|GNU GENERAL PUBLIC LICENSE"),
    ("public-domain", r"$^", r"\bPublic Domain\b"),
)


def licence_id(name: str | None, url: str | None) -> str | None:
    """The licence a spec states, recognised (an SPDX id, `CC-BY` when no version is given, `public-domain`),
    or None when it is absent or not one of these."""
    # the URL first, over every rule: it names one licence and version, where a name's words may fit an older rule
    # ("CC BY-NC-ND 4.0" at /by-nc-nd/4.0/ was CC-BY-NC-ND-2.0)
    for spdx, url_pattern, _ in _LICENCES:
        if url and re.search(url_pattern, url, re.IGNORECASE):
            return spdx
    for spdx, _, name_pattern in _LICENCES:
        if name and re.search(name_pattern, name, re.IGNORECASE):
            return spdx
    return None


def parse_spec(data: bytes, suffix: str, source: str, max_depth: int) -> dict[str, Any]:
    """The document in `data` (`.json`, else YAML with the safe loader), checked to be OpenAPI 3.x or Swagger 2.0."""
    if suffix == ".json":
        doc = parse_json(data, source, max_depth=max_depth, error=CorpusError)
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorpusError(f"{source}: not valid UTF-8 (byte {e.start})") from None
        doc = parse_openapi_yaml(text, source, max_depth=max_depth, error=CorpusError)
    if not isinstance(doc, dict):
        raise CorpusError(f"{source}: not an OpenAPI document (the top level is a {type(doc).__name__})")
    try:
        _Converter(doc, source)
    except OpenAPIError as e:
        raise CorpusError(str(e)) from None
    return doc


def _text(value: Any) -> str | None:
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        text = str(value).strip()
        return text or None
    return None


def _one_line(text: str, limit: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def operations_of(doc: dict[str, Any], source: str) -> list[Operation]:
    """Every operation under `paths`, in document order, path items' `$ref`s resolved by the converter."""
    out: list[Operation] = []
    try:
        for route, method, op, _shared, _at in _Converter(doc, source).operations():
            summary = _text(op.get("summary")) or _text(op.get("description")) or ""
            out.append(
                Operation(
                    method=method.upper(),
                    path=route,
                    summary=_one_line(summary, _SUMMARY_CHARS),
                    operation_id=_text(op.get("operationId")),
                )
            )
    except OpenAPIError as e:
        raise CorpusError(str(e)) from None
    return out


def crud_resources(operations: list[Operation]) -> int:
    """Collections with a clear CRUD shape: a path with a POST whose item path (one more `{id}` segment)
    has a GET and a PUT, PATCH or DELETE. Linear in the paths (each item path names its collection), where a
    search of every path for each collection took minutes on a spec of 12,000 paths."""
    methods: dict[str, set[str]] = {}
    for op in operations:
        methods.setdefault(op.path.rstrip("/") or "/", set()).add(op.method)
    collections_with_items: set[str] = set()
    for item, verbs in methods.items():
        found = _ITEM_PATH.fullmatch(item)
        if found and "GET" in verbs and verbs & {"PUT", "PATCH", "DELETE"}:
            collections_with_items.add(found.group(1))
    return sum("POST" in verbs and path.rstrip("/") in collections_with_items for path, verbs in methods.items())


_ITEM_PATH = re.compile(r"(.*)/\{[^/{}]+\}")  # a collection's path, then one `{id}` segment


def _origin(info: dict[str, Any]) -> dict[str, Any]:
    origin = info.get("x-origin")
    if isinstance(origin, list):
        found = [o for o in origin if isinstance(o, dict)]
        return found[-1] if found else {}
    return origin if isinstance(origin, dict) else {}


def _categories(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    return [c for c in (_text(i) for i in items) if c]


def spec_entry(
    spec_id: str, suffix: str, data: bytes, doc: dict[str, Any], operations: list[Operation], description_chars: int
) -> SpecEntry:
    """The manifest entry of one spec: provenance from `info`, counts from its `operations`."""
    info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
    assert isinstance(info, dict)
    licence = info.get("license") if isinstance(info.get("license"), dict) else {}
    assert isinstance(licence, dict)
    origin = _origin(info)
    parts = spec_id.split("/")
    categories = _categories(info.get("x-apisguru-categories"))
    fmt = "openapi" if "openapi" in doc else "swagger"
    licence_name, licence_url = _text(licence.get("name")), _text(licence.get("url"))
    return SpecEntry(
        id=spec_id,
        provider=_text(info.get("x-providerName")) or parts[0],
        service=_text(info.get("x-serviceName")) or (parts[1] if len(parts) > 1 else None),
        title=_one_line(_text(info.get("title")) or spec_id, 300),
        description=_one_line(_text(info.get("description")) or "", description_chars) if description_chars else "",
        version=_text(info.get("version")) or "",
        spec_format=fmt,
        spec_version=str(doc[fmt]),
        licence=licence_name,
        licence_url=licence_url,
        licence_id=licence_id(licence_name, licence_url),
        origin_url=_text(origin.get("url")),
        origin_format=_text(origin.get("format")),
        origin_version=_text(origin.get("version")),
        categories=categories,
        domain=domain_of(categories),
        sha256=hashlib.sha256(data).hexdigest(),
        bytes=len(data),
        operations=len(operations),
        crud_resources=crud_resources(operations),
        file=f"specs/{spec_id}{suffix}",
    )


def env_name_of(entry: SpecEntry) -> str:
    """The environment name a spec gets by default: its id as an identifier (`googleapis.com/tasks` →
    `googleapis_com_tasks`; unique where titles are not: two Twilio APIs are titled "Twilio - Studio"), cut to
    the longest environment name."""
    return identifier(entry.id, "api")[:ENV_NAME_MAX].rstrip("_")
