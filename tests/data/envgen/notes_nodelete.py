"""Notebook: write, tag, find and delete notes (a generated-environment fixture)."""

from __future__ import annotations

from envfactory.env import ConflictError, Environment, Record, State, ToolError


class Note(Record):
    id: str
    title: str
    body: str
    tags: list[str] = []
    archived: bool = False


class NotebookDB(State):
    notes: dict[str, Note] = {}


env = Environment(
    "notebook",
    NotebookDB,
    description="A personal notebook: write notes, tag them, search them, archive and delete them.",
    domain="office",
)


@env.tool(kind="write")
def create_note(db: NotebookDB, title: str, body: str) -> Note:
    """Create a note.

    Args:
        title: Title of the note.
        body: Text of the note.
    """
    if not title.strip():
        raise ToolError("title must not be empty")
    note = Note(id=db.new_id("NT"), title=title.strip(), body=body)
    return db.create("notes", note.id, note)


@env.tool(kind="read")
def get_note(db: NotebookDB, note_id: str) -> Note:
    """Get a note by id.

    Args:
        note_id: Id of the note, as returned by create_note.
    """
    return db.get("notes", note_id, "note")


@env.tool(kind="read")
def search_notes(db: NotebookDB, query: str) -> list[Note]:
    """Find notes whose title or body contains the query (case-insensitive).

    Args:
        query: Text to look for.
    """
    q = query.lower()
    return [n for n in db.notes.values() if q in n.title.lower() or q in n.body.lower()]


@env.tool(kind="write")
def tag_note(db: NotebookDB, note_id: str, tag: str) -> Note:
    """Add a tag to a note.

    Args:
        note_id: Id of the note.
        tag: The tag to add.
    """
    note = db.get("notes", note_id, "note")
    if tag in note.tags:
        raise ConflictError(f"note {note_id} already has tag '{tag}'")
    return db.update("notes", note_id, tags=[*note.tags, tag])


@env.tool(kind="write")
def archive_note(db: NotebookDB, note_id: str) -> Note:
    """Archive a note.

    Args:
        note_id: Id of the note.
    """
    note = db.get("notes", note_id, "note")
    if note.archived:
        raise ConflictError(f"note {note_id} is already archived")
    return db.update("notes", note_id, archived=True)


@env.tool(kind="write")
def delete_note(db: NotebookDB, note_id: str) -> Note:
    """Delete a note for good.

    Args:
        note_id: Id of the note.
    """
    return db.get("notes", note_id, "note")  # BUG: never deletes
