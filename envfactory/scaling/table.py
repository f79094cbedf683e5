"""The run table: one row per training run, ``(A, T, S, D, score[, compute, model, label, metric])``.

SynthAPI's composition variables: A apps, T tasks per app, S initial databases per task, D data depth
(1 core batch + D−1 distractor batches); a run trains on N = A×T×S instances and is scored on a
normalized downstream score in [0, 1].

Columns (names are case-insensitive; the long names are aliases of the letters):

======== ======== ===================================================== ==========================
column   alias    meaning                                               rule
======== ======== ===================================================== ==========================
A        apps     apps (tool sets) trained on                           integer ≥ 1
T        tasks    tasks per app                                         integer ≥ 1
S        states   initial databases per task                            integer ≥ 1
D        depth    data depth                                            integer ≥ 1
score             normalized downstream score                           number in [0, 1]
compute           training compute (FLOPs or tokens), optional          number > 0, all rows or none
model             the model trained, optional; fitted one at a time     text
label             a name for the run, optional                          text
metric            what the score is (`scaling add` writes it), optional one per table
======== ======== ===================================================== ==========================

Other columns are ignored, so a table may carry notes, seeds or token counts. Formats, by suffix:
``.csv`` (a header row), ``.jsonl`` (one object a line), ``.json`` (a list of objects, or
``{"runs": [...]}``). A bad cell raises `RunTableError` naming the file, the row (1-based, data rows
only), the line where the format has lines, and the column.

Compute, which orders runs for the hold-out: the ``compute`` column when the table has it. Otherwise
a proxy, ``nd`` by default: **N·D**. Supervised fine-tuning FLOPs are proportional to training tokens;
tokens grow with the N trajectories, and a deeper database (D batches instead of 1) lengthens what
the read tools return — in stateful tool use the observations are most of the context — so N·D
orders runs the way their token counts do. It overstates D's share (instructions and the agent's own
outputs do not grow with D); proxy ``n`` ignores D instead. SynthAPI reports that the N-only baseline
loses whether its size variable is tasks, tokens or FLOPs, so the choice moves the hold-out boundary,
not the conclusion. Give real numbers in ``compute`` when you have them.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from envfactory.inputs import json_lines, parse_json, read_file_bytes, write_atomic
from envfactory.scaling.errors import RunTableError
from envfactory.scaling.laws import Features

ComputeProxy = Literal["nd", "n"]

REQUIRED = ("A", "T", "S", "D", "score")
OPTIONAL = ("compute", "model", "label", "metric")
ALIASES: dict[str, str] = {
    "a": "A",
    "apps": "A",
    "t": "T",
    "tasks": "T",
    "s": "S",
    "states": "S",
    "d": "D",
    "depth": "D",
    "score": "score",
    "compute": "compute",
    "model": "model",
    "label": "label",
    "metric": "metric",
}
_INTEGER_MEANING = {"A": "apps", "T": "tasks per app", "S": "initial databases per task", "D": "data depth"}


class Run(BaseModel):
    """One training run: its composition, its score and, optionally, its compute, model and name."""

    model_config = ConfigDict(frozen=True)

    apps: int = Field(ge=1, description="A: apps")
    tasks: int = Field(ge=1, description="T: tasks per app")
    states: int = Field(ge=1, description="S: initial databases per task")
    depth: int = Field(ge=1, description="D: data depth")
    score: float = Field(ge=0.0, le=1.0, description="normalized downstream score")
    compute: float | None = Field(default=None, gt=0.0, description="training compute, when known")
    model: str | None = None
    label: str | None = None
    metric: str | None = Field(default=None, description="what the score is (success_rate, pass@1...), when known")

    @property
    def n(self) -> int:
        """N = A×T×S, the number of training instances."""
        return self.apps * self.tasks * self.states


class RunTable(BaseModel):
    """The runs of one table (in file order) and where they came from."""

    source: str = "<table>"
    runs: list[Run]
    # what of the file its runs do not hold (columns or keys no run field reads, a JSON object's keys beside
    # `runs`): allowed when it is read, lost if it were written again from its runs (`scaling add` refuses)
    ignored: list[str] = Field(default_factory=list, exclude=True)

    @model_validator(mode="after")
    def _compute_all_or_none(self) -> RunTable:
        given = [r.compute is not None for r in self.runs]
        if any(given) and not all(given):
            row = given.index(False) + 1
            raise ValueError(f"row {row} has no compute while others have; give compute for every run or for none")
        metrics = list(dict.fromkeys(r.metric for r in self.runs if r.metric is not None))
        if len(metrics) > 1:
            row = next(i for i, r in enumerate(self.runs, 1) if r.metric == metrics[1])
            raise ValueError(
                f"row {row} is scored by {metrics[1]} while earlier rows are by {metrics[0]}: one table, one metric "
                "(scores of different metrics are not one scale)"
            )
        return self

    def __len__(self) -> int:
        return len(self.runs)

    @property
    def has_compute(self) -> bool:
        return bool(self.runs) and self.runs[0].compute is not None

    def features(self) -> Features:
        """The composition columns as float arrays, what the laws evaluate."""
        return Features.of(
            [r.apps for r in self.runs],
            [r.tasks for r in self.runs],
            [r.states for r in self.runs],
            [r.depth for r in self.runs],
        )

    def scores(self) -> np.ndarray:
        return np.array([r.score for r in self.runs], dtype=float)

    def compute(self, proxy: ComputeProxy = "nd") -> np.ndarray:
        """Each run's compute: the `compute` column if given, else the proxy (N·D or N; module docstring)."""
        if self.has_compute:
            return np.array([r.compute for r in self.runs], dtype=float)
        n = np.array([r.n for r in self.runs], dtype=float)
        return n * np.array([r.depth for r in self.runs], dtype=float) if proxy == "nd" else n

    def compute_name(self, proxy: ComputeProxy = "nd") -> str:
        """What `compute()` returns, for reports: 'compute', 'N·D (proxy)' or 'N (proxy)'."""
        if self.has_compute:
            return "compute"
        return "N·D (proxy)" if proxy == "nd" else "N (proxy)"

    def models(self) -> list[str]:
        """The distinct `model` values, in order of first appearance (empty when the column is absent)."""
        return list(dict.fromkeys(r.model for r in self.runs if r.model is not None))

    def subset(self, indices: Iterable[int]) -> RunTable:
        return RunTable(source=self.source, runs=[self.runs[i] for i in indices])

    def for_model(self, model: str | None) -> RunTable:
        """The runs of one model. Without a name: the whole table, unless it holds several models,
        which are never fitted together (SynthAPI fits each model size separately)."""
        models = self.models()
        if model is None:
            if len(models) > 1:
                raise RunTableError(
                    f"{self.source}: runs of {len(models)} models ({', '.join(models)}); "
                    "choose one (--model NAME): each model is fitted separately"
                )
            return self
        if model not in models:
            known = ", ".join(models) if models else "none: the table has no model column"
            raise RunTableError(f"{self.source}: no runs of model '{model}' (models: {known})")
        return RunTable(source=self.source, runs=[r for r in self.runs if r.model == model])


# -- reading -------------------------------------------------------------------------------------


def load_table(path: Path) -> RunTable:
    """Read a run table from CSV, JSONL or JSON (by suffix), validating every cell."""
    suffix = path.suffix.lower()
    if path.is_dir():
        raise RunTableError(f"{path} is a folder: name a run table file (.csv, .jsonl or .json)")
    if suffix not in (".csv", ".jsonl", ".json"):
        raise RunTableError(f"{path}: unknown table format '{suffix or '(none)'}'; use .csv, .jsonl or .json")
    raw = read_file_bytes(path, error=RunTableError)
    try:
        text = raw.decode("utf-8-sig")  # -sig: a BOM (spreadsheet exports) is not a column name
    except UnicodeDecodeError as e:
        raise RunTableError(f"{path}: not UTF-8 text (byte {e.start})") from None
    source = str(path)
    if suffix == ".csv":
        return parse_csv(text, source)
    if suffix == ".jsonl":
        records: list[tuple[Any, int | None]] = []
        for line_no, line in json_lines(text):
            records.append((_parse_json(line, f"{source}: line {line_no}"), line_no))
        return parse_records(records, source)
    data = _parse_json(text, source)
    beside: list[str] = []
    if isinstance(data, dict) and "runs" in data:
        beside = [f"'{k}' beside runs" for k in data if k != "runs"]
        data = data["runs"]
    if not isinstance(data, list):
        raise RunTableError(f'{source}: expected a list of runs (or {{"runs": [...]}}), got {type(data).__name__}')
    table = parse_records([(item, None) for item in data], source)
    return table.model_copy(update={"ignored": beside + table.ignored}) if beside else table


def _parse_json(text: str, where: str) -> Any:
    def invalid(message: str) -> RunTableError:
        problem = message.removeprefix(f"{where}: ").removeprefix("invalid JSON ")
        return RunTableError(f"{where}: not valid JSON ({problem})")

    return parse_json(text, where, error=invalid)


def parse_csv(text: str, source: str = "<csv>") -> RunTable:
    """A CSV run table (header row first). Row numbers count data rows; the line is the file's line."""
    reader = csv.reader(text.splitlines())
    header: list[str] | None = None
    runs: list[Run] = []
    filled: set[int] = set()  # columns some row has a value in
    for row in reader:
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = row
            columns = _columns(header, f"{source}: header")
            continue
        row_no, line = len(runs) + 1, reader.line_num
        where = f"{source}: row {row_no} (line {line})"
        if len(row) > len(header):
            raise RunTableError(f"{where}: {len(row)} cells but the header has {len(header)} columns")
        filled.update(i for i, cell in enumerate(row) if cell.strip())
        record = dict(zip(header, row, strict=False))
        runs.append(_run(record, columns, where))
    if header is None:
        raise RunTableError(f"{source}: empty file; a run table needs a header row ({', '.join(REQUIRED)})")
    # a column with no name and no value (a spreadsheet's trailing comma) holds nothing to lose
    kept = [name for i, name in enumerate(header) if name.strip() or i in filled]
    return _table(runs, source, _unknown(kept))


def parse_records(records: Sequence[tuple[Any, int | None]], source: str = "<records>") -> RunTable:
    """Run objects (JSON or JSONL), each with the line it came from when the format has lines."""
    runs: list[Run] = []
    keys: list[Any] = []
    for i, (record, line) in enumerate(records, start=1):
        where = f"{source}: row {i}" + (f" (line {line})" if line is not None else "")
        if not isinstance(record, dict):
            raise RunTableError(f"{where}: expected an object with {', '.join(REQUIRED)}, got {type(record).__name__}")
        keys += record
        runs.append(_run(record, _columns(list(record), where), where))
    return _table(runs, source, _unknown(keys))


def _unknown(keys: Sequence[Any]) -> list[str]:
    """The columns among `keys` no run field reads, once each, in order."""
    return list(dict.fromkeys(f"column '{k}'" for k in keys if ALIASES.get(str(k).strip().lower()) is None))


def _table(runs: list[Run], source: str, ignored: list[str] | None = None) -> RunTable:
    if not runs:
        raise RunTableError(f"{source}: no runs; a run table needs at least one row of {', '.join(REQUIRED)}")
    try:
        return RunTable(source=source, runs=runs, ignored=ignored or [])
    except ValidationError as e:  # the table-wide rule (compute for all runs or none); cells are checked above
        raise RunTableError(f"{source}: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None


def _columns(keys: Sequence[Any], where: str) -> dict[str, str]:
    """Canonical column → the name used in the table; missing or doubled columns are errors."""
    found: dict[str, str] = {}
    for key in keys:
        if not isinstance(key, str):
            continue
        canonical = ALIASES.get(key.strip().lower())
        if canonical is None:
            continue  # other columns are allowed and ignored
        if canonical in found:
            raise RunTableError(f"{where}: columns '{found[canonical]}' and '{key}' both give {canonical}; keep one")
        found[canonical] = key
    missing = [c for c in REQUIRED if c not in found]
    if missing:
        names = ", ".join(f"'{c}'" for c in missing)
        have = ", ".join(str(k) for k in keys) or "none"
        raise RunTableError(
            f"{where}: missing column {names} (columns: {have}); a run table needs {', '.join(REQUIRED)}"
        )
    return found


def _run(record: dict[str, Any], columns: dict[str, str], where: str) -> Run:
    def cell(canonical: str) -> tuple[Any, str]:
        name = columns.get(canonical)
        if name is None:
            return None, canonical
        value = record.get(name)
        if isinstance(value, str) and not value.strip():
            value = None
        return value, name

    ints: dict[str, int] = {}
    for key in ("A", "T", "S", "D"):
        value, name = cell(key)
        ints[key] = _positive_int(value, f"{where}, column '{name}'", _INTEGER_MEANING[key])
    value, name = cell("score")
    score = _number(value, f"{where}, column '{name}'", required=True)
    assert score is not None
    if not 0.0 <= score <= 1.0:
        raise RunTableError(
            f"{where}, column '{name}': {_show(value)} is outside [0, 1]; scores are normalized "
            "(divide percentages by 100)"
        )
    value, name = cell("compute")
    compute = _number(value, f"{where}, column '{name}'", required=False)
    if compute is not None and compute <= 0:
        raise RunTableError(f"{where}, column '{name}': compute must be positive, got {_show(value)}")
    model, _ = cell("model")
    label, _ = cell("label")
    metric, _ = cell("metric")
    return Run(
        apps=ints["A"],
        tasks=ints["T"],
        states=ints["S"],
        depth=ints["D"],
        score=score,
        compute=compute,
        model=None if model is None else str(model).strip(),
        label=None if label is None else str(label).strip(),
        metric=None if metric is None else str(metric).strip(),
    )


def _show(value: Any) -> str:
    return repr(value.strip()) if isinstance(value, str) else repr(value)


def _number(value: Any, where: str, *, required: bool) -> float | None:
    if value is None:
        if required:
            raise RunTableError(f"{where}: empty; every run needs {', '.join(REQUIRED)}")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise RunTableError(f"{where}: expected a number, got {_show(value)}")
    try:
        number = float(value)
    except ValueError:
        raise RunTableError(f"{where}: expected a number, got {_show(value)}") from None
    if not math.isfinite(number):
        raise RunTableError(f"{where}: expected a finite number, got {_show(value)}")
    return number


def _positive_int(value: Any, where: str, meaning: str) -> int:
    number = _number(value, where, required=True)
    assert number is not None
    if number != int(number) or number < 1:
        raise RunTableError(f"{where}: {meaning} must be a positive integer, got {_show(value)}")
    return int(number)


# -- writing -------------------------------------------------------------------------------------


def _record(run: Run) -> dict[str, Any]:
    record: dict[str, Any] = {"A": run.apps, "T": run.tasks, "S": run.states, "D": run.depth, "score": run.score}
    for key in OPTIONAL:
        value = getattr(run, key)
        if value is not None:
            record[key] = value
    return record


def write_table(table: RunTable, path: Path) -> Path:
    """Write a run table as CSV, JSONL or JSON (by suffix); `load_table` reads it back unchanged."""
    suffix = path.suffix.lower()
    records = [_record(r) for r in table.runs]
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".csv":
        fields = list(REQUIRED) + [k for k in OPTIONAL if any(k in rec for rec in records)]
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for rec in records:
            writer.writerow({k: repr(v) if isinstance(v, float) else v for k, v in rec.items()})
        content = text.getvalue()
    elif suffix == ".jsonl":
        content = "".join(json.dumps(rec) + "\n" for rec in records)
    elif suffix == ".json":
        content = json.dumps({"runs": records}, indent=1) + "\n"
    else:
        raise RunTableError(f"{path}: unknown table format '{suffix or '(none)'}'; use .csv, .jsonl or .json")
    # the old table or the whole new one, never a torn one: `scaling add` rewrites a table that holds every row
    write_atomic(path, content, error=RunTableError)
    return path
