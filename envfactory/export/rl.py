"""`convert_to_rl_data`: one RL sample per turn, the record of the EnvFactory reference (section 3.5).

`prompt` = the conversation so far (failed calls removed) + the turn's query; `reward_model.ground_truth` = the
JSON of the turn's successful assistant calls (`name`, `arguments`, `masked_arguments`, plus `server` so a reward
can replay them); `extra_info.mcp_factory_kwargs` = `mcp_servers`, `initial_config`, `final_config`, each a JSON
string. Turns where the user spoke again or acted mid-turn are left out unless `include_interactive` (a rollout
has no simulated user to answer, and the user's own calls are needed to reach `final_config`). `extra_info.tools` is
the turn's tool list: its conversation's, or only the tools it needs (`ExportOptions.tools`, see `row_tools.py`).
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from envfactory.export.messages import ChatMessage
from envfactory.export.options import ExportOptions
from envfactory.export.row_tools import row_tools
from envfactory.export.sft import system_messages
from envfactory.export.tools_schema import Catalog, ToolNamer, ToolSchema, conversation_tools, tools_json
from envfactory.export.turns import conversation_turns
from envfactory.records.models import Conversation, Node, ToolCall

DATA_SOURCE = "EnvFactory"
AGENT_NAME = "tool_agent"
ABILITY = "tool_use"


class GroundTruthCall(BaseModel):
    """One call the turn must make: exported tool name, arguments, arguments a reward ignores, environment."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, object] = Field(default_factory=dict)
    masked_arguments: list[str] = Field(default_factory=list)
    server: str

    @property
    def tool(self) -> str:
        """The environment's own tool name (`name` less the `server__` prefix a shared name gets)."""
        prefix = f"{self.server}__"
        return self.name[len(prefix) :] if self.name.startswith(prefix) else self.name


class RewardModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    style: Literal["rule"] = "rule"
    ground_truth: str  # JSON list of GroundTruthCall


class MCPFactoryKwargs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mcp_servers: str  # JSON list of environment names
    initial_config: str  # JSON: environment → state before the turn
    final_config: str  # JSON: environment → state after it


class ExtraInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mcp_factory_kwargs: MCPFactoryKwargs
    conversation_id: str
    turn: int
    tools: str  # JSON of the OpenAI-style tool list the prompt is rendered with


class RLSample(BaseModel):
    """The reference RL record, with `prompt` as a list of messages."""

    model_config = ConfigDict(extra="forbid")

    data_source: str = DATA_SOURCE
    agent_name: str = AGENT_NAME
    ability: str = ABILITY
    prompt: list[ChatMessage]
    reward_model: RewardModel
    extra_info: ExtraInfo

    def ground_truth_calls(self) -> list[GroundTruthCall]:
        return [GroundTruthCall.model_validate(c) for c in json.loads(self.reward_model.ground_truth)]

    def tool_list(self) -> list[ToolSchema]:
        return [ToolSchema.model_validate(t) for t in json.loads(self.extra_info.tools)]

    def servers(self) -> list[str]:
        """The environments the turn runs on (`mcp_servers`), in order."""
        return list(json.loads(self.extra_info.mcp_factory_kwargs.mcp_servers))


def ground_truth(calls: list[ToolCall], namer: ToolNamer) -> list[GroundTruthCall]:
    return [
        GroundTruthCall(
            name=namer.name(c.server, c.name),
            arguments=dict(c.arguments),
            masked_arguments=list(c.masked_arguments),
            server=c.server,
        )
        for c in calls
    ]


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def mcp_factory_kwargs(node: Node) -> MCPFactoryKwargs:
    return MCPFactoryKwargs(
        mcp_servers=_dumps(node.mcp_servers),
        initial_config=_dumps(node.initial_scenario),
        final_config=_dumps(node.final_scenario),
    )


def convert_to_rl_data(
    conversation: Conversation, catalog: Catalog, options: ExportOptions | None = None
) -> list[RLSample]:
    """RL samples of one conversation, one per turn (up to the first turn without an answer)."""
    options = options or ExportOptions()
    namer, tools = conversation_tools(conversation, catalog)
    turns = conversation_turns(conversation.nodes, namer, options)
    nodes = {n.index: n for n in conversation.nodes}
    history = system_messages(options)
    samples: list[RLSample] = []
    for turn in turns:
        node = nodes[turn.index]
        if options.include_interactive or not turn.interactive:
            calls = ground_truth(turn.calls, namer)
            row_id = f"{conversation.id}#{turn.index}"  # as the turn's SFT sample: the same tools in both
            tool_list = tools_json(row_tools(tools, namer, history + turn.messages, row_id, options))
            samples.append(
                RLSample(
                    prompt=[*history, ChatMessage(role="user", content=node.query.strip())],
                    reward_model=RewardModel(ground_truth=_dumps([c.model_dump(mode="json") for c in calls])),
                    extra_info=ExtraInfo(
                        mcp_factory_kwargs=mcp_factory_kwargs(node),
                        conversation_id=conversation.id,
                        turn=turn.index,
                        tools=tool_list,
                    ),
                )
            )
        history = history + turn.messages
    return samples
