"""Serving: environments behind MCP — one environment per server (`mcp_server`), or the whole pool behind
SynthAPI's meta-tools (`hub_server`, over MCP; the hub itself, in process, is `envfactory.metatools`). Serving
sits above the runtime (`envfactory.env`), the tasks (`envfactory.tasks`) and the meta-tools."""
