"""`replay`: a call that fails is a result, never an exception, whatever the tool did — a write that leaves a state
no JSON can hold is an internal error, undone, and the replay goes on."""

from __future__ import annotations

from pathlib import Path

from envfactory.records.episode import replay
from envfactory.records.models import ToolCall
from tests.support.env_folders import trusted_pool

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
    state = {"notes": {"N-1": {"id": "N-1", "text": "hi"}}}
    pool = trusted_pool(tmp_path, "notes", NOTES, state)
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
