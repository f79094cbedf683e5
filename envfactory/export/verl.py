"""VeRL parquet: the reference RL record, one row per turn (`data_source`, `prompt`, `ability`, `reward_model`,
`extra_info`, `agent_name`).

Written with pyarrow under one fixed schema, so any Arrow reader (VeRL's `datasets.load_dataset("parquet")`,
pandas) loads it: `prompt` is a list of message structs (`role`, `content`, `reasoning_content`, `name`,
`tool_call_id`, `tool_calls`), absent fields null; a tool call's `arguments` is a JSON **string** here (the
OpenAI wire form), since one Arrow struct cannot hold every tool's arguments without padding each with the
others' keys. `reward_model.ground_truth` and `extra_info.mcp_factory_kwargs.*` are JSON strings, as in the
reference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envfactory.export.messages import ChatMessage
from envfactory.export.rl import RLSample

FILE = "train.parquet"


def verl_message(message: ChatMessage) -> dict[str, Any]:
    calls = None
    if message.tool_calls:
        calls = [
            {
                "id": c.id,
                "type": c.type,
                "function": {
                    "name": c.function.name,
                    "arguments": json.dumps(c.function.arguments, ensure_ascii=False),
                },
            }
            for c in message.tool_calls
        ]
    return {
        "role": message.role,
        "content": message.content,
        "reasoning_content": message.reasoning_content,
        "name": message.name,
        "tool_call_id": message.tool_call_id,
        "tool_calls": calls,
    }


def verl_row(sample: RLSample) -> dict[str, Any]:
    return {
        "data_source": sample.data_source,
        "prompt": [verl_message(m) for m in sample.prompt],
        "ability": sample.ability,
        "reward_model": sample.reward_model.model_dump(mode="json"),
        "extra_info": sample.extra_info.model_dump(mode="json"),
        "agent_name": sample.agent_name,
    }


def verl_schema() -> Any:
    import pyarrow as pa

    s = pa.string()
    call = pa.struct(
        [("id", s), ("type", s), ("function", pa.struct([("name", s), ("arguments", s)]))],
    )
    message = pa.struct(
        [
            ("role", s),
            ("content", s),
            ("reasoning_content", s),
            ("name", s),
            ("tool_call_id", s),
            ("tool_calls", pa.list_(call)),
        ]
    )
    kwargs = pa.struct([("mcp_servers", s), ("initial_config", s), ("final_config", s)])
    return pa.schema(
        [
            ("data_source", s),
            ("prompt", pa.list_(message)),
            ("ability", s),
            ("reward_model", pa.struct([("style", s), ("ground_truth", s)])),
            (
                "extra_info",
                pa.struct([("mcp_factory_kwargs", kwargs), ("conversation_id", s), ("turn", pa.int64()), ("tools", s)]),
            ),
            ("agent_name", s),
        ]
    )


def write_verl(samples: list[RLSample], out: Path) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    path = out / FILE
    table = pa.Table.from_pylist([verl_row(s) for s in samples], schema=verl_schema())
    pq.write_table(table, path)
    return [path]
