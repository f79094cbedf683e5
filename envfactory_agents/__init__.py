"""The EnvFactory agents: Search, Code and Test (EnvGen); user simulator and solver (QueryGen).

Each module holds one agent's node functions and its structured outputs; the graphs in `graphs/`
wire them together. Agents depend on `envfactory` only.
"""
