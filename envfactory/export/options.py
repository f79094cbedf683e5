"""How a conversation becomes training samples: the choices every converter and writer shares."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Per = Literal["turn", "conversation"]
UserCallMode = Literal["describe", "drop"]
ToolsMode = Literal["all", "needed"]
SchemaStyle = Literal["full", "compact"]


class ExportOptions(BaseModel):
    """Options of `convert_to_sft_data` / `convert_to_rl_data` and of every writer.

    `per`: `turn` — one SFT sample per valid turn: the conversation so far is the prompt, that turn's
    messages the completion (the reference's per-turn samples; trained on the last turn only);
    `conversation` — one sample per conversation, every assistant message trained once.
    `keep_thinking`: keep `Step.thinking` as the assistant's `reasoning_content` (a `<think>` block).
    `system`: a system message put first in every sample (none by default: the chat template writes
    its tool preamble). `user_calls`: what the user did with their own tools (conversational variant):
    `describe` appends a note to the user's message, `drop` leaves it out.
    `include_interactive`: RL samples also for turns where the user spoke again or acted mid-turn
    (a rollout has no simulated user, so by default those turns are left out of RL data).
    `prompts_dir`: where the model-facing wording (`template/export/en.yaml`) is read from.
    `tools`: the tool list of each row — `all`: every tool of the conversation's environments; `needed`: the
    tools the row's assistant calls use plus `distractors` other tools of the same environments, chosen by
    `seed` and the row's id (same row, same seed: same tools), so the model still has to choose.
    `schemas`: `full` — each tool as its environment declares it; `compact` — JSON schemas without what
    carries nothing (titles, null defaults, `$schema`, empty `required`) and descriptions cut to their
    first sentence (`row_tools.py`).
    """

    model_config = ConfigDict(extra="forbid")

    per: Per = "turn"
    keep_thinking: bool = False
    system: str | None = Field(default=None, description="system message text; None: no system message")
    user_calls: UserCallMode = "describe"
    include_interactive: bool = False
    tools: ToolsMode = "all"
    distractors: int = Field(default=2, ge=0, description="tools: needed — other tools added to each row")
    schemas: SchemaStyle = "full"
    seed: int = Field(default=0, description="tools: needed — seeds the choice of distractor tools")
    prompts_dir: Path | None = Field(
        default=None, description="prompt folder holding the export wording; None: the settings' prompt folder"
    )


def default_per(fmt: str) -> Per:
    """One row a conversation for LLaMA-Factory, which trains every assistant message of a row (per-turn rows
    repeat the earlier turns, trained again in every later row); one a turn for the other formats."""
    return "conversation" if fmt == "llamafactory" else "turn"
