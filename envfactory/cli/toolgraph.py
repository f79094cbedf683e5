"""`envfactory graph`: build the dependency tool graph of the pool, inspect it, sample tool chains from it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from envfactory.cli.args import (
    env_name,
    env_names,
    out_file_option,
    out_file_or_stdout_option,
    path_to_write,
    refuse_overwriting_input,
)
from envfactory.config import Settings, get_settings
from envfactory.terminal import SafeConsole, Table, json_text, safe, visible
from envfactory.toolgraph.errors import ToolGraphError
from envfactory.toolgraph.graph import ToolGraph
from envfactory.toolgraph.settings import cache_path, graph_path, onnx_path, sampling_for

app = typer.Typer(no_args_is_help=True, add_completion=False, help="The dependency tool graph and chain sampling.")
out = SafeConsole()
err = SafeConsole(stderr=True)

GraphOption = Annotated[
    Path | None,
    typer.Option("--graph", help="graph file (default <data dir>/toolgraph/graph.json, what `graph build` writes)"),
]


def _load(settings: Settings, path: Path | None) -> ToolGraph:
    """`--graph`, else the data dir's; where that is missing but synth runs kept graphs of their environments
    (`envs_graph_path`), the error names them, newest first."""
    from envfactory.toolgraph.io import load_graph

    if path is None and not (whole := graph_path(settings)).exists():
        kept = sorted(whole.parent.glob("graph-*.json"), key=_mtime, reverse=True)
        if kept:
            names = ", ".join(p.name for p in kept[:3]) + (f" and {len(kept) - 3} more" if len(kept) > 3 else "")
            raise ToolGraphError(
                f"{whole}: no tool graph here: build one with `envfactory graph build`, or pass --graph with one "
                f"that synth runs kept in {whole.parent} (newest first: {names})"
            )
    return load_graph(path or graph_path(settings))


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:  # gone since it was listed
        return 0


def parse_length(text: str) -> tuple[int, int]:
    """`3..6` → (3, 6); `4` → (4, 4). A bad value is a usage error (exit 2), as any other option's."""
    lo, sep, hi = text.partition("..")
    try:
        bounds = (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError:
        raise typer.BadParameter(f"expects N or MIN..MAX (e.g. 3..6), got '{text}'", param_hint="--length") from None
    if bounds[0] < 1 or bounds[1] < bounds[0]:
        raise typer.BadParameter(f"{text}: needs 1 <= MIN <= MAX", param_hint="--length")
    return bounds


@app.command("build")
def build(
    out_path: Annotated[
        Path | None,
        typer.Option(
            "--out", help="where to write the graph (default: data dir)", parser=path_to_write, callback=out_file_option
        ),
    ] = None,
    graphml: Annotated[
        Path | None, typer.Option(help="also export GraphML here", parser=path_to_write, callback=out_file_option)
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="only these environments (repeatable)")] = None,
    no_llm: Annotated[bool, typer.Option("--no-llm", help="heuristic classification, no refinement")] = False,
    threshold: Annotated[
        float | None,
        typer.Option(min=-1.0, max=1.0, help="build_edge_threshold, a cosine (default 0.85)"),
    ] = None,
) -> None:
    """Build the graph over the pool (envs/ and BFCL's environments) and save it."""
    from envfactory.llm.usage import process_usage
    from envfactory.progress import phase_bars
    from envfactory.toolgraph.build import build_pool_graph
    from envfactory.toolgraph.io import export_graphml, save_graph

    settings = get_settings()
    refuse_overwriting_input(graphml, "--graphml", out_path or graph_path(settings))
    for option, path in (("--out", out_path), ("--graphml", graphml)):  # the caches the build reads
        refuse_overwriting_input(path, option, cache_path(settings), onnx_path(settings))
    env = env_names(env) if env is not None else None
    with phase_bars(err) as progress:
        graph, report = build_pool_graph(settings, env, no_llm=no_llm, threshold=threshold, progress=progress)
    use_llm = report.llm
    if use_llm:
        err.print(process_usage().table())  # per role: calls, tokens, answers that needed a repair
    path = save_graph(graph, out_path or graph_path(settings))
    if graphml is not None:
        export_graphml(graph, graphml)
    s = graph.stats()
    table = Table("tools", "envs", "inputs (user / internal)", "outputs", "Tool_Depend", "cross-env", "llm")
    table.add_row(
        str(s.tools), str(s.envs), f"{s.inputs} ({s.user_provided} / {s.internal})", str(s.outputs),
        str(s.tool_depend), str(s.cross_env_depend), str(s.llm_depend),
    )  # fmt: skip
    out.print(table)
    t = report.timings
    out.print(
        f"texts {report.texts} (model ran on {report.embedded if report.embedded is not None else '?'}), "
        f"embed {t.embed_s:.2f}s, similarity {t.similarity_s:.3f}s, graph {t.graph_s:.3f}s, "
        f"llm {t.classify_s + t.refine_s:.2f}s; classification: {'llm' if use_llm else 'heuristic'}",
        highlight=False,
    )
    for r in report.refinement:
        for c in r.changes:
            mark = "applied" if c.applied else f"skipped: {c.note}"
            line = f"refine {r.env}: {c.action} {c.source} -> {c.target} ({c.reason}) [{mark}]"
            out.print(visible(line), highlight=False, markup=False, soft_wrap=True)
    out.print(visible(f"wrote {path}" + (f" and {graphml}" if graphml else "")), highlight=False, markup=False)


@app.command("stats")
def stats(graph_file: GraphOption = None) -> None:
    """Per environment: tools, inputs (user-provided / internal), dependencies."""
    graph = _load(get_settings(), graph_file)
    table = Table("env", "tools", "read", "write", "inputs", "user", "internal", "depend", "cross-env", "isolated")
    depend = graph.depend_edges()
    linked = {a for a, _, _ in depend} | {b for _, b, _ in depend}  # a cross-environment edge links its tools too
    for env in graph.envs():
        s = graph.subgraph(env).stats()
        isolated = sum(t not in linked for t in graph.tools(env))
        cross = sum(1 for a, b, d in depend if d["cross_env"] and env in (graph.env_of(a), graph.env_of(b)))
        table.add_row(
            safe(env), str(s.tools), str(s.read_tools), str(s.write_tools), str(s.inputs), str(s.user_provided),
            str(s.internal), str(s.tool_depend), str(cross), str(isolated),
        )  # fmt: skip
    s = graph.stats()
    table.add_row(
        "[bold]all[/bold]", str(s.tools), str(s.read_tools), str(s.write_tools), str(s.inputs), str(s.user_provided),
        str(s.internal), str(s.tool_depend), str(s.cross_env_depend), str(s.isolated_tools),
    )  # fmt: skip
    out.print(table)
    out.print(
        f"Parameter_Relate pairs: {s.parameter_relate}; LLM edges: {s.llm_depend}; "
        f"tools with an unsatisfiable required input: {s.unsatisfiable_tools}",
        highlight=False,
    )


@app.command("show")
def show(
    env: str,
    graph_file: GraphOption = None,
    html: Annotated[
        Path | None,
        typer.Option(
            help="write the HTML view here (default <data dir>/toolgraph/ENV.html)",
            parser=path_to_write,
            callback=out_file_option,
        ),
    ] = None,
) -> None:
    """One environment: its tools' inputs (user-provided or from which tools) and dependencies; writes an HTML view."""
    from envfactory.toolgraph.html import render_env_html

    settings = get_settings()
    env = env_name(env)  # a path below: <data dir>/toolgraph/ENV.html
    refuse_overwriting_input(html, "--html", graph_file or graph_path(settings))
    graph = _load(settings, graph_file)
    if env not in graph.envs():
        raise ToolGraphError(f"no environment '{env}' in the graph (known: {', '.join(graph.envs())})")
    table = Table("tool", "kind", "inputs", "depends on", "feeds")
    for t in graph.tools(env):
        inputs = []
        for p in graph.inputs(t):
            d = graph.node(p)
            flag = "user" if d.get("user_provided") else "internal"
            inputs.append(f"{d['name']}{'*' if d.get('required') else ''} ({flag})")
        short = [x.split(".", 1)[1] if graph.env_of(x) == env else x for x in graph.predecessor_tools(t)]
        feeds = [x.split(".", 1)[1] if graph.env_of(x) == env else x for x in graph.successor_tools(t)]
        cells = (graph.node(t)["name"], graph.node(t)["kind"], ", ".join(inputs), ", ".join(short), ", ".join(feeds))
        table.add_row(*map(safe, cells))
    out.print(table)
    out.print("* required", highlight=False)
    target = html or settings.data_path / "toolgraph" / f"{env}.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_env_html(graph, env), encoding="utf-8")
    out.print(visible(f"wrote {target}"), highlight=False, markup=False)


@app.command("sample")
def sample(
    n: Annotated[int, typer.Option("--n", min=1, max=10_000_000, help="number of chains")] = 100,
    length: Annotated[str, typer.Option(help="chain length N or MIN..MAX")] = "3..6",
    seed: Annotated[int, typer.Option(help="seed: the same seed and graph give the same chains")] = 0,
    out_path: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="JSONL file, '-' for stdout (default <data dir>/toolgraph/chains.jsonl)",
            parser=path_to_write,
            callback=out_file_or_stdout_option,
        ),
    ] = None,
    graph_file: GraphOption = None,
) -> None:
    """Sample dependency-satisfiable tool chains (topology-aware) and write them as JSONL."""
    from envfactory.toolgraph.sampler import TopologySampler

    span = parse_length(length)  # a mistake in the arguments is said before any file is read
    settings = get_settings()
    refuse_overwriting_input(out_path, "--out", graph_file or graph_path(settings))
    graph = _load(settings, graph_file)
    chains = TopologySampler(graph, sampling_for(graph, settings.toolgraph)).sample(n, span, seed=seed)
    if not chains:  # nothing written: an empty file would pass for a result
        raise ToolGraphError(
            f"no chain of length {length} can be sampled from this graph (its longest dependency chains are shorter;"
            " try a smaller --length)"
        )
    lines = "".join(c.model_dump_json() + "\n" for c in chains)
    if out_path is not None and str(out_path) == "-":
        sys.stdout.write(json_text(lines))  # a JSON string's DEL or C1 character as a JSON escape: the same JSON
    else:
        target = out_path or settings.data_path / "toolgraph" / "chains.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(lines, encoding="utf-8")
        err.print(visible(f"wrote {len(chains)} chains to {target}"), highlight=False, markup=False)
    if len(chains) < n:
        err.print(f"[yellow]only {len(chains)} of {n} chains could be sampled at length {safe(length)}[/yellow]")


@app.command("export")
def export(
    graphml: Annotated[
        Path, typer.Option(help="GraphML file to write", parser=path_to_write, callback=out_file_option)
    ],
    graph_file: GraphOption = None,
) -> None:
    """Export the graph as GraphML (every attribute, user_provided included)."""
    from envfactory.toolgraph.io import export_graphml

    settings = get_settings()
    refuse_overwriting_input(graphml, "--graphml", graph_file or graph_path(settings))
    graph = _load(settings, graph_file)
    out.print(visible(f"wrote {export_graphml(graph, graphml)}"), highlight=False, markup=False)
