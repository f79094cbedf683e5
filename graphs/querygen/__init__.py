"""QueryGen: one sampled tool chain → one verified multi-turn `Conversation` (generator "llm").

    prepare → schema_generate → per turn: generate → refine? → solve ×k (Send) → select → filter?
            → advance → (generate | finish) → END

A checkpointed LangGraph state machine (EnvFactory section 3.4). `build(checkpointer)` is for the
CLI, the batch runner and tests (run with `durability="sync"`, so a killed process resumes mid-turn,
and after a crash in one solver branch only that branch re-runs); `graph` is the checkpointer-free
export for `langgraph.json`. Nodes are thin over the agents in `envfactory_agents/` (query, solver, user,
select). Every failure is a state (`status: dropped` + `failure`) routed to END — a model's bad
answer never raises out of the graph; transport errors do propagate.

Input: `{"chain": ToolChain dump, "seed": int, "conversation_id": str}`, optionally
`"initial_state"` (+ `"core_ids"`) to skip the model in schema_generate. Output: `status`,
`failure`, and `conversation` (a `Conversation` dump) when kept.


Modules: `state` (state, input, context, shared readers), `nodes`, `graph` (routing, `build`, `graph`),
`run` (`run_querygen`: one chain, run or resumed), `batch` (the runner of `envfactory synth`'s LLM mode).
"""

from envfactory.querygen.records import QueryGenConfig, QueryGenError
from graphs.querygen.graph import build, graph
from graphs.querygen.run import QueryGenOutcome, run_querygen
from graphs.querygen.state import QueryGenContext, QueryGenInput, QueryGenState

__all__ = [
    "QueryGenConfig",
    "QueryGenContext",
    "QueryGenError",
    "QueryGenInput",
    "QueryGenOutcome",
    "QueryGenState",
    "build",
    "graph",
    "run_querygen",
]
