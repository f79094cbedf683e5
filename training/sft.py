"""Supervised fine-tuning on EnvFactory's exported TRL SFT data (TRL `SFTTrainer`), loss on assistant tokens only.

    python training/sft.py --config training/configs/sft.yaml [--profile cpu] [--data DIR] [--model M]
                           [--output DIR] [--max-steps N]

The data is `envfactory export RUN --format trl-sft --out DIR`: conversational rows with a JSON-string `tools`
column — prompt-completion rows (`prompt` = the conversation so far + the turn's request, `completion` = the
turn's tool calls, tool results and answer; the default) or `messages` rows (whole conversations). TRL 1.16
renders each row with `apply_chat_template(..., tools=json.loads(row["tools"]))` and, with
`assistant_only_loss=True`, asks the template for `return_assistant_tokens_mask=True`: tokens outside
`{% generation %}` get label -100. On prompt-completion rows the completion mask is applied too (a label is
kept only where both masks are 1), so the history and the tool results are never trained. A tokenizer without
a chat template gets EnvFactory's tool template (which has the markers); a known template without them (Qwen3,
Llama, ...) is swapped by TRL for its training variant.

The final model and tokenizer are saved to `output` (`config.json`, `model.safetensors`, tokenizer files) with
`training_summary.json` (the loss log, step times).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, Field

from training.loading import TokenizerSetup, load_model_and_tokenizer
from training.runconfig import (
    ConfigError,
    RunConfig,
    dataset_file,
    deep_merge,
    load_run_config,
    trainer_arguments,
)

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl import SFTTrainer

log = logging.getLogger("training.sft")

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "sft.yaml"


class SFTRunConfig(RunConfig):
    """`training/configs/sft.yaml`."""


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


def load_dataset_rows(config: RunConfig) -> Dataset:
    from datasets import load_dataset

    dataset = load_dataset("json", data_files=str(dataset_file(config.data)), split="train")
    if config.max_samples is not None:
        dataset = dataset.select(range(min(config.max_samples, len(dataset))))
    if len(dataset) == 0:
        raise ConfigError(f"{config.data}: the dataset is empty")
    return dataset


def build_trainer(
    config: SFTRunConfig,
    *,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dataset: Dataset | None = None,
) -> tuple[SFTTrainer, TokenizerSetup | None]:
    """An `SFTTrainer` for the config (a model and tokenizer may be passed in, already prepared)."""
    from trl import SFTConfig, SFTTrainer

    dataset = dataset if dataset is not None else load_dataset_rows(config)
    arguments = trainer_arguments(config)
    arguments.setdefault("assistant_only_loss", True)
    try:
        args = SFTConfig(**arguments)
    except TypeError as e:
        raise ConfigError(f"trainer: {e}") from None
    setup: TokenizerSetup | None = None
    if model is None or tokenizer is None:
        model, tokenizer, setup = load_model_and_tokenizer(config.model, config.dtype, config.chat_template)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    return trainer, setup


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


def run(config: SFTRunConfig) -> TrainResult:
    trainer, setup = build_trainer(config)
    if setup is not None:
        log.info("tokenizer: %s", setup.model_dump_json())
    start = time.perf_counter()
    trainer.train()
    result = summarize(trainer, config.output, time.perf_counter() - start)
    save_final(trainer, result)
    return result


def add_common_arguments(parser: argparse.ArgumentParser, default_config: Path) -> None:
    parser.add_argument("--config", type=Path, default=default_config, help="YAML run config")
    parser.add_argument("--profile", default=None, help="a profile of the config file (e.g. cpu)")
    parser.add_argument("--data", type=Path, default=None, help="exported dataset folder or JSONL file")
    parser.add_argument("--model", default=None, help="HF folder / hub id, .gguf, gemma3-270m-gguf, tiny-gemma3")
    parser.add_argument("--output", type=Path, default=None, help="checkpoint folder")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps")
    parser.add_argument("--max-samples", type=int, default=None, help="use only the first N rows")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, dotted, value read as YAML (e.g. trainer.vllm_mode=server); repeatable",
    )


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as a config mapping (None: not given)."""
    out: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        node = out
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: '{part}' is set to a value and a mapping")
        node[leaf] = yaml.safe_load(value)
    flags: dict[str, Any] = {
        "data": args.data,
        "model": args.model,
        "output": args.output,
        "max_samples": args.max_samples,
        "trainer": {"max_steps": args.max_steps} if args.max_steps is not None else None,
    }
    return deep_merge(out, {k: v for k, v in flags.items() if v is not None})


def offline_defaults() -> None:
    """Never reach a hub; TRL's experimental-feature warnings are documented in training/README.md."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="SFT on EnvFactory's TRL SFT export (assistant-only loss)")
    add_common_arguments(parser, DEFAULT_CONFIG)
    args = parser.parse_args(argv)
    offline_defaults()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = load_run_config(SFTRunConfig, args.config, args.profile, overrides_from(args))
        result = run(config)
    except (ConfigError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print_log(result, "sft")
    return 0


if __name__ == "__main__":
    sys.exit(main())
