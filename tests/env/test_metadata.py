"""EnvMetadata / ToolSpec validation: malformed metadata names the file, the field and the problem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envfactory.env.metadata import EnvMetadata, load_metadata, parse_metadata
from envfactory.errors import MetadataError

GOOD: dict[str, Any] = {
    "name": "notes",
    "description": "Take notes.",
    "domain": "office",
    "tools": [
        {
            "name": "add_note",
            "description": "Add a note.",
            "kind": "write",
            "input_schema": {
                "type": "object",
                "properties": {"text": {"type": "string"}, "pinned": {"type": "boolean"}},
                "required": ["text"],
            },
        }
    ],
}


def _write(tmp_path: Path, data: Any) -> Path:
    p = tmp_path / "metadata.json"
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


def test_good_metadata_loads(tmp_path: Path) -> None:
    meta = load_metadata(_write(tmp_path, GOOD))
    assert isinstance(meta, EnvMetadata)
    assert meta.tool("add_note").required == ["text"]
    assert set(meta.tool("add_note").parameters) == {"text", "pinned"}


@pytest.mark.parametrize(
    ("mutate", "field", "problem"),
    [
        (lambda d: d.pop("domain"), "domain", "Field required"),
        (lambda d: d.update(domain="space"), "domain", "Input should be"),
        (lambda d: d["tools"][0].update(kind="delete"), "tools[0](add_note).kind", "Input should be 'read' or 'write'"),
        (lambda d: d["tools"][0].update(name="2fast"), "tools[0](2fast).name", "not a valid tool name"),
        (
            lambda d: d["tools"][0]["input_schema"].update(required=["text", "color"]),
            "tools[0](add_note).input_schema",
            "'color', which is not in 'properties'",
        ),
        (
            lambda d: d["tools"][0]["input_schema"]["properties"].update(size={"type": "int"}),
            "tools[0](add_note).input_schema",
            "unknown JSON type 'int'",
        ),
        (lambda d: d["tools"].append(dict(d["tools"][0])), "<root>", "tool 'add_note' is defined twice"),
        (lambda d: d.update(tools=[]), "tools", "at least 1 item"),
        (lambda d: d["tools"][0].update(extra=1), "tools[0](add_note).extra", "Extra inputs are not permitted"),
    ],
)
def test_malformed_metadata_names_file_field_problem(tmp_path: Path, mutate: Any, field: str, problem: str) -> None:
    data = json.loads(json.dumps(GOOD))
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(MetadataError) as info:
        load_metadata(path)
    e = info.value
    assert e.source == str(path)
    assert e.field == field
    assert problem in e.problem
    assert str(path) in str(e) and field in str(e)


def test_invalid_json_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MetadataError, match=r"invalid JSON at line 1"):
        load_metadata(_write(tmp_path, "{nope"))
    with pytest.raises(MetadataError, match="cannot read"):
        load_metadata(tmp_path / "absent.json")
    with pytest.raises(MetadataError, match="expected a JSON object"):
        parse_metadata([1, 2], "x.json")
