"""What shaped a run's results, written into the run, and the check that a resume makes them the same way.

A command that writes results into a folder and resumes there (`envfactory eval`, `envfactory synth`) writes
`settings.json` there before any result: `settings`, what shapes the results (the model and its sampling, the
tools and conversation modes, k, the budgets, a sha256 of the data), compared on every resume; and `context`,
what only describes the run (where the data lay, the server's address, a `--limit`), never compared.

A rerun into the same folder with other settings would mix two ways of making results into one table (an
evaluation's pass@k over attempts made with other tools, a batch's conversations from two configs): it is
refused before any work, in one line naming each setting that differs, recorded → now. A folder that holds
results but no `settings.json` (written before settings were recorded) is refused too: nothing there says how
its results were made, so no resume can be shown to match them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envfactory.config import Role, Settings
from envfactory.errors import DataError
from envfactory.inputs import read_json, write_atomic

SETTINGS_FILE = "settings.json"
EXPORT_FILE = "export.json"  # what `envfactory export` writes into its folder (its `SUMMARY`)


class RunSettingsError(DataError):
    """A resume made with other settings than the run recorded, or into a run that recorded none."""


class ModelIdentity(BaseModel):
    """A role's model as configured: what it is and how it samples (what shapes its answers)."""

    model_config = ConfigDict(extra="forbid")

    provider: str
    model: str = Field(description="openai, transformers: the model's name; local: the GGUF file; scripted: the script")
    temperature: float
    top_p: float
    max_tokens: int | None
    gguf: str | None = Field(default=None, description="transformers: the GGUF that llama.cpp generates with")

    @property
    def label(self) -> str:
        return f"{self.provider}:{self.model}"


def model_identity(settings: Settings, role: Role) -> ModelIdentity:
    cfg = settings.llm_for(role)
    named = {"local": cfg.gguf_path, "scripted": cfg.script}.get(cfg.provider)
    return ModelIdentity(
        provider=cfg.provider,
        model=str(named) if named is not None else cfg.model,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_tokens=cfg.max_tokens,
        gguf=str(cfg.gguf_path) if cfg.provider == "transformers" and cfg.gguf_path is not None else None,
    )


class RunRecord(BaseModel):
    """`settings.json`: the command, the settings compared on a resume, and what only describes the run."""

    model_config = ConfigDict(extra="forbid")

    command: str
    settings: dict[str, Any]
    context: dict[str, Any] = Field(default_factory=dict)
    envfactory_version: str = Field(default_factory=lambda: version("envfactory"))


def file_sha256(paths: Iterable[Path]) -> str:
    """A sha256 of the files' bytes, read one after the other (of one file: what `sha256sum` prints)."""
    digest = hashlib.sha256()
    for path in paths:
        try:
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
        except OSError as e:
            raise RunSettingsError(f"{path}: cannot read it to fingerprint the data: {e.strerror or e}") from None
    return digest.hexdigest()


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and (value or not prefix):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _shown(value: Any) -> str:
    if value is None:
        return "(none)"
    text = str(value)
    return text if len(text) <= 40 else f"{text[:16]}…"  # a sha256 or a long path: its start tells them apart


def differences(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Each setting that differs, as `name: recorded → now` (nested settings named with dots)."""
    before, after = _flat(recorded), _flat(now)
    return [
        f"{key}: {_shown(before.get(key))} → {_shown(after.get(key))}"
        for key in dict.fromkeys([*before, *after])
        if before.get(key) != after.get(key)
    ]


def read_record(folder: Path) -> RunRecord | None:
    """The run's recorded settings; None when it recorded none."""
    path = folder / SETTINGS_FILE
    if not path.exists():
        return None

    def unreadable(why: str) -> RunSettingsError:
        return RunSettingsError(
            f"{path} cannot be read ({why.splitlines()[0]}): it says how the results there were made"
        )

    data = read_json(path, what="run settings", error=unreadable)
    try:
        return RunRecord.model_validate(data)
    except ValidationError as e:
        raise unreadable(str(e)) from None


def check_resume(folder: Path, record: RunRecord, *, holds_results: bool, out_option: str = "--out") -> bool:
    """Refuse (`RunSettingsError`) a run into `folder` that holds results made otherwise, or results with no
    recorded settings; writes nothing. True when the folder already records these very settings. A recorded
    run with no results yet made nothing that could mix: its record is simply replaced."""
    earlier = read_record(folder)
    if earlier is None:
        if (folder / EXPORT_FILE).is_file():  # exports record themselves in export.json, not settings.json
            raise RunSettingsError(
                f"{folder} is an `envfactory export` folder ({folder / EXPORT_FILE} says so), not one of"
                f" `{record.command}`: give another {out_option}"
            )
        if holds_results:
            raise RunSettingsError(
                f"{folder} holds results from a run that did not record its settings (no {SETTINGS_FILE}), so this"
                f" one cannot be checked against them: give another {out_option}, or move those results away to start"
                " over"
            )
        return False
    if earlier.command != record.command:  # another command's folder: its results are not this one's to replace
        raise RunSettingsError(
            f"{folder} is an `envfactory {earlier.command}` folder ({folder / SETTINGS_FILE} says so), not one of"
            f" `{record.command}`: give another {out_option}"
        )
    changed = differences(earlier.settings, record.settings)
    if changed and holds_results:
        raise RunSettingsError(
            f"{folder} holds a run made with other settings ({'; '.join(changed)}): rerun with the settings "
            f"recorded in {folder / SETTINGS_FILE}, or give another {out_option}"
        )
    return not changed


def record_or_check(folder: Path, record: RunRecord, *, holds_results: bool, out_option: str = "--out") -> None:
    """Before any work: check a resume against the run's record (`check_resume`), and write `record` into a run
    that has none (or one whose run made nothing yet)."""
    if check_resume(folder, record, holds_results=holds_results, out_option=out_option):
        return

    def cannot_write(why: str) -> RunSettingsError:
        return RunSettingsError(f"cannot write {folder / SETTINGS_FILE}: {why}")

    taken = next((p for p in (folder, *folder.parents) if p.exists()), None)  # the nearest path that exists
    if taken is not None and not taken.is_dir():
        what = "is a file" if taken == folder else f"cannot be made: {taken} is a file"
        raise RunSettingsError(f"{out_option} {folder} {what}, not a folder: give a folder for the run")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise cannot_write(e.strerror or str(e)) from None
    write_atomic(folder / SETTINGS_FILE, record.model_dump_json(indent=2) + "\n", error=cannot_write)


def has_lines(path: Path) -> bool:
    """The file exists and is not empty (a results log that holds something)."""
    try:
        return path.stat().st_size > 0
    except OSError:
        return False
