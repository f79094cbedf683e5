"""What the SFT and GRPO entry points share: the dataset rows, a training run and its record, the command line.

`cli_main` is the whole `main()` of an entry point: flags → config (file, profile, overrides) → run → the loss
log; a config error prints one line and exits 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, Field

from training.runconfig import (
    RunConfig,
    RunConfigError,
    add_common_arguments,
    dataset_file,
    load_run_config,
    overrides_from,
)

if TYPE_CHECKING:
    from datasets import Dataset

C = TypeVar("C", bound=RunConfig)


class TrainResult(BaseModel):
    """What a run did: the loss log, timing, where the checkpoint is."""

    output: Path
    steps: int
    losses: list[float]
    final_loss: float | None
    train_runtime_s: float
    step_time_s: float | None = Field(description="mean wall time per optimizer step")
    log_history: list[dict[str, Any]]
    extra: dict[str, Any] = Field(default_factory=dict)

    def finite(self) -> bool:
        return bool(self.losses) and all(math.isfinite(x) for x in self.losses)


MAX_ROW_BYTES = 64 * 1024 * 1024  # one exported row: a long conversation with its tool list, far below this


def first_row_columns(path: Path) -> list[str]:
    """The keys of the file's first row, read without loading the rest; a file that is not JSON lines of objects
    is a `RunConfigError` naming it."""
    from envfactory.inputs import InputError, parse_json

    with path.open("rb") as f:
        line = b""
        while not line.strip():
            line = f.readline(MAX_ROW_BYTES + 1)
            if not line:
                raise RunConfigError(f"{path}: the dataset is empty")
    if len(line) > MAX_ROW_BYTES:
        raise RunConfigError(f"{path}: line 1 is over {MAX_ROW_BYTES} bytes: not an exported dataset")
    try:
        row = parse_json(line, f"{path}:1")
    except InputError as e:
        raise RunConfigError(f"not a JSON-lines dataset: {e}") from None
    if not isinstance(row, dict):
        raise RunConfigError(f"{path}: not a JSON-lines dataset: line 1 is not a JSON object")
    return [str(k) for k in row]


TRAIN_MODULES = ("torch", "transformers", "datasets", "trl")


def require_train_extra() -> None:
    """The training stack is the `train` extra (not in `make demo`'s lean install): missing, one line, not a
    `ModuleNotFoundError` traceback from the middle of an import."""
    missing = [m for m in TRAIN_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise RunConfigError(
            f"training needs {', '.join(missing)}, not installed here: pip install -e '.[train]' (or `make setup`)"
        )


def load_dataset_rows(config: RunConfig, required: tuple[tuple[str, ...], ...] = (), export: str = "") -> Dataset:
    """The rows of the config's data file. `required` lists the column sets a row may have (SFT takes
    prompt-completion rows or whole-conversation `messages` rows); a file matching none is a `RunConfigError`
    naming the export that makes them (an SFT run pointed at a GRPO export, say), caught here rather than as a
    KeyError inside TRL."""
    import datasets

    path = dataset_file(config.data)
    columns = first_row_columns(path)  # checked before the loader runs: its errors are log lines and tracebacks
    if required and not any(all(c in columns for c in option) for option in required):
        missing = min(([c for c in option if c not in columns] for option in required), key=len)
        hint = f"; run `envfactory export RUN --format {export} --out DIR`" if export else ""
        raise RunConfigError(
            f"{config.data}: not a {export or 'training'} export (missing columns: {', '.join(missing)}; it has "
            f"{', '.join(columns)}){hint}"
        )
    datasets.disable_progress_bars()  # "Generating train split" for a local file: noise, not progress
    try:
        dataset = datasets.load_dataset("json", data_files=str(path), split="train")
    except Exception as e:  # a later row that is not JSON: datasets raises its own classes
        raise RunConfigError(
            f"{path}: not a JSON-lines dataset: {str(e).splitlines()[0] or type(e).__name__}"
        ) from None
    if config.max_samples is not None:
        dataset = dataset.select(range(min(config.max_samples, len(dataset))))
    if len(dataset) == 0:
        raise RunConfigError(f"{config.data}: the dataset is empty")
    return dataset


def summarize(trainer: Any, output: Path, elapsed: float) -> TrainResult:
    history = [dict(h) for h in trainer.state.log_history]
    losses = [float(h["loss"]) for h in history if "loss" in h]
    steps = int(trainer.state.global_step)
    runtime = next((float(h["train_runtime"]) for h in history if "train_runtime" in h), elapsed)
    return TrainResult(
        output=output,
        steps=steps,
        losses=losses,
        final_loss=losses[-1] if losses else None,
        train_runtime_s=runtime,
        step_time_s=runtime / steps if steps else None,
        log_history=history,
    )


def save_final(trainer: Any, result: TrainResult) -> None:
    """The final model + tokenizer in `output`, and `training_summary.json` beside them."""
    trainer.save_model(str(result.output))
    trainer.processing_class.save_pretrained(str(result.output))
    (result.output / "training_summary.json").write_text(result.model_dump_json(indent=2), encoding="utf-8")


def print_log(result: TrainResult, title: str) -> None:
    print(f"{title}: {result.steps} steps in {result.train_runtime_s:.1f} s -> {result.output}")
    for entry in result.log_history:
        if "loss" in entry:
            shown = {k: entry[k] for k in ("step", "loss", "grad_norm", "learning_rate") if k in entry}
            extra = {k: v for k, v in entry.items() if k.startswith(("reward", "tool_use_reward", "tools/"))}
            print("  " + json.dumps({**shown, **extra}, default=float))


def train_and_save(trainer: Any, output: Path, **extra: Any) -> TrainResult:
    """Train, then save the final model + tokenizer and `training_summary.json` (with `extra`) in `output`. A
    `trainer.resume_from_checkpoint` (a checkpoint folder) is resumed from — transformers leaves that field to the
    training script, so it was accepted and ignored — and recorded as `resumed_from`."""
    resume = getattr(trainer.args, "resume_from_checkpoint", None)
    if resume is not None:
        if not (Path(resume) / "trainer_state.json").is_file():
            raise RunConfigError(
                f"trainer.resume_from_checkpoint {resume}: no checkpoint there (a checkpoint-N folder of an earlier "
                "run's output, holding trainer_state.json)"
            )
        extra = {**extra, "resumed_from": str(resume)}
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume)
    result = summarize(trainer, output, time.perf_counter() - start)
    result.extra.update(extra)
    save_final(trainer, result)
    return result


def offline_defaults() -> None:
    """Never reach a hub; TRL's experimental-feature warnings are documented in training/README.md."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def cli_main(
    argv: list[str] | None,
    *,
    description: str,
    config_cls: type[C],
    default_config: Path,
    run: Callable[[C], TrainResult],
    title: str,
) -> int:
    parser = argparse.ArgumentParser(description=description)
    add_common_arguments(parser, default_config)
    args = parser.parse_args(argv)
    offline_defaults()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        require_train_extra()
        config = load_run_config(config_cls, args.config, args.profile, overrides_from(args))
        from training.loading import check_model

        check_model(config.model)  # a model that is not here: one line before the data and trainer are built
        result = run(config)
    except (RunConfigError, OSError) as e:  # OSError: a model folder or file that cannot be read (one line, too)
        print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return 1
    print_log(result, title)
    return 0
