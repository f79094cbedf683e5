"""A synth run folder's file names, in one place: the batch writes them, export, eval, the hub and resume read them;
and the one reader of its conversations (`read_conversations`, safe against a torn last line).

Every layer that reads a run folder can name its files without importing the batch runner (`envfactory.tasks.plan`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol, TypeVar

from pydantic import ValidationError

from envfactory.errors import EnvFactoryError, ErrorFactory, InputError, first_error
from envfactory.inputs import parse_json, read_file_bytes
from envfactory.records.models import Conversation

CONVERSATIONS = "conversations.jsonl"  # the training split: what export reads
HELDOUT = "heldout.jsonl"  # the held-out split: for evaluation only, never exported
DROPPED = "dropped.jsonl"  # one line per dropped unit: its code and reason
SUMMARY = "summary.json"  # the run's counts and settings (and which units are held out)
ATTEMPTS = "attempts.jsonl"  # an evaluation's attempts, one a line (`envfactory eval`)
FAILURES = "failures.jsonl"  # an evaluation's attempts that could not run, until a rerun makes them

RUN_FILES = (CONVERSATIONS, HELDOUT, DROPPED, SUMMARY, ATTEMPTS, FAILURES)  # what a run writes into its folder

MAX_CONVERSATIONS_BYTES = 2 * 1024**3  # a large synth run, bounded


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


_WithId = TypeVar("_WithId", bound=_HasId)


def in_id_order(conversations: list[_WithId]) -> list[_WithId]:
    """`conversations` in the order of their ids, a unit key's numbers read as numbers (`hotels/t2/s0` before
    `hotels/t10/s0`): a run with concurrency writes them as its units finish, so a file's order is not the plan's,
    and what is made of it (export's rows, the statistics' lists) must not depend on it. Ids that tie that way
    (`t02`, `t2`) go by their text; numbers are compared by their digits, never converted (any length)."""
    return sorted(conversations, key=lambda c: (_id_key(c.id), c.id))


def _id_key(text: str) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    for part in _PARTS.findall(text):
        if part[0].isascii() and part[0].isdigit():
            digits = part.lstrip("0")
            out.append((0, len(digits), digits))  # shorter is smaller; equal lengths compare as text
        else:
            out.append((1, 0, part))
    return out


_PARTS = re.compile(r"[0-9]+|[^0-9]+")


def read_conversations(path: Path, *, error: ErrorFactory = InputError) -> list[Conversation]:
    """Every conversation in a conversations JSONL file: the one reader of a run's conversations. A torn last line
    (a run killed mid-write) is skipped, never repaired here; anything else that is not a conversation is an
    `InputError` (or the caller's `error`) naming the file and line."""
    data = read_file_bytes(path, max_bytes=MAX_CONVERSATIONS_BYTES, what="conversations file", error=error)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        tail = data.rfind(b"\n") + 1
        if data.endswith(b"\n") or e.start < tail:  # a bad byte in a whole line: not a torn write
            raise error(f"{path}: not valid UTF-8 (byte {e.start})") from None
        text = data[:tail].decode("utf-8")  # a torn last line cut mid-character: skipped
    lines = text.split("\n")  # not splitlines(): U+2028, U+0085... are characters inside a JSON string
    conversations: list[Conversation] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        torn = n == len(lines) and not text.endswith("\n")
        try:
            conversations.append(Conversation.model_validate(parse_json(line, f"{path}:{n}", error=error)))
        except EnvFactoryError:  # what `error` made of an unreadable line
            if torn:
                continue
            raise
        except ValidationError as e:
            where, msg = first_error(e, "<root>")
            raise error(f"{path}:{n}: not a conversation: {where}: {msg}") from None
    return conversations
