"""Imported benchmark suites, each adapted to the environment contract in a folder of its own.

- `bfcl`: BFCL's multi-turn backend classes as environments, its entries, ground truth and data-flow
  check (`flows`).

A suite registers its environments with the pool through the `envfactory.suites` entry point group
(pyproject.toml); the runtime (`envfactory.env`) never imports a suite.
"""
