"""The dependency tool graph and topology-aware chain sampling (EnvFactory, section 3.3).

Modules, one concept each:

- `settings`: where the graph's files live (`ToolGraphSettings` — threshold, weights, cross-environment
  policy, sampler constants — is in the one settings root, `envfactory.config`: `Settings().toolgraph`);
- (names as tokens — split, singular, qualifiers, record-id names — are `envfactory.words`, shared with synthesis);
- `params`: `ToolSource` (a tool of the pool) and `ParamSpec` (an input or output parameter), with
  the rules that read outputs from output schemas or descriptions;
- `collect`: the pool's tools as sources (with native tools' return type names);
- `similarity`: the vectorized output × input similarity (and the naive loop it replaces);
- `schema_edges`: the dependencies the schemas imply beside the similarity (ids and their records,
  lists and their items, same names, values a description names, values of one kind);
- `classify`: the `user_provided` heuristic; `llm_classify`: the same decision by the LLM;
- `graph`: `ToolGraph`, the NetworkX DiGraph and its queries (`validate_parameter`...);
- `build`: `build_tool_graph`, the pipeline from sources to graph; `refine`: LLM refinement;
- `io`: JSON save/load with a format version, GraphML export; `html`: one environment's HTML view;
- `sampler`: `TopologySampler` and `ToolChain`;
- `synthetic`: synthetic pools for benchmarks (BFCL's ground-truth flows, the recall check:
  `envfactory.suites.bfcl.flows`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# `classify` is also a module's name: once that module is imported the package's `classify` would be the module,
# so the function is bound here, at once (the module is light)
from envfactory.toolgraph.classify import Verdict, classify

if TYPE_CHECKING:
    from envfactory.config import ToolGraphSettings
    from envfactory.toolgraph.build import BuildReport, BuildTimings, build_tool_graph, embed_texts
    from envfactory.toolgraph.collect import env_sources, pool_sources
    from envfactory.toolgraph.errors import ToolGraphError
    from envfactory.toolgraph.graph import GraphStats, ToolGraph
    from envfactory.toolgraph.html import render_env_html
    from envfactory.toolgraph.io import FORMAT_VERSION, export_graphml, load_graph, save_graph
    from envfactory.toolgraph.params import ParamSpec, ToolSource, input_params, output_params
    from envfactory.toolgraph.sampler import ChainStep, InputSource, ToolChain, TopologySampler, split_into, split_turns
    from envfactory.toolgraph.schema_edges import add_schema_edges, schema_pairs
    from envfactory.toolgraph.settings import cache_path, graph_path
    from envfactory.toolgraph.similarity import naive_pairs, similar_pairs
    from envfactory.toolgraph.synthetic import synthetic_sources

# The rest imported when first named: the build pulls numpy, the embedding stack and the LLM clients (about a second),
# which `settings` or `sampler` alone (the corpus reader, synthesis) never need.
_WHERE: dict[str, str] = {
    "BuildReport": "envfactory.toolgraph.build",
    "BuildTimings": "envfactory.toolgraph.build",
    "ChainStep": "envfactory.toolgraph.sampler",
    "FORMAT_VERSION": "envfactory.toolgraph.io",
    "GraphStats": "envfactory.toolgraph.graph",
    "InputSource": "envfactory.toolgraph.sampler",
    "ParamSpec": "envfactory.toolgraph.params",
    "ToolChain": "envfactory.toolgraph.sampler",
    "ToolGraph": "envfactory.toolgraph.graph",
    "ToolGraphError": "envfactory.toolgraph.errors",
    "ToolGraphSettings": "envfactory.config",
    "ToolSource": "envfactory.toolgraph.params",
    "TopologySampler": "envfactory.toolgraph.sampler",
    "add_schema_edges": "envfactory.toolgraph.schema_edges",
    "build_tool_graph": "envfactory.toolgraph.build",
    "cache_path": "envfactory.toolgraph.settings",
    "embed_texts": "envfactory.toolgraph.build",
    "env_sources": "envfactory.toolgraph.collect",
    "export_graphml": "envfactory.toolgraph.io",
    "graph_path": "envfactory.toolgraph.settings",
    "input_params": "envfactory.toolgraph.params",
    "load_graph": "envfactory.toolgraph.io",
    "naive_pairs": "envfactory.toolgraph.similarity",
    "output_params": "envfactory.toolgraph.params",
    "pool_sources": "envfactory.toolgraph.collect",
    "render_env_html": "envfactory.toolgraph.html",
    "save_graph": "envfactory.toolgraph.io",
    "schema_pairs": "envfactory.toolgraph.schema_edges",
    "similar_pairs": "envfactory.toolgraph.similarity",
    "split_into": "envfactory.toolgraph.sampler",
    "split_turns": "envfactory.toolgraph.sampler",
    "synthetic_sources": "envfactory.toolgraph.synthetic",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'envfactory.toolgraph' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "FORMAT_VERSION",
    "BuildReport",
    "BuildTimings",
    "ChainStep",
    "GraphStats",
    "InputSource",
    "ParamSpec",
    "ToolChain",
    "ToolGraph",
    "ToolGraphError",
    "ToolGraphSettings",
    "ToolSource",
    "TopologySampler",
    "Verdict",
    "add_schema_edges",
    "build_tool_graph",
    "cache_path",
    "classify",
    "embed_texts",
    "env_sources",
    "export_graphml",
    "graph_path",
    "input_params",
    "load_graph",
    "naive_pairs",
    "output_params",
    "pool_sources",
    "render_env_html",
    "save_graph",
    "schema_pairs",
    "similar_pairs",
    "split_into",
    "split_turns",
    "synthetic_sources",
]
