"""`envfactory scaling`: fit SynthAPI's composition law to a table of runs, check it on held-out
high-compute runs against an N-only baseline, plot it, and suggest a composition for a task budget.

    envfactory scaling fit TABLE [--holdout 0.25] [--fix bt=0 ...] [--plot out.png] [--json report.json]
    envfactory scaling suggest TABLE --budget N [--max-apps A] [--depths 1,2,4]
    envfactory scaling add TABLE --run SYNTH_RUN --eval EVAL_DIR [--metric success_rate] [--model M]
    envfactory scaling simulate --out table.csv [--c0 ... --nu ...] [--noise 0.01]
"""

from __future__ import annotations

import math
from enum import StrEnum
from pathlib import Path
from typing import Annotated, cast, get_args

import typer
from pydantic import ValidationError

from envfactory.cli.args import out_file_option, path_to_write, refuse_overwriting_input
from envfactory.scaling.budget import CompositionLimits, suggest_compositions
from envfactory.scaling.errors import ScalingError
from envfactory.scaling.fit import HoldoutReport, LawFit, check_fixed, evaluate_holdout, fit_law
from envfactory.scaling.laws import COMPOSITION, CompositionParams
from envfactory.scaling.simulate import DEFAULT_PARAMS, SimulationGrid, simulate_table
from envfactory.scaling.table import RunTable, load_table, write_table
from envfactory.terminal import SafeConsole, Table, safe

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Composition scaling law (SynthAPI): fit, hold-out check, plot, budget suggestion.",
)
out = SafeConsole()


class Proxy(StrEnum):
    nd = "nd"
    n = "n"


TableArg = Annotated[Path, typer.Argument(help="run table: .csv, .jsonl or .json with A, T, S, D, score")]
ModelOption = Annotated[
    str | None, typer.Option("--model", help="fit the runs of this model (needed when the table has several)")
]
SeedOption = Annotated[int, typer.Option("--seed", help="seed of the random restarts")]
RestartsOption = Annotated[
    int, typer.Option("--restarts", min=1, max=10_000, help="fit starts (the best converged one wins)")
]
FixOption = Annotated[
    list[str] | None,
    typer.Option(
        "--fix",
        help="hold a parameter at a value in every law that has it, NAME=VALUE (repeat; e.g. --fix bt=0 --fix nu=1 "
        "for runs at one T): a small table fits the rest",
    ),
]


def _fixed(items: list[str] | None) -> dict[str, float]:
    fixed: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not name or not math.isfinite(number):
            raise ScalingError(f"--fix expects NAME=NUMBER (e.g. --fix nu=1), got '{item}'")
        if name in fixed:
            raise ScalingError(f"--fix names '{name}' twice")
        fixed[name] = number
    check_fixed(fixed)
    return fixed


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ScalingError(f"{option} expects comma-separated positive integers (e.g. 1,2,4), got '{text}'") from None
    if not values or any(v < 1 for v in values):
        raise ScalingError(f"{option} expects comma-separated positive integers (e.g. 1,2,4), got '{text}'")
    return values


def _load(path: Path, model: str | None) -> RunTable:
    return load_table(path).for_model(model)


def _number(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def print_params(fit: LawFit, title: str) -> None:
    """A heading with the law's formula, then its parameters with standard errors."""
    out.print(f"[bold]{safe(title)}[/bold]: {safe(fit.formula)}", highlight=False)
    table = Table("parameter", "value", "std. error")
    for p in fit.params:
        error = "fixed" if p.fixed else _number(p.stderr) + (" (at bound)" if p.at_bound else "")
        table.add_row(safe(p.display), f"{p.value:.4f}", error)
    out.print(table)


def mae_table(report: HoldoutReport) -> Table:
    table = Table(
        "model",
        f"MAE fit runs ({report.n_fit})",
        f"MAE held-out ({report.n_held})",
        "RMSE fit",
        title="mean absolute error",
        title_justify="left",
    )
    for name, score in (("composition law", report.composition), ("N-only baseline", report.n_only)):
        table.add_row(name, _number(score.mae_fit), _number(score.mae_held), _number(score.fit.rmse))
    return table


@app.command("fit")
def fit_cmd(
    table_path: TableArg,
    holdout: Annotated[
        float, typer.Option("--holdout", help="fraction held out: the runs of highest compute (0: fit on all)")
    ] = 0.25,
    proxy: Annotated[
        Proxy, typer.Option("--proxy", help="compute when the table has no compute column: N·D or N")
    ] = Proxy.nd,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="write the fit and extrapolation figure (PNG)",
            parser=path_to_write,
            callback=out_file_option,
        ),
    ] = None,
    json_out: Annotated[
        Path | None,
        typer.Option("--json", help="write the whole report (JSON)", parser=path_to_write, callback=out_file_option),
    ] = None,
    model: ModelOption = None,
    seed: SeedOption = 0,
    restarts: RestartsOption = 8,
    fix: FixOption = None,
) -> None:
    """Fit the composition law and the N-only baseline on the lower-compute runs; score both on the rest."""
    fixed = _fixed(fix)
    refuse_overwriting_input(json_out, "--json", table_path)
    refuse_overwriting_input(plot, "--plot", table_path, json_out)
    if plot is not None:
        from envfactory.scaling.plot import check_plot_path

        check_plot_path(plot)  # before the fit: an unwritable figure must not cost the fit, or leave --json alone
    table = _load(table_path, model)
    report = evaluate_holdout(table, fraction=holdout, proxy=proxy.value, seed=seed, restarts=restarts, fixed=fixed)
    print_params(report.composition.fit, "composition law")
    print_params(report.n_only.fit, "N-only baseline")
    out.print(mae_table(report))
    if report.n_held:
        assert report.threshold is not None and report.extrapolation is not None
        out.print(
            f"held out: the top {report.fraction:.0%} by {report.compute_name} — {report.n_held} of {len(table)} runs "
            f"with compute ≥ {report.threshold:g}, reaching {report.extrapolation:.1f}× the largest fit run",
            highlight=False,
        )
        if report.ratio is not None:
            out.print(
                f"baseline / composition held-out MAE: [bold]{report.ratio:.1f}×[/bold] "
                "(SynthAPI: 0.1706 / 0.0285 ≈ 6.0×)",
                highlight=False,
            )
    else:
        out.print(f"no runs held out: both laws fitted on all {len(table)} runs", highlight=False)
    for fit in (report.composition.fit, report.n_only.fit):
        for warning in fit.warnings:
            out.print(f"[yellow]warning[/yellow] ({safe(fit.law)}): {safe(warning)}", highlight=False)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(report.model_dump_json(indent=1) + "\n", encoding="utf-8")
        out.print(f"report: {safe(str(json_out))}", highlight=False)
    if plot is not None:
        from envfactory.scaling.plot import plot_holdout

        plot_holdout(report, plot)
        out.print(f"plot: {safe(str(plot))}", highlight=False)


@app.command("suggest")
def suggest_cmd(
    table_path: TableArg,
    budget: Annotated[int, typer.Option("--budget", min=1, help="training instances N = A×T×S")],
    max_apps: Annotated[
        int | None, typer.Option("--max-apps", min=1, help="apps available (default: no limit)")
    ] = None,
    depths: Annotated[
        str | None, typer.Option("--depths", help="allowed D, e.g. 1,2,4 (default: the depths in the table)")
    ] = None,
    min_states: Annotated[
        int | None, typer.Option("--min-states", min=1, help="default: the table's smallest S")
    ] = None,
    max_states: Annotated[
        int | None, typer.Option("--max-states", min=1, help="default: the table's largest S")
    ] = None,
    max_tasks: Annotated[int | None, typer.Option("--max-tasks", min=1, help="tasks per app you can make")] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="how many compositions to list")] = 5,
    model: ModelOption = None,
    seed: SeedOption = 0,
    restarts: RestartsOption = 8,
    fix: FixOption = None,
) -> None:
    """Fit the composition law on every run and list the best compositions for a budget of N instances."""
    fixed = _fixed(fix)
    table = _load(table_path, model)
    states = [r.states for r in table.runs]
    try:
        limits = CompositionLimits(
            max_apps=max_apps,
            min_states=min_states if min_states is not None else min(states),
            max_states=max_states if max_states is not None else max(states),
            max_tasks=max_tasks,
            depths=_ints(depths, "--depths") if depths else sorted({r.depth for r in table.runs}),
        )
    except ValidationError as e:
        raise ScalingError(f"limits: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    fit = fit_law(COMPOSITION, table, seed=seed, restarts=restarts, fixed=fixed)
    params: CompositionParams = fit.composition()
    suggestions = suggest_compositions(params, budget, limits, top=top)
    print_params(fit, "composition law, fitted on all runs")
    result = Table(
        "rank", "A", "T", "S", "D", "N used", "predicted", "ties", title=f"best compositions for N = {budget}"
    )
    for i, s in enumerate(suggestions, start=1):
        result.add_row(
            str(i),
            str(s.apps),
            str(s.tasks),
            str(s.states),
            str(s.depth),
            str(s.n),
            f"{s.predicted:.4f}",
            str(s.alternatives) if s.alternatives else "",
        )
    out.print(result)
    apps = "no limit on A (set --max-apps to the apps you have)" if max_apps is None else f"A ≤ {max_apps}"
    allowed = ",".join(map(str, limits.depths))
    out.print(
        f"limits: {apps}; S in [{limits.min_states}, {limits.max_states}]; D in {{{allowed}}}; "
        "ties: compositions with the same A·S·D and T, which the law cannot tell apart",
        highlight=False,
    )


@app.command("add")
def add_cmd(
    table_path: Annotated[Path, typer.Argument(help="run table to append to (.csv, .jsonl or .json; created)")],
    run: Annotated[Path, typer.Option("--run", help="the synth run the model was trained on")],
    evaluation: Annotated[Path, typer.Option("--eval", help="the model's `envfactory eval` folder")],
    metric: Annotated[str, typer.Option(help="score: success_rate, mean_reward or pass_hat_max")] = "success_rate",
    model: Annotated[str | None, typer.Option(help="the model trained")] = None,
    label: Annotated[str | None, typer.Option(help="a name for the run")] = None,
) -> None:
    """Add a row from real runs: the synth run's A, T, S, D and the evaluation's score."""
    from envfactory.scaling.evidence import Metric, add_run, run_from

    if metric not in get_args(Metric):
        raise ScalingError(f"--metric is {', '.join(get_args(Metric))}, not '{metric}'")
    row = run_from(run, evaluation, metric=cast(Metric, metric), model=model, label=label)
    table = add_run(table_path, row)
    out.print(
        f"{safe(table_path)}: row {len(table)} A={row.apps} T={row.tasks} S={row.states} D={row.depth} "
        f"score={row.score:.4f} ({safe(metric)})",
        highlight=False,
    )


@app.command("simulate")
def simulate_cmd(
    out_path: Annotated[
        Path,
        typer.Option(
            "--out", help="table to write: .csv, .jsonl or .json", parser=path_to_write, callback=out_file_option
        ),
    ],
    c0: Annotated[float, typer.Option("--c0", help="c₀")] = DEFAULT_PARAMS.c0,
    ca: Annotated[float, typer.Option("--ca", help="c_a")] = DEFAULT_PARAMS.ca,
    b0: Annotated[float, typer.Option("--b0", help="b₀")] = DEFAULT_PARAMS.b0,
    bt: Annotated[float, typer.Option("--bt", help="b_t")] = DEFAULT_PARAMS.bt,
    nu: Annotated[float, typer.Option("--nu", help="ν (> 0)")] = DEFAULT_PARAMS.nu,
    noise: Annotated[float, typer.Option("--noise", min=0.0, help="std. dev. of the Gaussian noise on scores")] = 0.01,
    seed: Annotated[int, typer.Option("--seed", help="noise seed")] = 0,
    apps: Annotated[str, typer.Option("--apps", help="A values")] = "1,2,4,8,16,32,64",
    tasks: Annotated[str, typer.Option("--tasks", help="T values")] = "1,2,4,8,16,32,64,128,256",
    states: Annotated[str, typer.Option("--states", help="S values")] = "1,2,4",
    depths: Annotated[str, typer.Option("--depths", help="D values")] = "1,2,4",
) -> None:
    """Write a synthetic run table: every (A, T, S, D) of the grid, scored by the law plus noise."""
    for name, value in (("--c0", c0), ("--ca", ca), ("--b0", b0), ("--bt", bt), ("--nu", nu), ("--noise", noise)):
        if not math.isfinite(value):
            raise ScalingError(f"{name} must be a finite number, got {value:g}")
    if nu <= 0:
        raise ScalingError(f"--nu must be positive, got {nu:g}")
    params = CompositionParams(c0=c0, ca=ca, b0=b0, bt=bt, nu=nu)
    grid = SimulationGrid(
        apps=_ints(apps, "--apps"),
        tasks=_ints(tasks, "--tasks"),
        states=_ints(states, "--states"),
        depths=_ints(depths, "--depths"),
    )
    table = simulate_table(params, grid, noise=noise, seed=seed, source=str(out_path))
    write_table(table, out_path)
    out.print(
        f"wrote {len(table)} runs to {safe(str(out_path))} "
        f"(c₀={c0:g}, c_a={ca:g}, b₀={b0:g}, b_t={bt:g}, ν={nu:g}, noise {noise:g}, seed {seed})",
        highlight=False,
    )
