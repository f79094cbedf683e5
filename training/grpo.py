"""GRPO on EnvFactory's exported TRL GRPO data (TRL `GRPOTrainer`): multi-turn tool rollouts in isolated
environment sessions, scored by the composite reward.

    python training/grpo.py --config training/configs/grpo.yaml [--profile cpu] [--data DIR] [--model M]
                            [--output DIR] [--max-steps N]

The data is `envfactory export RUN --format trl-grpo --out DIR`: one row per turn with a conversational
`prompt` and the columns `tools`, `ground_truth`, `initial_config`, `final_config`, `mcp_servers` (JSON strings).

Rollouts (TRL 1.16, `environment_factory` + `max_tool_calling_iterations`): for each prompt TRL samples
`num_generations` completions; each completion gets its own environment instance (`training/environment.py`),
reset from the row's `initial_config`; every tool call the model writes (`<tool_call>{...}</tool_call>`, parsed
with the tokenizer's `response_template`) runs in that instance's isolated session and its result is appended as
a tool message, and the model continues, up to `max_tool_calling_iterations` rounds or `max_completion_length`
tokens. Tool-result tokens are masked out of the loss. `max_tool_calling_iterations: 0` gives single-turn
completions (tool calls are parsed and scored by replay, never answered).

The reward is `envfactory.reward.ToolUseReward`: R = α·R_traj + (1−α)·R_state − γ·P_length (− format penalty),
α = 0.5: the completion's calls are matched against the turn's ground truth (graded, order-tolerant) and replayed
in fresh sessions from `initial_config`, and the final states compared with `final_config`. Settings under
`reward:` in the config (`RewardSettings`).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from envfactory.config import get_settings
from envfactory.env.pool import EnvPool
from envfactory.reward import RewardSettings, ToolUseReward
from training.environment import EnvironmentRegistry, EnvironmentSetupError, use_exact_tool_schemas
from training.fused_head import score_only_completions
from training.loading import TokenizerSetup, load_model_and_tokenizer, resolve_model
from training.runconfig import RunConfig, RunConfigError, trainer_arguments, trainer_error
from training.runner import TrainResult, cli_main, load_dataset_rows, train_and_save

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl import GRPOTrainer

log = logging.getLogger("training.grpo")

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "grpo.yaml"
REQUIRED_COLUMNS = (("prompt", "tools", "ground_truth", "initial_config", "final_config", "mcp_servers"),)


class GRPORunConfig(RunConfig):
    """`training/configs/grpo.yaml`."""

    reward: dict[str, Any] = Field(default_factory=dict, description="envfactory.reward.RewardSettings fields")
    exact_tool_schemas: bool = Field(
        default=True, description="render prompts with the exported tool schemas (as the SFT data), not TRL's"
    )


class GRPOParts:
    """What `build_trainer` wired together, for callers that inspect a run (tests, notebooks)."""

    def __init__(
        self,
        registry: EnvironmentRegistry,
        reward: ToolUseReward,
        setup: TokenizerSetup | None,
        exact_schemas: bool,
    ) -> None:
        self.registry = registry
        self.reward = reward
        self.setup = setup
        self.exact_schemas = exact_schemas


def load_grpo_dataset(config: RunConfig, registry: EnvironmentRegistry) -> Dataset:
    dataset = load_dataset_rows(config, REQUIRED_COLUMNS, "trl-grpo")
    try:
        return registry.add_environment_column(dataset)
    except EnvironmentSetupError as e:
        raise RunConfigError(f"{config.data}: {e}") from None


def build_trainer(
    config: GRPORunConfig,
    *,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    dataset: Dataset | None = None,
    pool: EnvPool | None = None,
) -> tuple[GRPOTrainer, GRPOParts]:
    """A `GRPOTrainer` with one environment class per tool list and the composite reward."""
    from trl import GRPOConfig, GRPOTrainer

    pool = pool if pool is not None else EnvPool(get_settings())
    registry = EnvironmentRegistry(pool)
    rows = load_grpo_dataset(config, registry) if dataset is None else registry.add_environment_column(dataset)
    try:
        settings = RewardSettings(**config.reward)
    except ValueError as e:
        raise RunConfigError(f"reward: {e}") from None
    reward = ToolUseReward(pool, settings)

    arguments = trainer_arguments(config)
    try:
        args = GRPOConfig(**arguments)
    except (TypeError, ValueError) as e:  # an unknown field; bf16 without a GPU (`--profile cpu` is the CPU run)
        raise RunConfigError(f"trainer: {trainer_error(e)}") from None
    setup: TokenizerSetup | None = None
    if model is None or tokenizer is None:
        if args.beta != 0.0 and resolve_model(config.model).is_gguf:
            raise RunConfigError(
                "beta > 0 needs a reference model TRL can reload from a folder; a GGUF model has none. "
                "Fine-tune it with training/sft.py first and start GRPO from that checkpoint, or set beta: 0."
            )
        model, tokenizer, setup = load_model_and_tokenizer(config.model, config.dtype, config.chat_template)
    score_only_completions()  # CPU: the fused LM head projects the completion, not the tool-list prompt
    reward_funcs: list[Any] = [reward]
    factories: Any = registry.factories()  # TRL types it with a private protocol (reset only)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=rows,
        processing_class=tokenizer,
        environment_factory=factories,
    )
    exact = use_exact_tool_schemas(trainer, registry) if config.exact_tool_schemas else False
    return trainer, GRPOParts(registry, reward, setup, exact)


def run(config: GRPORunConfig) -> TrainResult:
    trainer, parts = build_trainer(config)
    log.info(
        "environments: %d classes (%s); exact tool schemas: %s",
        len(parts.registry.classes),
        ", ".join(parts.registry.classes),
        parts.exact_schemas,
    )
    return train_and_save(trainer, config.output, environments=sorted(parts.registry.classes))


def main(argv: list[str] | None = None) -> int:
    return cli_main(
        argv,
        description="GRPO with multi-turn tool rollouts on EnvFactory environments",
        config_cls=GRPORunConfig,
        default_config=DEFAULT_CONFIG,
        run=run,
        title="grpo",
    )


if __name__ == "__main__":
    sys.exit(main())
