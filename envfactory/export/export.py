"""One export: conversations → samples → the files of one format, with counts, and what made them.

`export.json` records the format, the options, the source and a sha256 of its file, and the version: what the
rows were made from and how. An export into a folder holding an earlier export of another format is refused
before anything is written: the earlier format's files (`dataset_info.json`, `train.parquet`) would stay beside
the new ones, and a trainer pointed at the folder would read a mix. The same format again replaces it.
"""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from envfactory.export.errors import ExportError
from envfactory.export.options import ExportOptions
from envfactory.export.rl import convert_to_rl_data
from envfactory.export.sft import convert_to_sft_data
from envfactory.export.tools_schema import Catalog
from envfactory.inputs import write_atomic
from envfactory.records.models import Conversation
from envfactory.run_settings import EXPORT_FILE

ExportFormat = Literal["trl-sft", "trl-grpo", "llamafactory", "verl"]
FORMATS: tuple[ExportFormat, ...] = get_args(ExportFormat)
SUMMARY = EXPORT_FILE  # "export.json": what was exported, how, from which file


class ExportSource(BaseModel):
    """The file the conversations were read from, and a sha256 of its bytes (the data fingerprint)."""

    model_config = ConfigDict(extra="forbid")

    path: str
    sha256: str


class ExportReport(BaseModel):
    """What an export wrote (also saved as `export.json` beside the data)."""

    model_config = ConfigDict(extra="forbid")

    format: ExportFormat
    options: ExportOptions
    conversations: int
    turns: int
    samples: int  # rows written
    skipped_turns: int  # after a turn without an answer; RL: also interactive turns
    skipped_rows: int  # LlamaFactory: samples whose roles cannot alternate
    failed_calls_removed: int  # failed assistant calls in the input, none of which is exported
    files: list[Path]
    source: ExportSource | None = Field(default=None, description="the conversations file exported, if a file")
    envfactory_version: str = Field(default_factory=lambda: version("envfactory"))


def check_earlier(out: Path, fmt: ExportFormat) -> None:
    """Refuse an export into a folder that holds an earlier export of another format (see the module)."""
    earlier = out / SUMMARY
    if not earlier.is_file():
        return
    try:
        was = json.loads(earlier.read_text(encoding="utf-8")).get("format")
    except (OSError, ValueError, AttributeError):
        was = None
    if was != fmt:
        raise ExportError(
            f"{out} holds an earlier {was or 'unreadable'} export; a {fmt} one would leave its files beside the new "
            "ones: choose another --out (or empty this one)"
        )


def export_conversations(
    conversations: list[Conversation],
    fmt: ExportFormat,
    out: Path,
    catalog: Catalog,
    options: ExportOptions | None = None,
    source: ExportSource | None = None,
) -> ExportReport:
    """Convert and write; the data files and `export.json` go to `out` (refused first when `out` holds an earlier
    export of another format)."""
    options = options or ExportOptions()
    check_earlier(out, fmt)
    out.mkdir(parents=True, exist_ok=True)
    # a re-export killed halfway must not leave the last export's report beside the new, partial rows: until every
    # data file is written the report says only its format, unfinished (so an export of another format into the
    # folder is still refused), and the whole report replaces it at the end
    unfinished = {"format": fmt, "finished": False, "note": "an export in progress, or one that was cut short"}
    write_atomic(out / SUMMARY, json.dumps(unfinished) + "\n", error=ExportError)
    turns = sum(len(c.nodes) for c in conversations)
    skipped_rows = 0
    removed = sum(1 for c in conversations for n in c.nodes for s in n.steps for r in s.results() if not r.ok)
    if fmt in ("trl-sft", "llamafactory"):
        sft = [s for c in conversations for s in convert_to_sft_data(c, catalog, options)]
        covered = sum(s.turns for s in sft)
        if fmt == "trl-sft":
            from envfactory.export.trl_sft import write_trl_sft

            files = write_trl_sft(sft, out)
        else:
            from envfactory.export.llamafactory import write_llamafactory

            files, skipped_rows = write_llamafactory(sft, out)
        rows = len(sft) - skipped_rows
    else:
        rl = [s for c in conversations for s in convert_to_rl_data(c, catalog, options)]
        if fmt == "trl-grpo":
            from envfactory.export.trl_grpo import write_trl_grpo

            files = write_trl_grpo(rl, out)
        else:
            from envfactory.export.verl import write_verl

            files = write_verl(rl, out)
        rows = covered = len(rl)
    report = ExportReport(
        format=fmt,
        options=options,
        conversations=len(conversations),
        turns=turns,
        samples=rows,
        skipped_turns=turns - covered,
        skipped_rows=skipped_rows,
        failed_calls_removed=removed,
        files=[_under(out, f) for f in files],  # relative to export.json's folder: the same wherever run from
        source=source,
    )
    write_atomic(out / SUMMARY, json.dumps(report.model_dump(mode="json"), indent=2) + "\n", error=ExportError)
    return report


def _under(folder: Path, path: Path) -> Path:
    """`path` relative to `folder` where it is inside it, else as it is."""
    inside = path.resolve()
    return inside.relative_to(folder.resolve()) if inside.is_relative_to(folder.resolve()) else path
