"""What EnvGen needs besides the models: finding sources, importing API docs, judging and registering code.

- `sources`: authentic API documents for the Search Agent (web search or a local folder);
- `coverage`: pool coverage (which domains are thin, is a proposal new);
- `openapi`: OpenAPI → environment metadata, deterministically;
- `checks`: the judge: test scenarios, schema-derived checks, the sandboxed validation round
  (`checks.sandbox_round`) and the verdict;
- `health`: the environment contract's invariants, measured by running an environment;
- `validate`: `envs validate`, and keeping `configs/mcp_server.json` in step with the pool (the registry's
  format is the runtime's, `envfactory.env.registry`: serving reads it too);
- `register`: write and register a generated environment.

Nothing here calls a model; the agents (`envfactory_agents/`) and the graph (`graphs/envgen/`) do.
"""
