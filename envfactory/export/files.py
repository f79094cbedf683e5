"""Reading conversations (a synth run folder or a JSONL file) and writing JSONL rows."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from envfactory.export.errors import ExportError
from envfactory.inputs import iter_jsonl_log, read_json, writing
from envfactory.records.models import Conversation
from envfactory.records.run_folder import CONVERSATIONS, DROPPED, HELDOUT, SUMMARY, in_id_order, read_conversations
from envfactory.run_settings import SETTINGS_FILE

Split = Literal["train", "heldout"]
SPLIT_FILES: dict[str, str] = {"train": CONVERSATIONS, "heldout": HELDOUT}


def conversations_file(source: Path, split: Split = "train") -> Path:
    """A run folder's file of one split (`conversations.jsonl`: train, `heldout.jsonl`), or the file itself."""
    name = SPLIT_FILES[split]
    path = source / name if source.is_dir() else source
    if not path.is_file():
        where = (
            f"{source} has no {name}"
            if source.is_dir()
            else f"{source} is not a regular file"
            if source.exists()
            else f"{source} does not exist"
        )
        raise ExportError(f"{where}: give a synth run folder or a conversations JSONL file")
    return path


def training_conversations(source: Path) -> list[Conversation]:
    """The conversations export may train on: never the held-out split. A `heldout.jsonl` is refused, and
    a conversation the run's `summary.json` lists as held out, or its `heldout.jsonl` holds (a killed run has no
    summary yet), is left out wherever it is found."""
    path = conversations_file(source)
    if path.name == HELDOUT:
        raise ExportError(f"{path} is a run's held-out split, kept for evaluation: export never emits it")
    conversations = load_conversations(path)
    summary = path.parent / SUMMARY  # a finished run's record; a killed run's held-out ids are in heldout.jsonl
    held = _heldout_ids(summary) if summary.is_file() else _ids_in(path.parent / HELDOUT)
    return in_id_order([c for c in conversations if c.id not in held])  # the same rows in the same order, run after run


def unfinished(source: Path) -> bool:
    """Whether `source` is a synth run folder (or its conversations.jsonl) without the summary a finished run writes:
    killed, or still running. (A run folder: its conversations beside what synth writes with them.)"""
    path = source / CONVERSATIONS if source.is_dir() else source
    folder = path.parent
    run = path.name == CONVERSATIONS and any((folder / n).is_file() for n in (SETTINGS_FILE, DROPPED, HELDOUT))
    return run and not (folder / SUMMARY).is_file()


def _ids_in(path: Path) -> set[str]:
    """The conversation ids of a run log, read a line at a time (nothing repaired on disk: export only reads)."""

    def error(message: str) -> ExportError:
        why = message.removesuffix("; fix or remove it to resume")
        return ExportError(f"cannot tell the held-out conversations of an unfinished run: {why}; fix or remove it")

    return {
        row["id"]
        for row in iter_jsonl_log(path, repair=False, error=error)
        if isinstance(row, dict) and isinstance(row.get("id"), str)
    }


def _heldout_ids(summary: Path) -> set[str]:
    if not summary.is_file():
        return set()
    data = read_json(
        summary,
        what="run summary",
        error=lambda m: ExportError(f"{summary}: cannot tell the held-out conversations: {m}"),
    )
    units = (data.get("summary") or {}).get("heldout_units") if isinstance(data, dict) else None
    return {str(u) for u in units} if isinstance(units, list) else set()


def load_conversations(source: Path, split: Split = "train") -> list[Conversation]:
    """Every conversation in the file; a torn last line (a run killed mid-write) is skipped, never repaired here.
    A file holding one conversation id twice is refused: two runs concatenated, or one appended twice, would be
    trained on twice, and an evaluation would merge different turns under one item."""
    path = conversations_file(source, split)
    conversations = read_conversations(path, error=ExportError)
    seen: dict[str, int] = {}
    for row, c in enumerate(conversations, 1):
        first = seen.setdefault(c.id, row)
        if first != row:
            raise ExportError(
                f"{path}: conversation {c.id} is there twice (conversations {first} and {row}): a run's file holds "
                "each once; give each run's file on its own, or remove the copies"
            )
    return conversations


def write_jsonl(rows: Iterable[BaseModel], path: Path) -> int:
    """One JSON object a line (unset optional fields left out); returns the number of rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with writing(path), path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(row.model_dump_json(by_alias=True, exclude_none=True) + "\n")
            count += 1
    return count
