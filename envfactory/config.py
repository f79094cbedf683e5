"""Settings (pydantic-settings): every value can be set with an `ENVFACTORY_*` environment variable."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _project_root() -> Path:
    """The folder holding `envs/`: the working directory if it has one, else the source checkout."""
    cwd = Path.cwd()
    if (cwd / "envs").is_dir():
        return cwd
    return Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENVFACTORY_", extra="ignore")

    root: Path = Field(default_factory=_project_root, description="project folder (holds envs/ and configs/)")
    envs_dir: Path | None = Field(default=None, description="environment pool folder; default <root>/envs")
    registry_path: Path | None = Field(
        default=None, description="registry of verified environments; default <root>/configs/mcp_server.json"
    )
    bfcl: bool = Field(default=True, description="include BFCL's multi-turn environments when bfcl-eval is installed")
    http_host: str = "127.0.0.1"
    http_port: int = 8765

    @property
    def envs_path(self) -> Path:
        return self.envs_dir or self.root / "envs"

    @property
    def registry_file(self) -> Path:
        return self.registry_path or self.root / "configs" / "mcp_server.json"


def get_settings() -> Settings:
    return Settings()
