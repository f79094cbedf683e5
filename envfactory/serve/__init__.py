"""Serving: environments behind MCP — one environment per server (`mcp_server`), or the whole pool behind
SynthAPI's meta-tools (`hub`, in-process; `hub_server`, over MCP). Serving sits above the runtime
(`envfactory.env`) and the tasks (`envfactory.tasks`, which the hub loads and verifies)."""
