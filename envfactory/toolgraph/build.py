"""Build the tool graph: parameters → embeddings → similarity pairs → user_provided → edges → LLM refinement.

1. every tool's input and output parameters (`params`);
2. the name/type half of every output → input score (`similarity.SimilarityPlan`): which pairs a
   cosine could still lift over the threshold, and so which texts need an embedding at all;
3. each of those distinct parameter texts embedded once (through the caller's embedder, normally the
   `EmbeddingCache` over an ONNX `Embedder`), in batches so a progress bar can follow, then the pairs
   above the threshold scored in one vectorized pass (`SimilarityPlan.pairs`);
4. `user_provided` for every input: the heuristic, grounded (`classify`, `grounding`), then the LLM
   per environment when a model is given (`llm_classify`), which wins wherever it answers;
5. edges: every pair inside an environment; a pair across environments only per
   `cross_env_edges` ("external": into user-provided inputs only, since an id lives in its own
   environment's state while a city or a date can travel), at most `cross_env_top_k` per input;
   then, with `schema_edges` (the default), the pairs the tools' schemas imply inside each
   environment (`schema_edges`: ids and their records, lists and their items, same names, values a
   description names, values of one kind), marked `found_by="schema"`;
6. with a model, the logical refinement of each environment (`refine`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from langchain_core.language_models import BaseChatModel
from pydantic import BaseModel, Field

from envfactory.config import Settings
from envfactory.llm.embeddings import TextEmbedder
from envfactory.llm.prompts import PromptLibrary
from envfactory.llm.usage import UsageTracker
from envfactory.toolgraph.classify import Verdict, classify
from envfactory.toolgraph.errors import ToolGraphError
from envfactory.toolgraph.graph import ToolGraph
from envfactory.toolgraph.grounding import ground_verdicts
from envfactory.toolgraph.llm_classify import ClassifyReport, classify_env
from envfactory.toolgraph.params import ParamSpec, ToolSource, input_params, output_params
from envfactory.toolgraph.refine import RefineReport, refine_env

if TYPE_CHECKING:
    from envfactory.env.pool import EnvPool
from envfactory.config import ToolGraphSettings
from envfactory.toolgraph.schema_edges import add_schema_edges, schema_pairs
from envfactory.toolgraph.similarity import Pairs, SimilarityPlan, codes

ProgressFn = Callable[[int, int], None]
# A build's progress: (phase, done, total) — embedding, then the LLM's classification and refinement per environment.
PhaseFn = Callable[[str, int, int], None]
EMBED_PHASE = "embedding parameter texts"
CLASSIFY_PHASE = "LLM: which inputs the user gives"
REFINE_PHASE = "LLM: refining dependencies"


class BuildTimings(BaseModel):
    extract_s: float = 0.0
    embed_s: float = 0.0
    similarity_s: float = 0.0
    classify_s: float = 0.0
    graph_s: float = 0.0
    schema_s: float = 0.0
    refine_s: float = 0.0
    total_s: float = 0.0
    # CPU seconds of the process (all its threads): what a busy machine's wall clock hides
    embed_cpu_s: float = 0.0
    cpu_s: float = 0.0


class BuildReport(BaseModel):
    """What one build did, and how long each step took."""

    embedding_model: str
    llm: bool
    envs: int
    tools: int
    inputs: int
    outputs: int
    texts: int  # distinct parameter texts
    texts_needed: int = 0  # of them, texts of parameters some pair could relate: the only ones embedded
    embedded: int | None = None  # texts the model actually ran on (cache misses), when the embedder counts
    key_pairs_scored: int = 0  # cells of the key-level similarity matrix
    candidate_pairs: int = 0  # output → input pairs above the threshold
    same_env_pairs: int = 0
    cross_env_pairs_kept: int = 0
    relations: int = 0  # Parameter_Relate pairs from the similarity (before refinement)
    schema_relations: int = 0  # Parameter_Relate pairs the schema rules added (beside the similarity's)
    schema_depend: int = 0  # Tool_Depend edges only the schema rules found
    timings: BuildTimings = Field(default_factory=BuildTimings)
    classification: list[ClassifyReport] = Field(default_factory=list)
    refinement: list[RefineReport] = Field(default_factory=list)


def embed_texts(
    embedder: TextEmbedder, texts: Sequence[str], batch: int, progress: ProgressFn | None = None
) -> np.ndarray:
    """Unit embeddings of `texts` (rows in order), `batch` texts per call; `progress(done, total)` after each.

    Texts go to the model shortest first, so each batch pads to a similar length (on CPU, padding is
    most of the cost of a mixed batch)."""
    if not texts:
        return np.zeros((0, 1), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda k: (len(texts[k]), k))
    parts: list[np.ndarray] = []
    for start in range(0, len(order), batch):
        chunk = [texts[k] for k in order[start : start + batch]]
        parts.append(np.asarray(embedder.embed(chunk), dtype=np.float32))
        if progress is not None:
            progress(min(start + batch, len(texts)), len(texts))
    emb = np.empty((len(texts), parts[0].shape[1]), dtype=np.float32)
    emb[np.asarray(order)] = np.concatenate(parts)
    norms = np.linalg.norm(emb, axis=1, keepdims=True)
    # embedders normally return unit rows already; a zero row (empty text) stays zero
    return np.divide(emb, norms, out=np.zeros_like(emb), where=norms > 0)


def _top_k_per_input(pairs: Pairs, rows: np.ndarray, k: int) -> np.ndarray:
    """Of the pair indices `rows`, the k best-scoring per input parameter."""
    if k <= 0 or len(rows) == 0:
        return rows[:0]
    order = np.lexsort((-pairs.score[rows], pairs.in_idx[rows]))
    rows = rows[order]
    group = pairs.in_idx[rows]
    starts = np.concatenate([[0], np.nonzero(np.diff(group))[0] + 1])
    lengths = np.diff(np.concatenate([starts, [len(rows)]]))
    rank = np.arange(len(rows)) - np.repeat(starts, lengths)
    return rows[rank < k]


def _best_producer(
    pairs: Pairs, rows: np.ndarray, inputs: Sequence[ParamSpec], outputs: Sequence[ParamSpec]
) -> np.ndarray:
    """Per input, the best score of a same-environment output that could actually produce it: a producer
    that itself requires an input of the same name does not count (`view_cart(customer_id)` returns
    `customer_id`, but cannot be what first gives it). -inf where there is none."""
    tool_out, tool_in = codes([p.tool for p in outputs], [p.tool for p in inputs])
    (name_in,) = codes([p.name for p in inputs])
    # (tool, input name) of every required input, as one integer per pair
    width = int(name_in.max()) + 1 if len(name_in) else 1
    required = np.fromiter((p.required for p in inputs), dtype=bool, count=len(inputs))
    required_keys = np.unique(tool_in[required] * width + name_in[required])
    circular = np.isin(tool_out[pairs.out_idx[rows]] * width + name_in[pairs.in_idx[rows]], required_keys)
    rows = rows[~circular]
    best = np.full(len(inputs), -np.inf, dtype=np.float32)
    np.maximum.at(best, pairs.in_idx[rows], pairs.score[rows])
    return best


def build_tool_graph(
    sources: Sequence[ToolSource],
    embedder: TextEmbedder,
    settings: ToolGraphSettings | None = None,
    *,
    model: BaseChatModel | None = None,
    library: PromptLibrary | None = None,
    retries: int = 2,
    progress: PhaseFn | None = None,
    usage: UsageTracker | None = None,
) -> tuple[ToolGraph, BuildReport]:
    """The graph over `sources`. With `model` (and `library`), classification and refinement use the LLM (one
    structured call per environment each: with a slow model, most of the build). `progress(phase, done, total)`."""
    report_phase: PhaseFn = progress or (lambda phase, done, total: None)
    settings = settings or ToolGraphSettings()
    if model is not None and library is None:
        raise ToolGraphError("an LLM needs the prompt library (prompts/toolgraph/*.yaml) to classify and refine")
    t_start, cpu_start = time.perf_counter(), time.process_time()
    timings = BuildTimings()

    # 1. parameters
    seen: set[str] = set()
    for s in sources:
        if s.tool_id in seen:
            raise ToolGraphError(f"tool '{s.tool_id}' is given twice")
        seen.add(s.tool_id)
    inputs = [p for s in sources for p in input_params(s)]
    outputs = [p for s in sources for p in output_params(s)]
    timings.extract_s = time.perf_counter() - t_start

    # 2. what could pair, before any embedding
    t = time.perf_counter()
    plan = SimilarityPlan(outputs, inputs, settings)
    texts, needed = plan.texts, np.nonzero(plan.needed)[0]
    timings.similarity_s = time.perf_counter() - t

    # 3. embeddings of the texts that could pair, then the pairs
    t, cpu = time.perf_counter(), time.process_time()
    misses_before = getattr(embedder, "misses", None)
    will_embed = getattr(embedder, "will_embed", None)
    if will_embed is not None:  # lets the embedder pick its runtime for the amount (see `Embedder`)
        will_embed([texts[k] for k in needed])
    vectors = embed_texts(
        embedder,
        [texts[k] for k in needed],
        settings.embed_batch,
        lambda done, total: report_phase(EMBED_PHASE, done, total),
    )
    misses_after = getattr(embedder, "misses", None)
    emb = np.zeros((len(texts), vectors.shape[1]), dtype=np.float32)  # rows of texts no pair reads stay zero
    emb[needed] = vectors
    timings.embed_s, timings.embed_cpu_s = time.perf_counter() - t, time.process_time() - cpu

    t = time.perf_counter()
    pairs = plan.pairs(emb)
    env_out, env_in = codes([p.env for p in outputs], [p.env for p in inputs])
    same_env = env_out[pairs.out_idx] == env_in[pairs.in_idx] if len(pairs) else np.zeros(0, dtype=bool)
    timings.similarity_s += time.perf_counter() - t

    # 4. user_provided: an input some output of its environment produces — by similarity, or by a schema rule
    # (an id a similarity threshold set high misses: every `*_id` was "user-provided" at 1.0) — is internal
    t = time.perf_counter()
    same_rows = np.nonzero(same_env)[0]
    best = _best_producer(pairs, same_rows, inputs, outputs)
    schema = (
        schema_pairs(
            outputs,
            inputs,
            {s.tool_id: s.spec.name for s in sources},
            {s.tool_id: s.spec.description for s in sources},
        )
        if settings.schema_edges
        else []
    )
    by_schema = {inputs[pair.in_idx].node_id for pair in schema}
    verdicts: dict[str, Verdict] = {
        p.node_id: classify(
            p,
            float(best[j]) if np.isfinite(best[j]) else None,
            settings.lean_internal_threshold,
            schema_produced=p.node_id in by_schema,
        )
        for j, p in enumerate(inputs)
    }
    produced_out = np.concatenate([pairs.out_idx[same_rows], np.array([q.out_idx for q in schema], dtype=np.int64)])
    produced_in = np.concatenate([pairs.in_idx[same_rows], np.array([q.in_idx for q in schema], dtype=np.int64)])
    verdicts = ground_verdicts(verdicts, inputs, outputs, produced_out, produced_in)
    reports: list[ClassifyReport] = []
    if model is not None and library is not None:
        produced_by: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for r in same_rows[np.argsort(-pairs.score[same_rows], kind="stable")]:
            o = outputs[pairs.out_idx[r]]
            produced_by[inputs[pairs.in_idx[r]].node_id].append((float(pairs.score[r]), f"{o.tool}.{o.name}"))
        by_env: dict[str, list[ParamSpec]] = defaultdict(list)
        for p in inputs:
            by_env[p.env].append(p)
        descriptions = {s.env: s.env_description for s in sources}
        report_phase(CLASSIFY_PHASE, 0, len(by_env))
        for done, env in enumerate(sorted(by_env), 1):
            found, env_report = classify_env(
                env,
                descriptions.get(env, ""),
                by_env[env],
                verdicts,
                {k: [name for _, name in v] for k, v in produced_by.items()},
                model=model,
                library=library,
                retries=retries,
                role=settings.llm_role,
                usage=usage,
            )
            verdicts.update(found)
            reports.append(env_report)
            report_phase(CLASSIFY_PHASE, done, len(by_env))
    timings.classify_s = time.perf_counter() - t

    # 5. graph
    t = time.perf_counter()
    cross_rows = np.nonzero(~same_env)[0]
    if settings.cross_env_edges == "none":
        cross_rows = cross_rows[:0]
    elif settings.cross_env_edges == "external":
        external = np.array([verdicts[p.node_id].user_provided for p in inputs], dtype=bool)
        cross_rows = cross_rows[external[pairs.in_idx[cross_rows]]]
    cross_rows = _top_k_per_input(pairs, cross_rows, settings.cross_env_top_k)
    keep = np.sort(np.concatenate([same_rows, cross_rows]))

    graph = ToolGraph(settings=settings)
    graph.g.graph["embedding_model"] = embedder.model_name
    for s in sources:
        graph.add_tool(s)
    for p in outputs:
        graph.add_param(p)
    for p in inputs:
        v = verdicts[p.node_id]
        pid = graph.add_param(p)
        graph.g.nodes[pid].update(
            user_provided=v.user_provided, user_provided_source=v.source, user_provided_reason=v.reason
        )
    for r in keep:
        graph.relate(
            outputs[pairs.out_idx[r]].node_id,
            inputs[pairs.in_idx[r]].node_id,
            score=round(float(pairs.score[r]), 4),
            name_type=round(float(pairs.name_type[r]), 4),
            desc=round(float(pairs.desc[r]), 4),
        )
    timings.graph_s = time.perf_counter() - t

    # 5b. schema edges
    t = time.perf_counter()
    schema_relations = add_schema_edges(graph, (outputs, inputs), schema) if settings.schema_edges else 0
    schema_depend = sum(d["found_by"] == "schema" for _, _, d in graph.depend_edges())
    timings.schema_s = time.perf_counter() - t

    # 6. refinement
    t = time.perf_counter()
    refinements: list[RefineReport] = []
    if model is not None and library is not None:
        descriptions = {s.env: s.env_description for s in sources}
        envs = graph.envs()
        report_phase(REFINE_PHASE, 0, len(envs))
        for done, env in enumerate(envs, 1):
            refinements.append(
                refine_env(
                    graph,
                    env,
                    descriptions.get(env, ""),
                    model=model,
                    library=library,
                    retries=retries,
                    role=settings.llm_role,
                    usage=usage,
                )
            )
            report_phase(REFINE_PHASE, done, len(envs))
    timings.refine_s = time.perf_counter() - t
    timings.total_s, timings.cpu_s = time.perf_counter() - t_start, time.process_time() - cpu_start

    report = BuildReport(
        embedding_model=embedder.model_name,
        llm=model is not None,
        envs=len({s.env for s in sources}),
        tools=len(sources),
        inputs=len(inputs),
        outputs=len(outputs),
        texts=len(texts),
        texts_needed=len(needed),
        embedded=(misses_after - misses_before)
        if isinstance(misses_before, int) and isinstance(misses_after, int)
        else None,
        key_pairs_scored=pairs.key_pairs_scored,
        candidate_pairs=len(pairs),
        same_env_pairs=len(same_rows),
        cross_env_pairs_kept=len(cross_rows),
        relations=len(keep),
        schema_relations=schema_relations,
        schema_depend=schema_depend,
        timings=timings,
        classification=reports,
        refinement=refinements,
    )
    graph.g.graph["build"] = report.model_dump(mode="json", exclude={"classification", "refinement"})
    return graph, report


def build_pool_graph(
    settings: Settings,
    envs: Sequence[str] | None = None,
    *,
    no_llm: bool = False,
    threshold: float | None = None,
    progress: PhaseFn | None = None,
    pool: EnvPool | None = None,
) -> tuple[ToolGraph, BuildReport]:
    """The graph of the pool's tools (or of `envs`), embedded through the data dir's cache; the LLM
    classifies and refines when one is configured (and `no_llm` is not set). `pool`: the caller's, else one over
    `settings`."""
    from envfactory.env.pool import EnvPool
    from envfactory.llm.embeddings import Embedder, EmbeddingCache
    from envfactory.llm.models import chat_model
    from envfactory.llm.prompts import library_from_settings
    from envfactory.llm.usage import process_usage
    from envfactory.toolgraph.collect import pool_sources
    from envfactory.toolgraph.settings import cache_path, onnx_path

    tg = settings.toolgraph
    if threshold is not None:
        tg = tg.model_copy(update={"build_edge_threshold": threshold})
    sources = pool_sources(pool if pool is not None else EnvPool(settings), list(envs) if envs else None)
    if not sources:
        raise ToolGraphError("no tools to build a graph from (is the pool empty?)")
    use_llm = tg.use_llm and not no_llm and settings.llm_for(tg.llm_role).provider != "none"
    usage = process_usage()  # the build's calls and structured asks, counted under its role like the agents'
    model = chat_model(tg.llm_role, settings, usage=usage) if use_llm else None
    library = library_from_settings(settings) if use_llm else None
    base = Embedder(
        settings.embedding_model, batch_size=128, backend=tg.embed_backend, cache_dir=onnx_path(settings),
        threads=tg.embed_threads, quiet_fallback="embed_backend" not in tg.model_fields_set,
        export_min_texts=tg.onnx_export_min_texts,
    )  # fmt: skip
    embedder = EmbeddingCache(cache_path(settings), base)
    try:
        return build_tool_graph(
            sources, embedder, tg, model=model, library=library, retries=settings.structured_retries,
            progress=progress, usage=usage,
        )  # fmt: skip
    finally:
        embedder.close()  # its write-ahead log folded into the file, not left to the collector
