"""Tests of graphs/: the LangGraph pipelines (EnvGen, QueryGen, checkpoints, Studio)."""
