"""Settings of the tool graph and the sampler (`ENVFACTORY_TOOLGRAPH_*` environment variables)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from envfactory.config import Role, Settings
from envfactory.llm.embeddings import EmbedBackend

CrossEnvEdges = Literal["none", "external", "all"]


class ToolGraphSettings(BaseSettings):
    """Graph construction and topology-aware sampling. Defaults follow the EnvFactory write-up (section 3.3)."""

    model_config = SettingsConfigDict(env_prefix="ENVFACTORY_TOOLGRAPH_", extra="ignore")

    # ---- similarity edges ------------------------------------------------------------------------
    build_edge_threshold: float = Field(default=0.85, description="an output→input pair above this is an edge")
    name_type_weight: float = Field(
        default=0.6, ge=0, le=1, description="weight of name/type similarity; the description cosine gets the rest"
    )
    name_share: float = Field(
        default=0.75, ge=0, le=1, description="inside name/type similarity: the name's share (the type gets the rest)"
    )
    cross_env_edges: CrossEnvEdges = Field(
        default="external",
        description="edges between tools of different environments: none, only into user-provided inputs "
        "(an id lives in its own environment's state; a city or a date can travel), or all",
    )
    cross_env_top_k: int = Field(default=3, ge=0, description="at most this many cross-environment producers per input")
    schema_edges: bool = Field(
        default=True,
        description="add the edges the tools' schemas imply (an id input and the record it names, a list and "
        "its items, the same name, a value its description names, values of one kind) beside the similarity ones",
    )
    validate_hops: int = Field(
        default=3, ge=1, description="Parameter_Relate hops validate_parameter follows (1: direct producers only)"
    )
    block_cells: int = Field(
        default=1 << 24, ge=1 << 16, description="key pairs scored per step of the similarity (memory bound)"
    )
    embed_batch: int = Field(default=512, ge=1, description="texts per embedding call (one progress step)")
    embed_backend: EmbedBackend = Field(
        default="onnx",
        description="how the embedding model runs: onnx (the model exported once to ONNX under the data dir, "
        "the same vectors as torch to float rounding, ~2x faster), torch (sentence-transformers), or onnx-int8 "
        "(faster again, but moves about one edge in eight of a large graph); onnx falls back to torch where "
        "its packages are missing",
    )
    embed_threads: int = Field(default=0, ge=0, description="cores the ONNX backend embeds on (0: all available)")
    onnx_export_min_texts: int = Field(
        default=2000,
        ge=0,
        description="a build with fewer texts to embed than this, while the model has no ONNX export yet, embeds "
        "them with torch: the export (seconds, once) would cost more than it saves; the vectors are the same",
    )

    # ---- user_provided ---------------------------------------------------------------------------
    lean_internal_threshold: float = Field(
        default=0.92, description="heuristic: an ambiguous input some tool outputs at least this similarly is internal"
    )

    # ---- LLM -------------------------------------------------------------------------------------
    use_llm: bool = Field(default=True, description="classify and refine with the LLM when one is configured")
    llm_role: Role = Field(default="search", description="the role whose chat model classifies and refines")

    # ---- sampler ---------------------------------------------------------------------------------
    skip_optional_p: float = Field(default=0.6, ge=0, le=1)
    skip_satisfied_p: float = Field(default=0.9, ge=0, le=1)
    max_servers: int = Field(default=3, ge=1, description="distinct environments per chain")
    max_depth: int = Field(default=3, ge=0, description="recursion depth of prior resolution")
    turn_min: int = Field(default=1, ge=1)
    turn_max: int = Field(default=5, ge=1)
    attempts_per_chain: int = Field(default=50, ge=1, description="start tools tried before a chain is given up")

    @model_validator(mode="after")
    def _turns(self) -> ToolGraphSettings:
        if self.turn_min > self.turn_max:
            raise ValueError(f"turn_min ({self.turn_min}) is above turn_max ({self.turn_max})")
        return self


def graph_path(settings: Settings) -> Path:
    """Where `envfactory graph build` writes and the other commands read by default."""
    return settings.data_path / "toolgraph" / "graph.json"


def cache_path(settings: Settings) -> Path:
    """The embedding cache of parameter texts (a folder holding one SQLite file)."""
    return settings.data_path / "toolgraph" / "embeddings"


def onnx_path(settings: Settings) -> Path:
    """Where embedding models exported to ONNX are kept, one folder per model files' hash."""
    return settings.data_path / "models" / "onnx"
