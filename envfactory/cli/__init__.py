"""The `envfactory` command: `main` (envs, hub, serve, demo, prompts...) and its lazily loaded sub-apps.

Sub-apps register through the `envfactory.cli` entry point group: `scaling`, `export` and `graph` from
here, `envgen` and `synth` from `graphs/cli/` (they run LangGraph graphs, which `envfactory/` never
imports).
"""

from envfactory.cli.main import app, main

__all__ = ["app", "main"]
