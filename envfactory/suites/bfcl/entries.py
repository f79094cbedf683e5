"""BFCL's multi-turn test entries: `load_entries` joins them with their ground truth; `route` says
which involved class runs a call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from envfactory.env.session import Session
from envfactory.suites.bfcl.adapter import environment
from envfactory.suites.bfcl.suites import _version_prefix, class_importable, data_dir, read_jsonl


def route(method: str, involved_classes: list[str]) -> str | None:
    """The involved class that runs `method`: the last one that has it, as in BFCL's executor."""
    owner = None
    for class_name in involved_classes:
        if not class_importable(class_name):
            continue
        env = environment(class_name)
        if method in env.tools:
            owner = class_name
    return owner


class BFCLEntry(BaseModel):
    """One multi-turn test entry with its ground truth (one list of call strings per turn)."""

    model_config = ConfigDict(extra="allow")

    id: str
    question: list[list[dict[str, Any]]]
    initial_config: dict[str, Any] = Field(default_factory=dict)
    involved_classes: list[str]
    ground_truth: list[list[str]] = Field(default_factory=list)
    path: list[str] = Field(default_factory=list)
    excluded_function: list[str] = Field(default_factory=list)

    def config_for(self, class_name: str) -> dict[str, Any]:
        """The initial config of one involved class (`{}` when the entry gives none), as BFCL reads it."""
        return dict(self.initial_config.get(class_name, {}))

    def sessions(self, *, long_context: bool = False, strict: bool = False) -> dict[str, Session]:
        """One fresh Session per involved class, forked from this entry's initial config."""
        return {
            c: Session.fork(environment(c, long_context), self.config_for(c), strict=strict)
            for c in self.involved_classes
        }


def entry_files(category: str = "multi_turn_base") -> list[Path]:
    """The files a category's entries are read from: the entries, then their ground truth where there is one."""
    name = f"{_version_prefix()}_{category}.json"
    answers = data_dir() / "possible_answer" / name
    return [data_dir() / name, *([answers] if answers.exists() else [])]


def load_entries(category: str = "multi_turn_base") -> list[BFCLEntry]:
    """BFCL's entries of a multi-turn category (e.g. `multi_turn_base`) joined with their ground truth."""
    files = entry_files(category)
    entries = read_jsonl(files[0])
    answers = {a["id"]: a.get("ground_truth", []) for a in read_jsonl(files[1])} if len(files) > 1 else {}
    return [BFCLEntry.model_validate({**e, "ground_truth": answers.get(e["id"], [])}) for e in entries]
