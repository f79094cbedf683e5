"""`replay`: a call that fails is a result, never an exception, whatever the tool did — a write that leaves a state
no JSON can hold is an internal error, undone, and the replay goes on."""

from __future__ import annotations

import json
from pathlib import Path

from envfactory.config import Settings
from envfactory.env.metadata import dump_metadata
from envfactory.env.pool import EnvPool, load_env_folder
from envfactory.env.trust import trust
from envfactory.records.episode import replay
from envfactory.records.models import ToolCall

NOTES = '''"""Notes whose attach tool leaves a value no JSON can hold."""

from typing import Any

from envfactory.env import Environment, Record, State


class Note(Record):
    id: str
    text: str


class NotesDB(State):
    notes: dict[str, Note] = {}
    attachment: Any = None


env = Environment("notes", NotesDB, description="Notes.", domain="utilities")


@env.tool(kind="write")
def attach(db: NotesDB, note_id: str) -> dict:
    """Attach something to a note.

    Args:
        note_id: Id of the note.
    """
    db.get("notes", note_id, "note")
    db.set("attachment", object())
    return {"ok": True}


@env.tool(kind="write")
def edit(db: NotesDB, note_id: str, text: str) -> Note:
    """Change a note's text.

    Args:
        note_id: Id of the note.
        text: The new text.
    """
    db.get("notes", note_id, "note")
    return db.update("notes", note_id, text=text)
'''


def test_a_write_leaving_a_state_no_json_holds_is_an_error_result_and_undone(tmp_path: Path) -> None:
    folder = tmp_path / "envs" / "notes"
    (folder / "scenarios").mkdir(parents=True)
    (folder / "env.py").write_text(NOTES)
    state = {"notes": {"N-1": {"id": "N-1", "text": "hi"}}}
    (folder / "scenarios" / "default.json").write_text(json.dumps(state))
    dump_metadata(load_env_folder(folder, with_metadata=False).derived_metadata(), folder / "metadata.json")
    settings = Settings(root=tmp_path, bfcl=False)
    trust(settings.trust_file, "notes", folder, "written by this test")
    pool = EnvPool(settings)
    calls = [
        ToolCall(server="notes", name="attach", arguments={"note_id": "N-1"}),
        ToolCall(server="notes", name="edit", arguments={"note_id": "N-1", "text": "there"}),
    ]
    run = replay(pool, calls, {"notes": state})
    attach, edit = run.results
    assert not attach.ok and attach.result["error"]["type"] == "internal_error"
    assert (
        edit.ok and run.final["notes"]["attachment"] is None and run.final["notes"]["notes"]["N-1"]["text"] == "there"
    )
