"""`configs/mcp_server.json`: the registry of verified environments, in the MCP clients' format.

Any MCP client that reads an `mcpServers` map (Claude Desktop, MCP Inspector, the EnvFactory
paper's code) can start a registered environment from its entry; the extra keys say what it is.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envfactory.errors import EnvFactoryError


class ServerEntry(BaseModel):
    model_config = ConfigDict(extra="allow")

    command: str = "envfactory"
    args: list[str]
    domain: str
    tools: int
    write_tools: int
    source: str
    scenarios: list[str] = Field(default_factory=list)


class Registry(BaseModel):
    model_config = ConfigDict(extra="allow")

    mcpServers: dict[str, ServerEntry] = Field(default_factory=dict)


class RegistryError(EnvFactoryError):
    pass


def load_registry(path: Path) -> Registry:
    if not path.exists():
        return Registry()
    try:
        return Registry.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except json.JSONDecodeError as e:
        raise RegistryError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}; fix or delete it") from None
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise RegistryError(f"{path}: field '{loc}': {err['msg']}; fix or delete it") from None


def save_registry(path: Path, registry: Registry) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = Registry(mcpServers=dict(sorted(registry.mcpServers.items())))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(ordered.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)  # atomic: a crash never leaves a half-written registry
