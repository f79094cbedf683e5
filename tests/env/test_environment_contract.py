"""The environment contract: code and metadata must agree; broken folders fail with clear errors."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from envfactory.env import Environment, Record, State, contract_problems
from envfactory.env.pool import load_env_folder
from envfactory.errors import ContractError, EnvLoadError


class Note(Record):
    id: str
    text: str


class Notes(State):
    notes: dict[str, Note] = {}


def _env() -> Environment:
    env = Environment("notes", Notes, description="Notes.", domain="office")

    @env.tool(kind="write")
    def add_note(db: Notes, text: str, pinned: bool = False) -> Note:
        """Add a note.

        Args:
            text: The note's text.
            pinned: Keep it on top.
        """
        n = Note(id=db.new_id("N"), text=text)
        return db.create("notes", n.id, n)

    @env.tool(kind="read")
    def get_note(db: Notes, note_id: str) -> Note:
        """Get a note.

        Args:
            note_id: Id of the note.
        """
        return db.get("notes", note_id)

    return env


def test_schema_derived_from_signature_and_docstring() -> None:
    spec = _env().metadata.tool("add_note")
    assert spec.description == "Add a note."
    assert spec.kind == "write"
    assert spec.input_schema["required"] == ["text"]
    assert spec.parameters["text"] == {"type": "string", "description": "The note's text."}
    assert spec.parameters["pinned"]["type"] == "boolean"
    assert spec.output_schema is not None and spec.output_schema["required"] == ["id", "text"]


def test_registration_errors() -> None:
    env = Environment("x", Notes, description="X.", domain="office")
    with pytest.raises(ValueError, match="kind must be 'read' or 'write'"):
        env.tool(kind="delete")  # type: ignore[arg-type]

    def undocumented(db: Notes) -> None:
        pass

    with pytest.raises(TypeError, match="needs a docstring"):
        env.tool(kind="read")(undocumented)

    def untyped(db, x):  # type: ignore[no-untyped-def]
        """Doc."""

    with pytest.raises(TypeError, match="parameter 'x' needs a type annotation"):
        env.tool(kind="read")(untyped)

    def good(db: Notes) -> None:
        """Doc."""

    env.tool(kind="read")(good)
    with pytest.raises(ValueError, match="registered twice"):
        env.tool(kind="read")(good)
    with pytest.raises(TypeError, match="subclass of envfactory State"):
        Environment("y", dict, description="Y.", domain="office")  # type: ignore[arg-type]


def test_mismatch_names_both_sides() -> None:
    env = _env()
    meta = env.metadata.model_copy(deep=True)
    add = meta.tool("add_note")
    add.kind = "read"
    add.input_schema["required"] = ["text", "pinned"]
    add.input_schema["properties"]["text"]["type"] = "integer"
    add.input_schema["properties"]["colour"] = {"type": "string"}
    del add.input_schema["properties"]["pinned"]
    add.input_schema["required"] = ["text"]
    meta.tools = [t for t in meta.tools if t.name != "get_note"]
    problems = contract_problems(meta, env.derived_metadata())
    assert "tool 'get_note' is registered in env.py but missing from metadata.json" in problems
    assert "tool 'add_note': metadata.json says kind 'read', env.py says 'write'" in problems
    assert "tool 'add_note': parameter 'colour' is in metadata.json but not in the env.py signature" in problems
    assert "tool 'add_note': parameter 'pinned' is in the env.py signature but not in metadata.json" in problems
    assert "tool 'add_note': parameter 'text' has type 'integer' in metadata.json but 'string' in env.py" in problems
    with pytest.raises(ContractError, match="breaks the contract"):
        env.attach_metadata(meta)


def test_required_flag_mismatch() -> None:
    env = _env()
    meta = env.metadata.model_copy(deep=True)
    meta.tool("add_note").input_schema["required"] = ["text", "pinned"]
    assert contract_problems(meta, env.derived_metadata()) == [
        "tool 'add_note': parameter 'pinned' is required in metadata.json but optional in env.py"
    ]


ENV_PY = textwrap.dedent(
    '''
    from envfactory.env import Environment, Record, State

    class Note(Record):
        id: str

    class Notes(State):
        notes: dict[str, Note] = {}

    env = Environment("NAME", Notes, description="Notes.", domain="office")

    @env.tool(kind="read")
    def get_note(db: Notes, note_id: str) -> Note:
        """Get a note.

        Args:
            note_id: Id of the note.
        """
        return db.get("notes", note_id)
    '''
)


def _folder(tmp_path: Path, name: str, code: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "env.py").write_text(code)
    return folder


def test_loader_errors(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "notes", ENV_PY.replace("NAME", "notes"))
    with pytest.raises(EnvLoadError, match=r"missing metadata\.json"):
        load_env_folder(folder)
    env = load_env_folder(folder, with_metadata=False)
    meta = env.derived_metadata().model_dump(mode="json")
    meta["tools"][0]["input_schema"]["required"] = []
    (folder / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ContractError, match=r"'note_id' is optional in \S*notes/metadata.json but required in env.py"):
        load_env_folder(folder)

    wrong = _folder(tmp_path, "other", ENV_PY.replace("NAME", "notes"))
    with pytest.raises(EnvLoadError, match="named 'notes' but its folder is 'other'"):
        load_env_folder(wrong, with_metadata=False)
    broken = _folder(tmp_path, "broken", "import nonexistent_module_xyz\n")
    with pytest.raises(EnvLoadError, match="import failed: ModuleNotFoundError"):
        load_env_folder(broken, with_metadata=False)
    empty = _folder(tmp_path, "empty", "x = 1\n")
    with pytest.raises(EnvLoadError, match="must define `env = Environment"):
        load_env_folder(empty, with_metadata=False)
