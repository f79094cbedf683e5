"""The hub's tasks file: a JSONL file of `Conversation` records (their `.task`) or bare `Task` records."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from envfactory.errors import first_error
from envfactory.inputs import json_lines, parse_json, read_text
from envfactory.metatools.protocol import HubError
from envfactory.records.models import Conversation, Task

MAX_TASKS_BYTES = 2 * 1024**3  # a synth run's conversations.jsonl can serve as the tasks file: large, but bounded


def _invalid_tasks_file(message: str) -> HubError:
    return HubError("invalid_tasks_file", message)


def load_tasks(path: str | Path) -> dict[str, Task]:
    """Read a JSONL file of `Conversation` records (their `.task`) or bare `Task` records, keyed by task id.

    Blank lines are skipped; a line that is not JSON, not a record, or repeats a task id is an error
    naming the file and the line.
    """
    p = Path(path)
    text = read_text(p, max_bytes=MAX_TASKS_BYTES, what="tasks file", error=_invalid_tasks_file)
    tasks: dict[str, Task] = {}
    for lineno, line in json_lines(text):
        where = f"{p}: line {lineno}"
        data = parse_json(line, where, error=_invalid_tasks_file)
        if not isinstance(data, dict):
            raise HubError("invalid_tasks_file", f"{where}: expected a JSON object (a Conversation or a Task)")
        is_conversation = "task" in data and "nodes" in data
        if set(data) == {"id", "record"}:  # an `envs export` package's row: its environment reads it, not the hub
            raise HubError(
                "invalid_tasks_file",
                f"{where}: a row of an exported package's tasks.jsonl (envs export), which that package's environment "
                "serves; the hub takes a synth run's conversations.jsonl, or Task records",
            )
        try:
            task = Conversation.model_validate(data).task if is_conversation else Task.model_validate(data)
        except ValidationError as e:
            kind = "Conversation" if is_conversation else "Task"
            raise HubError("invalid_tasks_file", f"{where}: not a valid {kind} record: {_first_error(e)}") from None
        if task.id in tasks:
            raise HubError("invalid_tasks_file", f"{where}: task id '{task.id}' appears twice")
        tasks[task.id] = task
    return tasks


def _first_error(e: ValidationError) -> str:
    loc, msg = first_error(e, "<root>")
    more = f" (and {e.error_count() - 1} more problems)" if e.error_count() > 1 else ""
    return f"{loc}: {msg}{more}"
