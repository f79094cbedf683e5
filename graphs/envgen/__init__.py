"""EnvGen: search → code → test → (pass → register | errors, budget left → revise → test | budget spent → reject).

A checkpointed LangGraph state machine. `build(checkpointer)` is for the CLI and tests (SQLite by
default, run with `durability="sync"` so a killed process resumes mid-loop); `graph` is the
checkpointer-free export for `langgraph.json` / LangGraph Studio. Every node is a thin wrapper over
an agent in `envfactory_agents/`; every failure is a state (`status: failed` + `failure`), routed to END.
A spec that compiles (a corpus entry, an OpenAPI file) is revised as a compiled plan (`plan`: data, judged by
the compiled environments' gate) instead of written as code; `nodes` says how.

Modules: `state` (state, context, shared readers), `nodes`, `graph` (routing, `build`, `graph`).
"""

from graphs.envgen.graph import build, graph
from graphs.envgen.state import EnvGenContext, EnvGenState

__all__ = ["EnvGenContext", "EnvGenState", "build", "graph"]
