"""The dependency tool graph and topology-aware chain sampling (EnvFactory, section 3.3).

Modules, one concept each:

- `settings`: `ToolGraphSettings` (threshold, weights, cross-environment policy, sampler constants);
- `names`: parameter and record names as tokens (split, singular, qualifiers, record-id names);
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

from envfactory.toolgraph.build import BuildReport, BuildTimings, build_tool_graph, embed_texts
from envfactory.toolgraph.classify import Verdict, classify
from envfactory.toolgraph.collect import env_sources, pool_sources
from envfactory.toolgraph.errors import ToolGraphError
from envfactory.toolgraph.graph import GraphStats, ToolGraph
from envfactory.toolgraph.html import render_env_html
from envfactory.toolgraph.io import FORMAT_VERSION, export_graphml, load_graph, save_graph
from envfactory.toolgraph.params import ParamSpec, ToolSource, input_params, output_params
from envfactory.toolgraph.sampler import ChainStep, InputSource, ToolChain, TopologySampler, split_turns
from envfactory.toolgraph.schema_edges import add_schema_edges, schema_pairs
from envfactory.toolgraph.settings import ToolGraphSettings, cache_path, graph_path
from envfactory.toolgraph.similarity import naive_pairs, similar_pairs
from envfactory.toolgraph.synthetic import synthetic_sources

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
    "split_turns",
    "synthetic_sources",
]
