"""A run table row from real runs: a synth run's training composition (A, T, S, D from its
`summary.json`) and an evaluation's score (`envfactory eval`'s `summary.json`) — the loop
plan → synth → export → train → eval → `scaling add` → `scaling fit` → `scaling suggest`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from envfactory.inputs import read_json, read_jsonl_log
from envfactory.records.run_folder import ATTEMPTS, CONVERSATIONS, FAILURES, HELDOUT
from envfactory.run_settings import SETTINGS_FILE, file_sha256
from envfactory.scaling.errors import RunTableError
from envfactory.scaling.table import Run, RunTable, load_table, write_table

Metric = Literal["success_rate", "mean_reward", "pass_hat_max"]


class _Composition(BaseModel):
    model_config = ConfigDict(strict=True)  # `"A": true` is no count of apps

    A: int
    T: int
    S: int
    D: int


def _summary(folder: Path, what: str) -> dict[str, Any]:
    path = folder / "summary.json" if folder.is_dir() else folder
    data = read_json(path, what=f"{what} summary", error=lambda m: RunTableError(f"{m} (is {folder} a {what} folder?)"))
    if not isinstance(data, dict):
        raise RunTableError(f"{path}: not a {what} summary")
    return data


def score_of(evaluation: dict[str, Any], metric: Metric, where: Path) -> tuple[float, str]:
    """(the score, what it is: the metric's name, `pass^k` with its k)."""
    if metric == "pass_hat_max":
        hats = (evaluation.get("pass_rates") or {}).get("pass_hat") or {}
        if not hats:
            raise RunTableError(f"{where}: no pass^k in the evaluation summary")
        k = max(hats, key=int)
        return float(hats[k]), f"pass^{k}"
    value = evaluation.get(metric)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise RunTableError(f"{where}: the evaluation summary has no '{metric}'")
    return float(value), metric


def run_from(synth: Path, evaluation: Path, *, metric: Metric, model: str | None, label: str | None) -> Run:
    """The table row of a model trained on `synth`'s training split and evaluated in `evaluation`."""
    try:
        comp = _Composition.model_validate(_summary(synth, "synth run").get("composition"))
    except ValidationError:
        raise RunTableError(f"{synth}: its summary.json records no composition (rerun `envfactory synth`)") from None
    if min(comp.A, comp.T, comp.S, comp.D) < 1:
        raise RunTableError(
            f"{synth}: it kept no training conversation (A={comp.A}, T={comp.T}): no model was trained on it "
            "(its drop reasons are in dropped.jsonl)"
        )
    summary = _summary(evaluation, "evaluation")
    score, what = score_of(summary, metric, evaluation)
    record = _eval_settings(evaluation)
    _check_evaluated(synth, evaluation, record)
    _check_complete(evaluation, summary, record)
    try:
        return Run(
            apps=comp.A, tasks=comp.T, states=comp.S, depth=comp.D, score=score, model=model, label=label, metric=what
        )
    except ValidationError as e:  # a damaged or hand-edited summary: a score outside [0, 1], NaN
        problem = e.errors()[0]
        raise RunTableError(
            f"{evaluation}: its {what} {score!r} is no run table score ({problem['msg'].removeprefix('Value error, ')})"
        ) from None


def _eval_settings(evaluation: Path) -> dict[str, Any] | None:
    """The evaluation's `settings.json` record (None: it has none, or not an object)."""
    path = (evaluation if evaluation.is_dir() else evaluation.parent) / SETTINGS_FILE
    if not path.is_file():
        return None
    record = read_json(path, what="evaluation settings", error=RunTableError)
    return record if isinstance(record, dict) else None


def _part(record: dict[str, Any] | None, key: str) -> dict[str, Any]:
    """`record[key]` when it is an object, else empty."""
    value = record.get(key) if record is not None else None
    return value if isinstance(value, dict) else {}


def _check_complete(evaluation: Path, summary: dict[str, Any], record: dict[str, Any] | None) -> None:
    """A row's score is that of a whole evaluation: some attempts ran, of every item it was given (no `--limit`),
    each as many times as it asked (an attempt that could not run is in failures.jsonl until a rerun makes it)."""
    folder = evaluation if evaluation.is_dir() else evaluation.parent
    attempts, items = summary.get("attempts"), summary.get("items")
    if not isinstance(attempts, int) or not isinstance(items, int) or attempts < 1 or items < 1:
        raise RunTableError(
            f"{evaluation}: no attempt of this evaluation ran (see its failures.jsonl): no score to add"
        )
    limit = _part(record, "context").get("limit")
    if isinstance(limit, int):
        raise RunTableError(
            f"{evaluation}: evaluated with --limit {limit} (the first items only): a row needs the whole evaluation; "
            "rerun it without --limit (the attempts made are kept)"
        )
    k = _part(record, "settings").get("attempts")
    if isinstance(k, int) and attempts != items * k:
        raise RunTableError(
            f"{evaluation}: {items * k - attempts} of {items} items' {k} attempts each did not run (failures.jsonl): "
            "rerun the evaluation to finish them"
        )
    if (folder / FAILURES).is_file() and _unfinished(folder):
        raise RunTableError(
            f"{evaluation}: attempts listed in failures.jsonl never ran: rerun the evaluation to finish them"
        )


def _unfinished(folder: Path) -> bool:
    """Whether failures.jsonl names an (item, attempt) that attempts.jsonl does not hold."""

    def pairs(name: str) -> set[tuple[Any, Any]]:
        rows = read_jsonl_log(folder / name, repair=False, error=RunTableError)  # a torn last line: not an attempt
        return {(row.get("item"), row.get("attempt")) for row in rows if isinstance(row, dict)}

    return bool(pairs(FAILURES) - pairs(ATTEMPTS))


def _check_evaluated(synth: Path, evaluation: Path, record: dict[str, Any] | None) -> None:
    """An evaluation of a synth run's split must be of *this* run: the sha256 its `settings.json` (`record`) records
    of the file it read is that of this run's file (wherever either folder lives now). An evaluation on a benchmark
    suite, or on a conversations file that is no run's split (a shared test set), may score a model trained on any
    run; one without settings is taken as it is."""
    data = _part(record, "settings").get("data")
    source = _part(record, "context").get("source")
    if not isinstance(data, dict) or not isinstance(data.get("sha256"), str):
        return
    if data.get("source") == "file" and not (isinstance(source, str) and Path(source).name in (HELDOUT, CONVERSATIONS)):
        return  # a conversations file of its own: a shared test set
    if data.get("source") not in ("run", "file"):
        return
    run = synth if synth.is_dir() else synth.parent
    training = run / CONVERSATIONS
    if training.is_file() and file_sha256([training]) == data["sha256"]:
        raise RunTableError(
            f"{evaluation} evaluated the training conversations of {synth} (its conversations.jsonl): a row needs the "
            "score on tasks the model did not train on — evaluate its held-out split (`envfactory eval RUN --split "
            "heldout`; synth with holdout_tasks or holdout_envs to have one)"
        )
    split = run / (HELDOUT if data.get("split") == "heldout" else CONVERSATIONS)
    if not split.is_file() or file_sha256([split]) != data["sha256"]:
        raise RunTableError(
            f"{evaluation} evaluated other tasks than {split.name} of {synth} (its settings.json records another "
            f"sha256, of {source or 'its data'}): a row pairs a run's composition with the score of a model "
            "evaluated on that run's held-out tasks"
        )


def add_run(table: Path, run: Run) -> RunTable:
    """Append `run` to the table file (created when missing) and return the table. The very same row again (the
    same composition, score, model and label: the same evaluation added twice) is refused; give a `label` to
    add a repeat that scored the same."""
    existing = load_table(table) if table.exists() else None
    runs = list(existing.runs) if existing is not None else []
    dropped = existing.ignored if existing is not None else []
    if dropped:  # the file is written again from its runs: what they do not hold would be lost
        raise RunTableError(
            f"{table}: it holds {', '.join(dropped)}, which a run table does not keep and `scaling add` would drop "
            "when it writes the file again: add the row by hand, or give another table"
        )
    if run in runs:
        raise RunTableError(
            f"{table}: row {runs.index(run) + 1} is this run already (the same composition, score, model and "
            "label); give --label to add a repeat that scored the same"
        )
    other = next((r.metric for r in runs if r.metric is not None and r.metric != run.metric), None)
    if other is not None:
        raise RunTableError(
            f"{table}: its runs are scored by {other}, this evaluation by {run.metric}: one table, one metric "
            f"(--metric to choose; or start another table)"
        )
    try:
        updated = RunTable(runs=[*runs, run])
    except ValidationError as e:  # the table-wide rule: its runs give compute, and an evaluation gives none
        problem = e.errors()[0]["msg"].removeprefix("Value error, ")
        raise RunTableError(
            f"{table}: {problem}: `scaling add` has no compute to give this run; add the row by hand with its "
            "compute, or give another table"
        ) from None
    write_table(updated, table)
    return updated
