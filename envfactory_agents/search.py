"""Search Agent: find a coverage gap in the pool, propose a new scenario that is not a near-duplicate,
gather authentic sources (the web or the local docs folder, and the API corpus when it is fetched and
indexed), and write the environment's metadata.

A user can skip the search: start from their own metadata file, an OpenAPI document, or a spec of the
API corpus (`envfactory corpus`), read the same way as an OpenAPI document.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envfactory.config import Settings
from envfactory.env.metadata import Domain, EnvMetadata, ToolKind, load_metadata
from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.llm.structured import expect_model
from envfactory_agents.common import AgentDeps


class ToolIdea(BaseModel):
    name: str
    kind: ToolKind
    purpose: str


class Proposal(BaseModel):
    """A proposed environment, before it is grounded in sources."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    domain: Domain
    description: str
    entities: list[str] = Field(default_factory=list)
    tools: list[ToolIdea] = Field(min_length=1)

    def text(self) -> str:
        return f"{self.description} Tools: " + "; ".join(f"{t.name}: {t.purpose}" for t in self.tools)


class NoveltyCheck(BaseModel):
    name: str
    nearest: str | None
    similarity: float
    threshold: float
    duplicate: bool


class SearchReport(BaseModel):
    """What the Search Agent did and why: visible in the graph state and in Studio."""

    mode: Literal["search", "metadata", "openapi", "corpus"]
    domain: str | None = None
    gaps: list[dict[str, Any]] = Field(default_factory=list)
    novelty: list[NoveltyCheck] = Field(default_factory=list)
    sources: list[str] = Field(default_factory=list)
    proposal: Proposal | None = None


class SearchOutcome(BaseModel):
    ok: bool
    metadata: EnvMetadata | None = None
    report: SearchReport
    error: str | None = None


class EnvGenRequest(BaseModel):
    """How to start: from the pool's gaps (search), a metadata file, an OpenAPI document, or a corpus spec. A key it
    does not know is refused (a Studio input's `metadata_path_` was a search, and called the model)."""

    model_config = ConfigDict(extra="forbid")

    metadata_path: str | None = None
    openapi_path: str | None = None
    corpus_id: str | None = Field(default=None, description="a spec of the API corpus (`envfactory corpus list`)")
    domain: Domain | None = None
    name: str | None = None
    hint: str = ""

    @property
    def mode(self) -> Literal["search", "metadata", "openapi", "corpus"]:
        if self.metadata_path:
            return "metadata"
        if self.openapi_path:
            return "openapi"
        return "corpus" if self.corpus_id else "search"


def _from_corpus(request: EnvGenRequest, settings: Settings) -> SearchOutcome:
    """A corpus spec, read as an OpenAPI document is; its domain is the corpus's unless the request names one."""
    from envfactory.corpus import Corpus
    from envfactory.corpus.specs import env_name_of
    from envfactory.envgen.openapi import openapi_to_metadata

    assert request.corpus_id is not None
    corpus = Corpus(settings)
    entry = corpus.entry(request.corpus_id)
    meta = openapi_to_metadata(
        corpus.document(entry.id), name=request.name or env_name_of(entry), domain=request.domain or entry.domain
    ).model_copy(update={"source": f"corpus:{entry.id}"})
    provenance = [
        f"corpus:{entry.id} ({corpus.cs.label}, sha256 {entry.sha256[:16]})",
        f"licence: {entry.licence or 'none stated'}" + (f" ({entry.licence_url})" if entry.licence_url else ""),
    ]
    if entry.origin_url:
        provenance.append(entry.origin_url)
    return SearchOutcome(
        ok=True, metadata=meta, report=SearchReport(mode="corpus", domain=meta.domain, sources=provenance)
    )


def _from_user(request: EnvGenRequest, settings: Settings) -> SearchOutcome:
    if request.metadata_path:
        meta = load_metadata(request.metadata_path)
        return SearchOutcome(ok=True, metadata=meta, report=SearchReport(mode="metadata", domain=meta.domain))
    if request.mode == "corpus":
        return _from_corpus(request, settings)
    from envfactory.envgen.openapi import openapi_to_metadata

    assert request.openapi_path is not None
    meta = openapi_to_metadata(Path(request.openapi_path), name=request.name, domain=request.domain or "utilities")
    return SearchOutcome(ok=True, metadata=meta, report=SearchReport(mode="openapi", domain=meta.domain))


def search_environment(deps: AgentDeps, request: EnvGenRequest, attempts: int = 3) -> SearchOutcome:
    if request.mode != "search":
        return _from_user(request, deps.settings)
    from envfactory.corpus.index import corpus_sources
    from envfactory.envgen.coverage import PoolIndex
    from envfactory.envgen.sources import search_sources
    from envfactory.llm.embeddings import Embedder

    settings = deps.settings
    pool = EnvPool(settings)
    embedder = Embedder(settings.embedding_model)
    index = PoolIndex(pool, embedder, settings.data_path / "chroma")
    gaps = index.domain_gaps()  # least covered first
    domain = request.domain or gaps[0].domain
    report = SearchReport(mode="search", domain=domain, gaps=[g.model_dump() for g in gaps])
    existing = next((g.envs for g in gaps if g.domain == domain), [])

    rejected: list[str] = []
    proposal: Proposal | None = None
    for _ in range(attempts):
        messages = deps.prompts.get("search/propose").render(
            domain=domain,
            gaps="\n".join(f"- {g.domain}: {g.env_count} environments, {g.tool_count} tools" for g in gaps),
            existing=", ".join(existing) or "none",
            hint=request.hint or "none",
            rejected="\n".join(rejected) or "none",
        )
        answer = deps.ask("search", messages, expect_model(Proposal))
        if not answer.ok or answer.value is None:
            return SearchOutcome(ok=False, report=report, error=f"search/propose: {answer.error}")
        candidate = answer.value
        # the description alone: a tool list appended to it dilutes the embedding below the threshold
        verdict = index.novelty(candidate.description, settings.similarity_threshold)
        check = NoveltyCheck(
            name=candidate.name,
            nearest=verdict.nearest.env if verdict.nearest else None,
            similarity=round(verdict.similarity, 4),
            threshold=settings.similarity_threshold,
            duplicate=verdict.is_duplicate or candidate.name in pool.names(),
        )
        report.novelty.append(check)
        if not check.duplicate:
            proposal = candidate
            break
        rejected.append(f"- {candidate.name}: {check.similarity:.2f} similar to {check.nearest}")
    if proposal is None:
        return SearchOutcome(ok=False, report=report, error=f"every proposal was a near-duplicate: {rejected}")
    report.proposal = proposal

    try:
        docs = search_sources(proposal.text(), settings, k=4, embedder=embedder)
    except EnvFactoryError as e:  # no source configured or reachable: ground on the proposal alone
        docs = []
        report.sources.append(f"(no sources: {e})")
    try:  # the API corpus's nearest specs in the proposal's domain, when it is fetched and indexed
        docs += corpus_sources(settings, embedder, proposal.text(), k=2, domain=proposal.domain)
    except EnvFactoryError as e:
        report.sources.append(f"(no corpus sources: {e})")
    report.sources.extend(d.location for d in docs)
    sources_text = "\n\n".join(f"## {d.title} ({d.location})\n{d.text[:3000]}" for d in docs) or "none found"
    messages = deps.prompts.get("search/metadata").render(
        proposal=proposal.model_dump_json(indent=2), sources=sources_text
    )
    answer_meta = deps.ask("search", messages, expect_model(EnvMetadata))
    if not answer_meta.ok or answer_meta.value is None:
        return SearchOutcome(ok=False, report=report, error=f"search/metadata: {answer_meta.error}")
    meta = answer_meta.value.model_copy(update={"name": proposal.name, "domain": proposal.domain, "source": "envgen"})
    return SearchOutcome(ok=True, metadata=meta, report=report)
