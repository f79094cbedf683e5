"""The SynthAPI meta-tool hub, in process: the whole pool behind a handful of meta-tools.

An agent does not hold every tool schema of every app in its context; it discovers them on demand:

- `list_apps()` — the apps (environments): name, description, domain, number of tools;
- `list_tools(app)` — each tool of an app: name, one-line description, kind (read / write);
- `get_tool_documentation(app, tool)` — the full description, the JSON-Schema input parameters and
  the output schema of one tool;
- `call_tool(app, tool, arguments)` — run a discovered tool;
- `complete_task(answer)` — end the episode and run the task's state verifier.

SynthAPI names four meta-tools (list_apps, list_tools, get_tool_documentation, complete_task): its
agent executes the tools it discovers directly, since its harness adds them to the model's tool list
once documented. Over MCP (`envfactory.serve.hub_server`) a client's tool list is fixed at connection
time, and re-listing per discovered tool would defeat the purpose, so the fifth meta-tool,
`call_tool`, is how a discovered tool is executed: the same call a direct tool would make, routed to
this episode's isolated `Session` of that app.

An *episode* (`HubEpisode`) is one conversation: one `Session` per app it touches (forked lazily from
the app's default scenario, or from the task's initial state), the active task T = (x, v, Db⁰, π*)
if any, and whether it has ended. Loading a task forks every app of `task.servers` from
`task.initial_state[app]`; the other apps start from their default scenario when first called.
`complete_task` runs `verify(task.verifier, task.initial_state, <final dumps>, answer)`; after it the
episode refuses tool calls until a task is loaded again.

`Hub` is independent of MCP: evaluation and the LLM solver agents use it directly (the catalogue methods,
the episode methods, or `invoke` to dispatch a meta-tool call by name with JSON arguments); serving it over
MCP is `envfactory.serve.hub_server`'s job, so nothing here imports a server. The modules: `protocol` (the
meta-tools' names, argument models, results and `HubError`), `tasks` (the tasks file), `hub` (`Hub`,
`HubEpisode`).
"""

from envfactory.metatools.hub import Hub, HubCall, HubEpisode
from envfactory.metatools.protocol import (
    CALL_TOOL,
    COMPLETE_TASK,
    GET_TOOL_DOC,
    LIST_APPS,
    LIST_TOOLS,
    META_TOOLS,
    AppInfo,
    CompletionResult,
    HubError,
    HubErrorCode,
    MetaOutcome,
    MetaToolSpec,
    TaskLoaded,
    ToolDoc,
    ToolInfo,
)
from envfactory.metatools.tasks import load_tasks

__all__ = [
    "CALL_TOOL",
    "COMPLETE_TASK",
    "GET_TOOL_DOC",
    "LIST_APPS",
    "LIST_TOOLS",
    "META_TOOLS",
    "AppInfo",
    "CompletionResult",
    "Hub",
    "HubCall",
    "HubEpisode",
    "HubError",
    "HubErrorCode",
    "MetaOutcome",
    "MetaToolSpec",
    "TaskLoaded",
    "ToolDoc",
    "ToolInfo",
    "load_tasks",
]
