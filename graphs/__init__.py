"""The LangGraph wiring of the two LLM pipelines, nothing else.

- `envgen/`: EnvGen (`state`, `nodes`, `graph`);
- `querygen/`: QueryGen (`state`, `nodes`, `graph`, `run` for one chain, `batch` for `envfactory synth`);
- `routing`: the conditional edge the graphs share; `running`: run or resume a graph on a thread;
- `checkpoint`: the checkpointers (SQLite by default, Postgres when configured);
- `cli/`: the commands that run the graphs (`envfactory envgen`, `envfactory synth`).

Nodes are thin wrappers over `envfactory_agents/` and the library's model-free parts; the library (`envfactory/`)
never imports this package.
"""
