"""LlamaFactory sharegpt data: `train.jsonl` + the `dataset_info.json` entry that describes it.

Each row: `conversations` of `{"from", "value"}` with `human` / `gpt` / `function_call` / `observation`, the
`system` prompt and `tools` (a JSON string of the OpenAI-style tool list; LlamaFactory's tool formatters take
that shape). LlamaFactory's sharegpt converter requires human/observation at odd and gpt/function_call at even
positions, so: a `function_call` value is the JSON call `{"name", "arguments"}` (a list for parallel calls),
optionally after the `<think>` trace (LlamaFactory's FunctionFormatter keeps a thought prefix, nothing else — the
assistant's words beside its calls are dropped); the results of one call step form one `observation` (joined with
`</tool_response>`/`<tool_response>` as LlamaFactory's own OpenAI converter joins them); consecutive user or
answer messages are merged. A sample that still cannot alternate is skipped and counted.

LlamaFactory trains every gpt/function_call message of a row (`mask_history: true` keeps only the last pair), so
`per="conversation"` suits it best; `per="turn"` rows repeat the earlier turns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from envfactory.export.files import write_jsonl
from envfactory.export.messages import ChatMessage
from envfactory.export.sft import SFTSample
from envfactory.export.tools_schema import tools_json

FILE = "train.jsonl"
DATASET_INFO = "dataset_info.json"
DATASET_NAME = "envfactory"
OBSERVATION_JOIN = "\n</tool_response>\n<tool_response>\n"

ShareGPTRole = Literal["human", "gpt", "function_call", "observation"]
_ODD: tuple[str, ...] = ("human", "observation")
_EVEN: tuple[str, ...] = ("gpt", "function_call")


class ShareGPTMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    from_: ShareGPTRole = Field(alias="from")
    value: str


class LlamaFactoryRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    conversations: list[ShareGPTMessage]
    system: str
    tools: str
    id: str


class DatasetColumns(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messages: str = "conversations"
    system: str = "system"
    tools: str = "tools"


class DatasetTags(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role_tag: str = "from"
    content_tag: str = "value"
    user_tag: str = "human"
    assistant_tag: str = "gpt"
    observation_tag: str = "observation"
    function_tag: str = "function_call"
    system_tag: str = "system"


class DatasetInfoEntry(BaseModel):
    """One entry of LlamaFactory's `dataset_info.json`."""

    model_config = ConfigDict(extra="forbid")

    file_name: str = FILE
    formatting: Literal["sharegpt"] = "sharegpt"
    columns: DatasetColumns = Field(default_factory=DatasetColumns)
    tags: DatasetTags = Field(default_factory=DatasetTags)


def _think(message: ChatMessage) -> str:
    return f"<think>\n{message.reasoning_content.strip()}\n</think>\n\n" if message.reasoning_content else ""


def sharegpt_messages(messages: list[ChatMessage]) -> tuple[str, list[ShareGPTMessage]] | None:
    """(system, conversations), or None when the roles cannot alternate as LlamaFactory requires."""
    system = "\n\n".join(m.content for m in messages if m.role == "system")
    out: list[ShareGPTMessage] = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "assistant" and m.tool_calls:
            calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls]
            value = json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)
            out.append(ShareGPTMessage(from_="function_call", value=_think(m) + value))
            continue
        role: ShareGPTRole = {"user": "human", "assistant": "gpt", "tool": "observation"}[m.role]  # type: ignore[assignment]
        value = _think(m) + m.content if m.role == "assistant" else m.content
        if out and out[-1].from_ == role:
            joiner = OBSERVATION_JOIN if role == "observation" else "\n\n"
            out[-1] = ShareGPTMessage(from_=role, value=out[-1].value + joiner + value)
        else:
            out.append(ShareGPTMessage(from_=role, value=value))
    ok = len(out) % 2 == 0 and all(m.from_ in (_ODD if k % 2 == 0 else _EVEN) for k, m in enumerate(out))
    return (system, out) if ok else None


def llamafactory_record(sample: SFTSample) -> LlamaFactoryRecord | None:
    converted = sharegpt_messages(sample.messages)
    if converted is None:
        return None
    system, conversations = converted
    return LlamaFactoryRecord(conversations=conversations, system=system, tools=tools_json(sample.tools), id=sample.id)


def write_llamafactory(samples: list[SFTSample], out: Path, name: str = DATASET_NAME) -> tuple[list[Path], int]:
    """Writes the rows and `dataset_info.json`; returns the files and how many samples were skipped."""
    records = [llamafactory_record(s) for s in samples]
    path = out / FILE
    write_jsonl((r for r in records if r is not None), path)
    info = out / DATASET_INFO
    entry = DatasetInfoEntry(file_name=FILE)
    info.write_text(json.dumps({name: entry.model_dump(mode="json")}, indent=2) + "\n", encoding="utf-8")
    return [path, info], sum(1 for r in records if r is None)
