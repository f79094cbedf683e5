"""What the corpus records: one entry per spec with its provenance, and the manifest of a whole package."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

from envfactory.env.metadata import Domain
from envfactory.errors import DataError

# a spec's id is its path under the package's api/ folder without the suffix: `googleapis.com/tasks`,
# `amadeus.com/amadeus-airport-&-city-search`; no component starts with a dot (no `..`, no hidden file) or
# a space, or ends with a space, and none holds a control character, a backslash or a quote: an id is
# also a safe relative path
_PART = r"[A-Za-z0-9_~+&(),-](?:[A-Za-z0-9._~+&(), -]{0,126}[A-Za-z0-9._~+&(),-])?"
SPEC_ID = re.compile(rf"{_PART}(?:/{_PART}){{0,7}}")


class CorpusError(DataError):
    """The corpus cannot be fetched, read or searched (no npm, an integrity mismatch, an unsafe tarball...)."""


class Operation(BaseModel):
    """One operation of a spec, as the index and `corpus show` see it."""

    method: str
    path: str
    summary: str = ""
    operation_id: str | None = None


class SpecEntry(BaseModel):
    """One spec of the corpus and where it came from. Text fields are the spec's own, untrusted."""

    id: str = Field(description="path under the package's api/ folder, without the suffix")
    provider: str = Field(description="info.x-providerName, else the id's first part")
    service: str | None = Field(default=None, description="info.x-serviceName, else the id's second part")
    title: str
    description: str = Field(default="", description="the start of info.description")
    version: str = Field(description="info.version: the API's version")
    spec_format: Literal["openapi", "swagger"]
    spec_version: str = Field(description="the `openapi` (3.x) or `swagger` (2.0) field")
    licence: str | None = Field(default=None, description="info.license.name as the spec states it")
    licence_url: str | None = None
    licence_id: str | None = Field(default=None, description="the licence recognised (SPDX-like), if it is")
    origin_url: str | None = Field(default=None, description="info.x-origin: where APIs.guru took the spec from")
    origin_format: str | None = Field(default=None, description="the origin's format: swagger, openapi, google...")
    origin_version: str | None = None
    categories: list[str] = Field(default_factory=list, description="info.x-apisguru-categories")
    domain: Domain = Field(description="the project's domain, from the categories (envfactory.corpus.domains)")
    sha256: str = Field(description="of the spec's bytes as the package holds them")
    bytes: int
    operations: int = Field(description="HTTP operations under `paths`")
    crud_resources: int = Field(
        default=0, description="collection paths with a POST whose item path has a GET and a PUT, PATCH or DELETE"
    )
    file: str = Field(description="the spec's file, relative to the extracted folder")


class Skipped(BaseModel):
    """A member of the package that was not taken, and why."""

    member: str
    reason: str


class Manifest(BaseModel):
    """Every spec of one package version, with what was skipped."""

    package: str
    version: str
    integrity: str
    specs: list[SpecEntry]
    skipped: list[Skipped] = Field(default_factory=list)

    @property
    def operations(self) -> int:
        return sum(s.operations for s in self.specs)
