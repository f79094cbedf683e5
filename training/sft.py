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

import logging
import sys
from collections.abc import Sized
from pathlib import Path
from typing import TYPE_CHECKING, cast

from training.fingerprint import lean_tokenizer_hashing
from training.fused_head import score_only_completions
from training.loading import TokenizerSetup, load_model_and_tokenizer
from training.runconfig import (
    RunConfig,
    RunConfigError,
    trainer_arguments,
    trainer_error,
)
from training.runner import TrainResult, cli_main, load_dataset_rows, train_and_save

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl import SFTTrainer

log = logging.getLogger("training.sft")

# the two TRL conversational formats `export --format trl-sft` writes: per turn (the default) or `--per conversation`
REQUIRED_COLUMNS = (("prompt", "completion"), ("messages",))
DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "sft.yaml"


class SFTRunConfig(RunConfig):
    """`training/configs/sft.yaml`."""


def build_trainer(
    config: SFTRunConfig,
    *,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dataset: Dataset | None = None,
) -> tuple[SFTTrainer, TokenizerSetup | None]:
    """An `SFTTrainer` for the config (a model and tokenizer may be passed in, already prepared)."""
    from trl import SFTConfig, SFTTrainer

    dataset = dataset if dataset is not None else load_dataset_rows(config, REQUIRED_COLUMNS, "trl-sft")
    arguments = trainer_arguments(config)
    arguments.setdefault("assistant_only_loss", True)
    try:
        args = SFTConfig(**arguments)
    except (TypeError, ValueError) as e:  # an unknown field; bf16 without a GPU (`--profile cpu` is the CPU run)
        raise RunConfigError(f"trainer: {trainer_error(e)}") from None
    setup: TokenizerSetup | None = None
    if model is None or tokenizer is None:
        model, tokenizer, setup = load_model_and_tokenizer(config.model, config.dtype, config.chat_template)
    lean_tokenizer_hashing(tokenizer)  # TRL's dataset maps hash the tokenizer: not its 262k-entry Python vocab
    score_only_completions()  # CPU: the fused LM head projects the assistant tokens, not the prompt
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    kept = trained_rows(trainer)  # TRL drops the rows that `max_length` cut down to no assistant token
    if kept == 0:
        raise RunConfigError(
            f"{config.data}: none of its {len(dataset)} rows keeps an assistant token within trainer.max_length "
            f"{args.max_length} ({args.truncation_mode}): raise trainer.max_length"
        )
    if kept < len(dataset):
        log.warning(
            "%d of %d rows dropped: cut at trainer.max_length %s (%s) they keep no assistant token",
            len(dataset) - kept, len(dataset), args.max_length, args.truncation_mode,
        )  # fmt: skip
    return trainer, setup


def trained_rows(trainer: SFTTrainer) -> int:
    """The rows the trainer kept of its dataset (a map-style `datasets.Dataset`)."""
    return len(cast(Sized, trainer.train_dataset))


def run(config: SFTRunConfig) -> TrainResult:
    dataset = load_dataset_rows(config, REQUIRED_COLUMNS, "trl-sft")
    trainer, setup = build_trainer(config, dataset=dataset)
    if setup is not None:
        log.info("tokenizer: %s", setup.model_dump_json())
    return train_and_save(trainer, config.output, rows=len(dataset), rows_trained=trained_rows(trainer))


def main(argv: list[str] | None = None) -> int:
    return cli_main(
        argv,
        description="SFT on EnvFactory's TRL SFT export (assistant-only loss)",
        config_cls=SFTRunConfig,
        default_config=DEFAULT_CONFIG,
        run=run,
        title="sft",
    )


if __name__ == "__main__":
    sys.exit(main())
