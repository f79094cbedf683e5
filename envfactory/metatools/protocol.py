"""The meta-tools' protocol: their names, descriptions and argument models (which are also their input schemas),
what each returns, and `HubError`, the errors a hub user can act on."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envfactory.env.metadata import ToolKind
from envfactory.env.tools import _strip_titles
from envfactory.errors import ServiceError

HubErrorCode = Literal[
    "unknown_app",
    "unknown_tool",
    "unknown_task",
    "invalid_task",
    "no_task",
    "episode_ended",
    "invalid_arguments",
    "unknown_meta_tool",
    "invalid_tasks_file",
    "environment_error",
]


class HubError(ServiceError):
    """An error a hub user can act on; `code` says which kind (the MCP server reports it as the error type)."""

    def __init__(self, code: HubErrorCode, message: str) -> None:
        self.code: HubErrorCode = code
        self.message = message
        super().__init__(message)

    def payload(self) -> dict[str, Any]:
        return {"error": {"type": self.code, "message": self.message}}


# ---- what the meta-tools return -------------------------------------------------------------------


class AppInfo(BaseModel):
    """One app of the hub, as `list_apps` shows it."""

    name: str
    description: str
    domain: str
    num_tools: int


class AppList(BaseModel):
    apps: list[AppInfo]


class ToolInfo(BaseModel):
    """One tool, as `list_tools` shows it: enough to decide whether to read its documentation."""

    name: str
    description: str = Field(description="the first sentence of the tool's description")
    kind: ToolKind


class ToolList(BaseModel):
    app: str
    tools: list[ToolInfo]


class ToolDoc(BaseModel):
    """The full documentation of one tool: what to call `call_tool` with, and what comes back."""

    app: str
    name: str
    kind: ToolKind
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None


class CompletionResult(BaseModel):
    """The verdict of `complete_task`: success, and in words what differs from the goal."""

    success: bool
    reasons: list[str] = Field(default_factory=list)


class TaskLoaded(BaseModel):
    """What loading a task answers: its id, instruction and apps."""

    task_id: str
    instruction: str
    apps: list[str]


class MetaOutcome(BaseModel):
    """The outcome of a meta-tool call by name (`Hub.invoke`): ok, and the JSON payload an agent sees."""

    ok: bool
    payload: Any = None


# ---- the meta-tools' arguments (their models are also the input schemas) --------------------------


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ListAppsArgs(_Args):
    pass


class ListToolsArgs(_Args):
    app: str = Field(description="name of an app, as list_apps returns it")


class GetToolDocumentationArgs(_Args):
    app: str = Field(description="name of an app, as list_apps returns it")
    tool: str = Field(description="name of one of the app's tools, as list_tools returns it")


class CallToolArgs(_Args):
    app: str = Field(description="name of an app, as list_apps returns it")
    tool: str = Field(description="name of one of the app's tools, as list_tools returns it")
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="the tool's arguments, as its documentation's input_schema describes"
    )


class CompleteTaskArgs(_Args):
    answer: str | None = Field(default=None, description="the final answer to the user, when the task asks for one")


class MetaToolSpec(BaseModel):
    """A meta-tool as an agent sees it: name, description, JSON-Schema input, and output schema if any."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None = None


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A Pydantic model's JSON Schema without the auto titles."""
    schema: dict[str, Any] = _strip_titles(model.model_json_schema())
    if schema.get("type") == "object":
        schema.setdefault("properties", {})
    return schema


LIST_APPS, LIST_TOOLS, GET_TOOL_DOC, CALL_TOOL, COMPLETE_TASK = (
    "list_apps",
    "list_tools",
    "get_tool_documentation",
    "call_tool",
    "complete_task",
)

META_TOOL_ARGS: dict[str, type[_Args]] = {
    LIST_APPS: ListAppsArgs,
    LIST_TOOLS: ListToolsArgs,
    GET_TOOL_DOC: GetToolDocumentationArgs,
    CALL_TOOL: CallToolArgs,
    COMPLETE_TASK: CompleteTaskArgs,
}

META_TOOLS: list[MetaToolSpec] = [
    MetaToolSpec(
        name=LIST_APPS,
        description="List the apps you can use: name, description, domain and number of tools of each.",
        input_schema=model_schema(ListAppsArgs),
        output_schema=model_schema(AppList),
    ),
    MetaToolSpec(
        name=LIST_TOOLS,
        description="List the tools of one app: name, one-line description and kind (read or write) of each.",
        input_schema=model_schema(ListToolsArgs),
        output_schema=model_schema(ToolList),
    ),
    MetaToolSpec(
        name=GET_TOOL_DOC,
        description=(
            "Get the full documentation of one tool of an app: its description, its input parameters (JSON Schema,"
            " with the required ones) and its output schema. Read it before calling a tool."
        ),
        input_schema=model_schema(GetToolDocumentationArgs),
        output_schema=model_schema(ToolDoc),
    ),
    MetaToolSpec(
        name=CALL_TOOL,
        description=(
            "Call one tool of an app with its arguments and return what the tool returns (an error object when"
            " the call fails). Each app keeps its state across your calls."
        ),
        input_schema=model_schema(CallToolArgs),
    ),
    MetaToolSpec(
        name=COMPLETE_TASK,
        description=(
            "Finish the task when you are done (give your final answer to the user if the task asks a question)."
            " The episode ends: no tool can be called after it."
        ),
        input_schema=model_schema(CompleteTaskArgs),
        output_schema=model_schema(CompletionResult),
    ),
]


def one_line(description: str) -> str:
    """The first sentence of the first non-empty line of a description."""
    line = next((ln.strip() for ln in description.splitlines() if ln.strip()), "")
    head, sep, _ = line.partition(". ")
    return head + "." if sep else line
