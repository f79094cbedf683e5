"""TRL GRPO prompt datasets (`GRPOTrainer`), one JSONL file.

`prompt` is conversational (the conversation so far + the turn's query). TRL passes every other column to the
reward functions as keyword arguments (and, with `environment_factory`, to `environment.reset(**row)`), so the
columns a reward needs are flat JSON strings: `ground_truth`, `mcp_servers`, `initial_config`, `final_config`,
plus `tools` (the tool list to expose). `reward_model` / `extra_info` repeat them nested as the reference (VeRL)
record has them. Note that GRPOTrainer renders prompts with the trainer's own `tools` / environment methods, not
with this column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from envfactory.export.files import write_jsonl
from envfactory.export.messages import wire
from envfactory.export.rl import ExtraInfo, RewardModel, RLSample

FILE = "train.jsonl"


class TRLGRPORecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: list[dict[str, Any]]
    tools: str
    ground_truth: str
    mcp_servers: str
    initial_config: str
    final_config: str
    conversation_id: str
    turn: int
    data_source: str
    reward_model: RewardModel
    extra_info: ExtraInfo


def trl_grpo_record(sample: RLSample) -> TRLGRPORecord:
    kwargs = sample.extra_info.mcp_factory_kwargs
    return TRLGRPORecord(
        prompt=wire(sample.prompt),
        tools=sample.extra_info.tools,
        ground_truth=sample.reward_model.ground_truth,
        mcp_servers=kwargs.mcp_servers,
        initial_config=kwargs.initial_config,
        final_config=kwargs.final_config,
        conversation_id=sample.extra_info.conversation_id,
        turn=sample.extra_info.turn,
        data_source=sample.data_source,
        reward_model=sample.reward_model,
        extra_info=sample.extra_info,
    )


def write_trl_grpo(samples: list[RLSample], out: Path) -> list[Path]:
    path = out / FILE
    write_jsonl((trl_grpo_record(s) for s in samples), path)
    return [path]
