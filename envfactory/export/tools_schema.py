"""The OpenAI-style tool list of a conversation's environments, and one naming of tools for a whole export.

A conversation may span several environments, and two of them may share a tool name: a tool keeps its plain
name when it is unique among the conversation's environments, else it is `env__tool` (the solver agent
exposes tools the same way). The same name is used in `tools`, in assistant tool calls, in tool messages
and in the RL ground truth (which also keeps `server`, so a reward can replay the call).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envfactory.env.metadata import EnvMetadata
from envfactory.errors import EnvFactoryError
from envfactory.export.errors import ExportError
from envfactory.records.models import Conversation

if TYPE_CHECKING:
    from envfactory.env.pool import EnvPool

Catalog = Mapping[str, EnvMetadata]  # environment name → its metadata


class FunctionSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolSchema(BaseModel):
    """One entry of `tools=` for `apply_chat_template` (and of an OpenAI `tools` list)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"] = "function"
    function: FunctionSchema


class ToolNamer:
    """Exported names for the tools of some environments: plain when unique, else `env__tool`."""

    def __init__(self, catalog: Catalog, servers: list[str]) -> None:
        missing = [s for s in servers if s not in catalog]
        if missing:
            raise ExportError(f"no metadata for environment '{missing[0]}' (is it in the pool?)")
        owners: dict[str, list[str]] = {}
        for server in servers:
            for name in catalog[server].tool_names:
                owners.setdefault(name, []).append(server)
        self._names = {
            (server, tool): tool if len(owners[tool]) == 1 else f"{server}__{tool}"
            for server in servers
            for tool in catalog[server].tool_names
        }

    def name(self, server: str, tool: str) -> str:
        """The exported name; a tool the environments do not define keeps its own name."""
        return self._names.get((server, tool), tool)

    def resolve(self, exported: str) -> tuple[str, str] | None:
        """(environment, tool) of an exported name; None for a name no environment here defines."""
        for key, name in self._names.items():
            if name == exported:
                return key
        return None


def conversation_servers(conversation: Conversation) -> list[str]:
    """Every environment the conversation touches, in order of first use."""
    names = [*conversation.servers, *(s for n in conversation.nodes for s in n.mcp_servers)]
    return list(dict.fromkeys(names))


def user_only_tools(conversation: Conversation) -> set[tuple[str, str]]:
    """Tools only the user used (conversational variant): the assistant was not given them."""
    user = {(u.call.server, u.call.name) for n in conversation.nodes for u in n.user_calls}
    assistant = {(c.server, c.name) for n in conversation.nodes for c in n.tool_calls()}
    return user - assistant


def conversation_tools(conversation: Conversation, catalog: Catalog) -> tuple[ToolNamer, list[ToolSchema]]:
    """The naming and the tool list for one conversation: every tool of its environments, less user-only ones."""
    servers = conversation_servers(conversation)
    namer = ToolNamer(catalog, servers)
    hidden = user_only_tools(conversation)
    tools = [
        ToolSchema(
            function=FunctionSchema(
                name=namer.name(server, spec.name), description=spec.description, parameters=spec.input_schema
            )
        )
        for server in servers
        for spec in catalog[server].tools
        if (server, spec.name) not in hidden
    ]
    return namer, tools


def catalog_from_pool(pool: EnvPool, servers: Iterable[str]) -> dict[str, EnvMetadata]:
    """The metadata of the named environments, loaded from the pool."""
    catalog: dict[str, EnvMetadata] = {}
    for name in dict.fromkeys(servers):
        try:
            catalog[name] = pool.get(name).metadata
        except EnvFactoryError as e:
            raise ExportError(f"environment '{name}': {e}") from None
    return catalog


def catalog_for(pool: EnvPool, conversations: Iterable[Conversation]) -> dict[str, EnvMetadata]:
    """The metadata of every environment the conversations touch; refused (`ExportError`) where a conversation calls
    a tool its environment does not declare: its row would train a call to a tool its tool list never offers."""
    conversations = list(conversations)
    catalog = catalog_from_pool(pool, (s for c in conversations for s in conversation_servers(c)))
    names = {server: set(meta.tool_names) for server, meta in catalog.items()}
    for c in conversations:
        for node in c.nodes:
            calls = [*node.tool_calls(), *(u.call for u in node.user_calls)]
            for call in calls:
                if call.server in names and call.name not in names[call.server]:
                    raise ExportError(
                        f"conversation {c.id} calls {call.name}, which environment {call.server} does not declare "
                        "(was the run made before a change to it?): export the run with the environment it was made "
                        "with, or synthesize it again"
                    )
    return catalog


def tools_json(tools: list[ToolSchema]) -> str:
    """The tool list as one JSON string (TRL's SFT trainer `json.loads` a string `tools` column)."""
    return json.dumps([t.model_dump(mode="json") for t in tools], ensure_ascii=False)
