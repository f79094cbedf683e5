"""Reading conversations (a synth run folder or a JSONL file) and writing JSONL rows."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ValidationError

from envfactory.errors import first_error
from envfactory.export.errors import ExportError
from envfactory.inputs import InputError, parse_json, read_file_bytes
from envfactory.tasks.models import Conversation

CONVERSATIONS = "conversations.jsonl"  # what `envfactory synth` writes in its output folder
MAX_JSONL_BYTES = 2 * 1024**3  # a large synth run, bounded


def conversations_file(source: Path) -> Path:
    """A run folder's `conversations.jsonl`, or the file itself."""
    path = source / CONVERSATIONS if source.is_dir() else source
    if not path.is_file():
        where = f"{source} has no {CONVERSATIONS}" if source.is_dir() else f"{source} does not exist"
        raise ExportError(f"{where}: give a synth run folder or a conversations JSONL file")
    return path


def load_conversations(source: Path) -> list[Conversation]:
    """Every conversation in the file; a torn last line (a run killed mid-write) is skipped, never repaired here."""
    path = conversations_file(source)
    try:
        data = read_file_bytes(path, max_bytes=MAX_JSONL_BYTES, what="conversations file")
    except InputError as e:
        raise ExportError(str(e)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        tail = data.rfind(b"\n") + 1
        if data.endswith(b"\n") or e.start < tail:  # a bad byte in a whole line: not a torn write
            raise ExportError(f"{path}: not valid UTF-8 (byte {e.start})") from None
        text = data[:tail].decode("utf-8")  # a torn last line cut mid-character: skipped
    lines = text.splitlines()
    conversations: list[Conversation] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        torn = n == len(lines) and not text.endswith("\n")
        try:
            conversations.append(Conversation.model_validate(parse_json(line, f"{path}:{n}")))
        except InputError as e:
            if torn:
                continue
            raise ExportError(str(e)) from None
        except ValidationError as e:
            where, msg = first_error(e, "<root>")
            raise ExportError(f"{path}:{n}: not a conversation: {where}: {msg}") from None
    return conversations


def write_jsonl(rows: Iterable[BaseModel], path: Path) -> int:
    """One JSON object a line (unset optional fields left out); returns the number of rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(row.model_dump_json(by_alias=True, exclude_none=True) + "\n")
            count += 1
    return count
