"""`envfactory envgen run|resume|history` (registered with the CLI through an entry point).

The CLI lives beside the graphs because `envfactory/` must not import LangGraph; `envfactory.cli`
loads this sub-app only when its name is on the command line.
"""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from envfactory.config import Role, Settings, get_settings
from envfactory.env.metadata import DOMAINS, load_metadata
from envfactory.errors import EnvFactoryError
from envfactory.executor import WorkerLost, executor_from
from envfactory.inputs import write_atomic
from envfactory.llm.models import check_configured
from envfactory.run_settings import RunSettingsError, file_sha256
from envfactory.terminal import SafeConsole, Table, safe
from envfactory_agents.common import process_usage
from envfactory_agents.search import EnvGenRequest
from graphs.checkpoint import open_checkpointer
from graphs.envgen import EnvGenContext, build
from graphs.envgen.batch import EnvGenRunner, Job, run_one
from graphs.envgen.state import EnvGenState

app = typer.Typer(no_args_is_help=True, help="EnvGen: synthesize and verify new environments (LangGraph).")
out = SafeConsole()  # what a run recorded (names, a model's failure text, checkpoints) is printed through `safe`
NODES = ("search", "code", "test", "revise", "register", "reject")


def _context(prompt: list[str], budget: int | None, threshold: float | None, draft: bool = True) -> EnvGenContext:
    overrides: dict[str, str] = {}
    for item in prompt:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise EnvFactoryError(f"--prompt takes NAME=FILE (e.g. code/generate=my_prompt.yaml), got '{item}'")
        if not value.lower().endswith((".yaml", ".yml")):  # (a text that is not a file name is a system message)
            raise EnvFactoryError(f"--prompt {item}: a prompt file is YAML (.yaml or .yml), as prompts/ holds them")
        overrides[name] = str(Path(value).expanduser().resolve())  # a resume from another folder reads this file
    return EnvGenContext(prompt_overrides=overrides, revision_budget=budget, pass_threshold=threshold, draft=draft)


# the options a thread keeps (`EnvGenContext` fields), with the flag that sets each
_KEPT = {
    "prompt_overrides": "--prompt",
    "revision_budget": "--budget",
    "pass_threshold": "--threshold",
    "draft": "--draft",
}


def _options(ctx: EnvGenContext) -> dict[str, Any]:
    """The options a thread keeps (what `_context` made of the flags), and a sha256 of each prompt file it was
    started with (`prompt_sha256`): a resume can say that a file changed since."""
    kept: dict[str, Any] = {key: copy.copy(getattr(ctx, key)) for key in _KEPT}
    kept["prompt_sha256"] = {name: _sha256(path) for name, path in ctx.prompt_overrides.items()}
    return kept


def _sha256(path: str) -> str | None:
    try:
        return file_sha256([Path(path)])
    except RunSettingsError:  # gone or unreadable: the prompt library says so when it loads it
        return None


def _resumed_context(
    thread: str, kept: Any, prompt: list[str], budget: int | None, threshold: float | None, draft: bool | None
) -> EnvGenContext:
    """The context a resume goes on with: the options the thread was started with, each flag given now in their
    place, and every option that so changes said (a resume forgot `--budget 1` and ran to the default 3)."""
    given = _context(prompt, budget, threshold, True if draft is None else draft)
    if not isinstance(kept, dict):  # a thread from before options were kept: the flags alone, as before
        return given
    ctx = EnvGenContext(
        prompt_overrides={**(kept.get("prompt_overrides") or {}), **given.prompt_overrides},
        revision_budget=budget if budget is not None else kept.get("revision_budget"),
        pass_threshold=threshold if threshold is not None else kept.get("pass_threshold"),
        draft=bool(kept.get("draft", True)) if draft is None else draft,
    )
    for key, flag in _KEPT.items():
        before, now = kept.get(key), getattr(ctx, key)
        if before != now and (before or now is not None):
            out.print(
                f"thread {safe(thread)} was started with {flag} {safe(before)}; resuming with {safe(now)}",
                highlight=False,
            )
    hashes = kept.get("prompt_sha256")
    for name, path in ctx.prompt_overrides.items():
        if name in given.prompt_overrides or not isinstance(hashes, dict) or name not in hashes:
            continue  # given now (said above), or kept by a thread from before the files were fingerprinted
        if _sha256(path) != hashes[name]:
            out.print(
                f"thread {safe(thread)} was started with --prompt {safe(name)}={safe(path)}, which has changed "
                "since: resuming with its text as it is now",
                highlight=False,
            )
    return ctx


def _preflight(requests: list[EnvGenRequest], ctx: EnvGenContext, settings: Settings) -> None:
    """Everything the user handed us, read and checked before a thread starts: a bad metadata or OpenAPI file,
    a prompt override that is missing or does not render, or no model for a role the runs need is one line
    (exit 1) here, not a "failed" row per attempt after a new thread was opened for it."""
    from envfactory.envgen.openapi import openapi_to_metadata
    from envfactory.llm.prompts import library_from_settings

    for r in requests:
        if r.metadata_path:
            load_metadata(r.metadata_path)
        elif r.openapi_path:
            openapi_to_metadata(Path(r.openapi_path), name=r.name, domain=r.domain or "utilities")
    library_from_settings(settings, overrides=ctx.prompt_overrides or None)
    roles: list[Role] = ["code", "test"]
    if any(r.mode == "search" for r in requests):
        roles.append("search")
    check_configured(roles, settings)


def _keep_failed(rows: list[dict[str, Any]], settings: Settings, saver: Any) -> None:
    """A failed run's last code and reports, written where the user can read them (they lived only in the
    checkpoint: a node that raised leaves its row with the error alone); the row's output names the folder."""
    graph = build(saver)
    for original in rows:
        if original.get("status") != "failed" or original.get("output"):
            continue
        saved = graph.get_state({"configurable": {"thread_id": original["thread"]}}).values or {}
        r = {**saved, **original}  # the row's status and failure are the run's last word
        if not (r.get("code") or r.get("report")):
            continue
        folder = settings.data_path / "envgen" / "failed" / str(r["thread"])
        folder.mkdir(parents=True, exist_ok=True)
        if r.get("code"):
            write_atomic(folder / "env.py", str(r["code"]))
        record = {k: r.get(k) for k in ("request", "metadata", "failure", "revision", "report", "reports")}
        write_atomic(folder / "report.json", json.dumps(record, indent=2, default=str) + "\n")
        original["output"] = str(folder)


def _check_nodes(names: list[str]) -> list[str]:
    bad = [n for n in names if n not in NODES]
    if bad:
        raise EnvFactoryError(f"--interrupt-before: unknown node '{bad[0]}'; nodes: {', '.join(NODES)}")
    return names


def _summary(rows: list[dict[str, Any]]) -> None:
    table = Table("thread", "environment", "status", "revisions", "tests passed", "output / failure")
    for r in rows:
        meta = r.get("metadata") or {}
        report = r.get("report") or {}
        passed = f"{report.get('scenarios_passed', 0)}/{report.get('scenarios_run', 0)}" if report else ""
        table.add_row(
            safe(r["thread"]),
            safe(meta.get("name", "")),
            safe(r.get("status", "")),
            safe(r.get("revision", 0)),
            safe(passed),
            safe(r.get("output") or r.get("failure") or ""),
        )
    out.print(table)
    usage = process_usage()
    if usage.report():
        out.print(usage.table())
    for r in rows:
        if str(r.get("status", "")).startswith("interrupted"):
            out.print(f"resume with: envfactory envgen resume {safe(r['thread'])}", highlight=False)


@app.command("run")
def run(
    metadata: Annotated[list[Path] | None, typer.Option(help="start from metadata file(s); repeatable")] = None,
    openapi: Annotated[list[Path] | None, typer.Option(help="start from OpenAPI document(s); repeatable")] = None,
    corpus: Annotated[
        list[str] | None, typer.Option(help="start from API corpus spec(s) by id (envfactory corpus list); repeatable")
    ] = None,
    n: Annotated[int, typer.Option(min=1, help="with neither: search the pool's gaps for N new environments")] = 1,
    domain: Annotated[str | None, typer.Option(help="domain to search (default: the least covered)")] = None,
    hint: Annotated[str, typer.Option(help="an idea for the Search Agent")] = "",
    concurrency: Annotated[int, typer.Option(min=1, help="environments generated at once")] = 2,
    executor: Annotated[str, typer.Option(help="local (threads here) or ray (workers on a Ray cluster)")] = "local",
    ray_address: Annotated[
        str | None, typer.Option(help="ray: 'auto', 'host:port' or 'ray://host:port'; default: a new local instance")
    ] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="ray: worker processes (default: its CPUs)")] = None,
    interrupt_before: Annotated[list[str] | None, typer.Option(help="stop before this node; repeatable")] = None,
    thread_id: Annotated[str | None, typer.Option(help="thread id (one environment only)")] = None,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart",
            help="with --thread-id naming an EnvGen thread that exists: discard its checkpoints and start "
            "it over from this input (else such a thread is refused: `envgen resume` continues it)",
        ),
    ] = False,
    prompt: Annotated[list[str] | None, typer.Option(help="override a prompt: NAME=FILE; repeatable")] = None,
    budget: Annotated[int | None, typer.Option(min=0, help="revision budget (default from settings)")] = None,
    threshold: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="pass threshold, 0-1 (default from settings)"),
    ] = None,
    draft: Annotated[
        bool,
        typer.Option(
            "--draft/--no-draft",
            help="a spec that compiles (--openapi, --corpus): revise its compiled plan, as data (default); "
            "--no-draft: write env.py from its metadata",
        ),
    ] = True,
) -> None:
    """Generate environments: search (or metadata/OpenAPI/a corpus spec) → code → test ⇄ revise → register | reject."""
    if domain is not None and domain not in DOMAINS:
        raise EnvFactoryError(f"--domain must be one of {', '.join(DOMAINS)}, not '{domain}'")
    searching_options = [o for o, v in (("--hint", hint), ("--n", n != 1)) if v]
    if (metadata or openapi or corpus) and searching_options:
        raise EnvFactoryError(
            f"{', '.join(searching_options)} steer the search, which --metadata, --openapi and --corpus skip"
        )
    if metadata and domain is not None:
        raise EnvFactoryError("--domain steers the search (and a spec's domain); a metadata file names its own domain")
    requests: list[EnvGenRequest] = [EnvGenRequest(metadata_path=str(p)) for p in metadata or []]
    requests += [EnvGenRequest(openapi_path=str(p), domain=domain) for p in openapi or []]
    if corpus:
        from envfactory.corpus import Corpus

        known = Corpus(get_settings())
        requests += [EnvGenRequest(corpus_id=known.entry(c).id, domain=domain) for c in corpus]  # unknown ids: one line
    if not requests:
        requests = [EnvGenRequest(domain=domain, hint=hint) for _ in range(n)]
    if thread_id and len(requests) > 1:
        raise EnvFactoryError("--thread-id names one run; it cannot be used with several environments")
    if restart and not thread_id:
        raise EnvFactoryError("--restart starts over the thread --thread-id names; a new thread needs no restart")
    ctx = _context(prompt or [], budget, threshold, draft)
    stops = _check_nodes(interrupt_before or [])
    settings = get_settings()
    _preflight(requests, ctx, settings)
    threads = [thread_id] if thread_id else [f"envgen-{uuid.uuid4().hex[:10]}" for _ in requests]
    rows: list[dict[str, Any]] = []
    runs_on = executor_from(executor, ray_address, workers, concurrency)
    with (
        open_checkpointer(settings) as saver,
        Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=out
        ) as progress,
    ):
        if thread_id:
            _check_taken(saver, thread_id, restart)
        task = progress.add_task("envgen", total=len(requests))
        local = saver if runs_on.name == "local" else None  # Ray workers open their own
        options = _options(ctx)  # kept with each thread: a resume goes on as the run started
        jobs: list[Job] = [
            (t, {"request": r.model_dump(mode="json"), "options": options})
            for t, r in zip(threads, requests, strict=True)
        ]
        for (thread, _), result in runs_on.map(EnvGenRunner(settings, ctx, stops, local), jobs):
            if isinstance(result, dict):
                rows.append(result)
            else:  # a batch records a failure and goes on
                why = result.reason if isinstance(result, WorkerLost) else str(result)
                rows.append({"thread": thread, "status": "failed", "failure": why})
            progress.advance(task)
        _keep_failed(rows, settings, saver)
    _summary(sorted(rows, key=lambda r: threads.index(r["thread"])))
    _exit_status(rows)


def _exit_status(rows: list[dict[str, Any]]) -> None:
    """Nothing registered and nothing left to resume: the command made nothing, so it exits non-zero."""
    if rows and not any(
        r.get("status") == "registered" or str(r.get("status", "")).startswith("interrupted") for r in rows
    ):
        statuses = ", ".join(sorted({str(r.get("status")) for r in rows}))
        raise EnvFactoryError(f"no environment was registered ({statuses}); see the output / failure column above")


@app.command("resume")
def resume(
    thread: str,
    interrupt_before: Annotated[list[str] | None, typer.Option(help="stop before this node again")] = None,
    prompt: Annotated[list[str] | None, typer.Option(help="override a prompt: NAME=FILE")] = None,
    budget: Annotated[int | None, typer.Option(min=0, help="revision budget")] = None,
    threshold: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="pass threshold, 0-1")] = None,
    draft: Annotated[
        bool | None,
        typer.Option(
            "--draft/--no-draft", help="as for `run`, when the code step is still to come (default: the run's)"
        ),
    ] = None,
) -> None:
    """Continue a thread from its last checkpoint (after an interrupt or a crash), with the options it was started
    with (`--prompt`, `--budget`, `--threshold`, `--draft`); an option given here takes the place of the run's, and
    says so."""
    with open_checkpointer(get_settings()) as saver:
        graph = build(saver)
        cfg: Any = {"configurable": {"thread_id": thread}}
        snap = graph.get_state(cfg)
        if not snap.values:
            raise EnvFactoryError(f"no checkpoint for thread '{thread}' (`envfactory envgen threads` lists them)")
        _refuse_other_graphs(saver, thread)
        if not snap.next:
            given = [
                option
                for option, value in (
                    ("--interrupt-before", interrupt_before),
                    ("--prompt", prompt),
                    ("--budget", budget),
                    ("--threshold", threshold),
                )
                if value or (option in ("--budget", "--threshold") and value is not None)
            ]
            if given:  # options for a run that will not happen: said, not ignored
                raise EnvFactoryError(
                    f"thread {thread} has finished ({snap.values.get('status')}): {', '.join(given)} would change "
                    "nothing; start a new thread with `envfactory envgen run`"
                )
            out.print(f"thread {safe(thread)} has finished: {safe(snap.values.get('status'))}", highlight=False)
            _summary([{"thread": thread, **snap.values}])
            return
        ctx = _resumed_context(thread, snap.values.get("options"), prompt or [], budget, threshold, draft)
        row = run_one(saver, thread, None, ctx, _check_nodes(interrupt_before or []))
        _keep_failed([row], get_settings(), saver)
    _summary([row])
    _exit_status([row])


@app.command("history")
def history(thread: str) -> None:
    """The checkpoints of a thread, oldest first: which node ran, what is next, the verdict so far."""
    with open_checkpointer(get_settings()) as saver:
        graph = build(saver)
        snaps = list(graph.get_state_history({"configurable": {"thread_id": thread}}))
        if snaps:
            _refuse_other_graphs(saver, thread)
    if not snaps:
        raise EnvFactoryError(f"no checkpoint for thread '{thread}' (`envfactory envgen threads` lists them)")
    table = Table("step", "ran", "next", "revision", "status", "tests passed", "checkpoint")
    previous: tuple[str, ...] = ()
    for snap in reversed(snaps):  # oldest first: what ran at a step is what was next before it
        meta = snap.metadata or {}
        ran = ", ".join(previous) if previous else str(meta.get("source", ""))
        report = snap.values.get("report") or {}
        passed = f"{report.get('scenarios_passed', 0)}/{report.get('scenarios_run', 0)}" if report else ""
        table.add_row(  # a checkpoint's values are the run's (a model's text, a Studio edit): escaped
            safe(meta.get("step", "")),
            safe(ran),
            safe(", ".join(snap.next)),
            safe(snap.values.get("revision", "")),
            safe(snap.values.get("status", "")),
            safe(passed),
            safe(str(snap.config["configurable"].get("checkpoint_id", ""))[:13]),
        )
        previous = tuple(snap.next)
    out.print(table)


def _is_envgen(saver: Any, thread: str) -> bool:
    """Whether `thread` is an EnvGen run: its state holds EnvGen's keys and no other graph's (`synth` in LLM mode
    writes its QueryGen threads to the same database; a thread id is free text, so its prefix proves nothing)."""
    found = saver.get_tuple({"configurable": {"thread_id": thread}})
    values = dict(found.checkpoint.get("channel_values") or {}) if found is not None else {}
    start = values.pop("__start__", None)
    keys = {k for k in values if not k.startswith(("__", "branch:"))} | (
        set(start) if isinstance(start, dict) else set()
    )
    return bool(keys & _ENVGEN_KEYS) and keys <= _ENVGEN_KEYS


_ENVGEN_KEYS = frozenset(EnvGenState.__annotations__)


def _check_taken(saver: Any, thread: str, restart: bool) -> None:
    """A `run --thread-id` naming a thread that has checkpoints: refused, unless `--restart` asks to discard an EnvGen
    thread's (a run on top of them kept the old run's scenarios, reports and compiled plan: its new code went
    untested, or the old plan was registered in its place). Another graph's thread is never discarded."""
    found = saver.get_tuple({"configurable": {"thread_id": thread}})
    if found is None:
        return
    _refuse_other_graphs(saver, thread)
    if not restart:
        status = (found.checkpoint.get("channel_values") or {}).get("status")
        raise EnvFactoryError(
            f"thread '{thread}' already exists ({status or 'no status'}): `envfactory envgen resume {thread}` "
            "continues it; --restart discards its checkpoints and starts it over from this input"
        )


def _refuse_other_graphs(saver: Any, thread: str) -> None:
    if not _is_envgen(saver, thread):
        raise EnvFactoryError(
            f"thread '{thread}' is not an EnvGen run (synth's QueryGen keeps its threads in the same database): "
            "`envfactory envgen threads` lists EnvGen's"
        )


@app.command("threads")
def threads_cmd(
    as_json: Annotated[
        bool, typer.Option("--json", help="one JSON object a line (thread ids whole, for scripts), not a table")
    ] = False,
) -> None:
    """Every EnvGen thread in the checkpointer, newest first: its environment, status and what is next."""
    rows: list[dict[str, Any]] = []
    with open_checkpointer(get_settings()) as saver:
        graph = build(saver)
        latest: dict[str, str] = {}  # thread -> its newest checkpoint id (ids sort by time)
        for item in saver.list(None):
            thread = str(item.config["configurable"].get("thread_id", ""))
            checkpoint = str(item.config["configurable"].get("checkpoint_id", ""))
            if checkpoint > latest.get(thread, ""):
                latest[thread] = checkpoint
        others = [t for t in latest if not _is_envgen(saver, t)]  # synth's QueryGen threads share the database
        for thread in others:
            del latest[thread]
        table = Table("thread", "environment", "status", "next", "revision", "output / failure")
        for thread in sorted(latest, key=lambda t: latest[t], reverse=True):
            snap = graph.get_state({"configurable": {"thread_id": thread}})
            values = snap.values or {}
            status = values.get("status", "")
            if snap.next:
                status = f"interrupted before {', '.join(snap.next)}"
            row = {
                "thread": thread,
                "environment": (values.get("metadata") or {}).get("name", ""),
                "status": status,
                "next": list(snap.next),
                "revision": values.get("revision", ""),
                "output": values.get("output") or values.get("failure") or "",
            }
            rows.append(row)
            table.add_row(*(safe(", ".join(v) if isinstance(v, list) else v) for v in row.values()))
    if as_json:  # plain lines on stdout: no table folds an id, nothing is styled
        for row in rows:
            print(json.dumps(row, default=str))  # ASCII: no terminal control reaches the screen
        return
    note = f"{len(others)} thread(s) of synth's QueryGen in the same database, not shown" if others else ""
    if not latest:
        out.print(
            f"no EnvGen threads yet: start one with `envfactory envgen run`{f' ({note})' if note else ''}",
            highlight=False,
        )
        return
    out.print(table)
    if note:
        out.print(note, highlight=False)
