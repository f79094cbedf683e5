"""The composition scaling law (envfactory.scaling): fits recover known parameters, the compute hold-out,
hand-checked numbers on a small table, budget suggestions reasoned from the law, the plot, bad tables
and the `envfactory scaling` sub-app."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from envfactory.cli.scaling import app
from envfactory.errors import EnvFactoryError
from envfactory.scaling import (
    DEFAULT_PARAMS,
    BudgetError,
    CompositionLimits,
    CompositionParams,
    FitError,
    Run,
    RunTable,
    RunTableError,
    ScalingError,
    SimulationGrid,
    evaluate_holdout,
    fit_law,
    load_table,
    simulate_table,
    split_by_compute,
    suggest_compositions,
    write_table,
)
from envfactory.scaling.plot import plot_holdout

OTHER_PARAMS = CompositionParams(c0=-2.0, ca=0.5, b0=-0.5, bt=0.4, nu=0.8)
# absolute tolerances: b₀ and ν trade against each other along the task curve, so they get the widest
TOLERANCE = {"c0": 0.05, "ca": 0.02, "b0": 0.3, "bt": 0.05, "nu": 0.25}

HAND_MADE = """\
A,T,S,D,score,label
1,64,1,2,0.21,a1-t64
4,16,1,2,0.24,a4-t16
8,8,1,2,0.22,a8-t8
8,64,1,2,0.38,a8-t64
8,256,1,2,0.45,a8-t256
16,32,1,2,0.40,a16-t32
32,16,1,2,0.41,a32-t16
64,8,1,2,0.36,a64-t8
16,128,2,2,0.55,a16-t128-s2
32,64,2,4,0.63,a32-t64-s2-d4
64,64,4,4,0.70,a64-t64-s4-d4
64,256,2,4,0.74,a64-t256-s2-d4
"""


def sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def by_hand_composition(v: dict[str, float], a: int, t: int, s: int, d: int) -> float:
    return sigmoid(v["c0"] + v["ca"] * math.log2(a * s * d)) * sigmoid(v["b0"] + v["bt"] * math.log2(t)) ** v["nu"]


def by_hand_n_only(v: dict[str, float], n: int) -> float:
    return sigmoid(v["a0"] + v["a1"] * math.log2(n)) ** v["nu"]


@pytest.fixture(scope="module")
def simulated() -> RunTable:
    return simulate_table(DEFAULT_PARAMS, noise=0.01, seed=0)


@pytest.fixture
def hand_made(tmp_path: Path) -> Path:
    path = tmp_path / "runs.csv"
    path.write_text(HAND_MADE, encoding="utf-8")
    return path


# -- fitting known parameters ----------------------------------------------------------------------


@pytest.mark.parametrize(("params", "seed"), [(DEFAULT_PARAMS, 0), (OTHER_PARAMS, 1)])
def test_fit_recovers_known_parameters(params: CompositionParams, seed: int) -> None:
    table = simulate_table(params, noise=0.01, seed=seed)
    assert len(table) == 7 * 9 * 3 * 3  # A 1..64, T 1..256, S 1..4, D 1..4: powers of two
    fit = fit_law("composition", table, seed=0)
    assert fit.converged >= 1 and not fit.warnings
    for p in fit.params:
        truth = getattr(params, p.name)
        assert abs(p.value - truth) < TOLERANCE[p.name], (p.name, p.value, truth)
        assert p.stderr is not None and abs(p.value - truth) < 4 * p.stderr, (p.name, p.value, truth, p.stderr)
    assert fit.mae < 0.0095  # the noise's own MAE is 0.01·√(2/π) ≈ 0.008
    assert fit.rmse == pytest.approx(0.01, abs=0.002)


def test_fit_is_deterministic_for_a_seed(simulated: RunTable) -> None:
    first = fit_law("composition", simulated, seed=7, restarts=4)
    again = fit_law("composition", simulated, seed=7, restarts=4)
    assert first.values() == again.values()


def test_holdout_composition_law_beats_n_only_baseline(simulated: RunTable) -> None:
    report = evaluate_holdout(simulated, fraction=0.25)
    assert report.n_held == math.ceil(0.25 * len(simulated)) == 142
    assert report.n_fit + report.n_held == len(simulated)
    held = [r for r in report.rows if r.held]
    fit = [r for r in report.rows if not r.held]
    # the held-out runs are the top by compute (N·D proxy): none below any fit run
    assert report.compute_name == "N·D (proxy)"
    assert all(r.compute == r.n * r.depth for r in report.rows)
    assert min(r.compute for r in held) >= max(r.compute for r in fit)
    assert report.threshold == min(r.compute for r in held)
    assert report.extrapolation == pytest.approx(max(r.compute for r in held) / max(r.compute for r in fit))
    comp, base = report.composition, report.n_only
    assert comp.mae_held is not None and base.mae_held is not None
    assert comp.mae_held < 0.012 and comp.mae_fit < 0.012  # ≈ the noise: the law extrapolates
    assert base.mae_held > 5 * comp.mae_held  # at a fixed N, the split among A, T, S, D moves the score
    assert report.ratio == pytest.approx(base.mae_held / comp.mae_held)
    assert all(0.0 < r.composition < 1.0 and 0.0 < r.n_only < 1.0 for r in report.rows)


def test_split_by_compute_rounds_up_and_keeps_table_order_on_ties() -> None:
    table = RunTable(runs=[Run(apps=a, tasks=1, states=1, depth=1, score=0.5) for a in (4, 1, 4, 2, 8)])
    fit, held = split_by_compute(table, 0.25)  # ⌈1.25⌉ = 2 held: compute 8, then the later of the two 4s
    assert held == [2, 4] and fit == [0, 1, 3]
    assert split_by_compute(table, 0.0) == ([0, 1, 2, 3, 4], [])
    with pytest.raises(ScalingError, match=r"hold-out fraction must be in \[0, 1\)"):
        split_by_compute(table, 1.0)


# -- a small hand-made table -----------------------------------------------------------------------


def test_hand_made_table_fits_with_hand_checked_numbers(hand_made: Path) -> None:
    table = load_table(hand_made)
    assert len(table) == 12 and table.runs[0].label == "a1-t64" and table.runs[-1].n == 64 * 256 * 2
    report = evaluate_holdout(table, fraction=0.25)
    assert (report.n_fit, report.n_held) == (9, 3)
    assert [r.label for r in report.rows if r.held] == ["a32-t64-s2-d4", "a64-t64-s4-d4", "a64-t256-s2-d4"]
    comp = report.composition.fit.values()
    base = report.n_only.fit.values()
    errors_comp, errors_base = [], []
    for r in report.rows:
        p = by_hand_composition(comp, r.apps, r.tasks, r.states, r.depth)
        q = by_hand_n_only(base, r.apps * r.tasks * r.states)
        assert 0.0 <= p <= 1.0 and 0.0 <= q <= 1.0
        assert r.composition == pytest.approx(p, abs=1e-12) and r.n_only == pytest.approx(q, abs=1e-12)
        errors_comp.append((abs(p - r.score), r.held))
        errors_base.append((abs(q - r.score), r.held))
    for errors, score in ((errors_comp, report.composition), (errors_base, report.n_only)):
        held = [e for e, h in errors if h]
        fitted = [e for e, h in errors if not h]
        assert score.mae_held == pytest.approx(sum(held) / len(held), abs=1e-12)
        assert score.mae_fit == pytest.approx(sum(fitted) / len(fitted), abs=1e-12)
        assert score.fit.mae == pytest.approx(score.mae_fit, abs=1e-9)
    # sanity: scores rise with A·S·D and with T on this table, and the fit says so
    assert comp["ca"] > 0 and comp["bt"] > 0 and comp["nu"] > 0
    assert report.composition.mae_fit < 0.05
    assert report.composition.mae_held is not None and report.composition.mae_held < 0.15


def test_table_formats_round_trip(tmp_path: Path, hand_made: Path) -> None:
    table = load_table(hand_made)
    for suffix in (".csv", ".jsonl", ".json"):
        again = load_table(write_table(table, tmp_path / f"copy{suffix}"))
        assert again.runs == table.runs, suffix


def test_a_table_rewrite_cut_short_leaves_the_old_table(
    tmp_path: Path, hand_made: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`scaling add` rewrites the whole table: a reviewer's kill mid-write left a 300,000-row table empty. The old
    table or the whole new one, never a torn one."""
    import envfactory.inputs

    table = load_table(hand_made)
    for suffix in (".csv", ".jsonl", ".json"):
        path = write_table(table, tmp_path / f"runs{suffix}")
        before = path.read_bytes()

        def killed(*_: object) -> None:
            raise OSError(28, "No space left on device")

        with monkeypatch.context() as m:
            m.setattr(envfactory.inputs.os, "replace", killed)
            with pytest.raises(RunTableError, match="No space left on device"):
                write_table(table.model_copy(update={"runs": table.runs[:1]}), path)
        assert path.read_bytes() == before, suffix
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_compute_column_and_models(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    rows = [
        {"apps": 8, "tasks": 8, "states": 1, "depth": 2, "score": 0.3, "compute": 1e18, "model": "4B"},
        {"apps": 8, "tasks": 8, "states": 1, "depth": 2, "score": 0.4, "compute": 3e18, "model": "9B"},
        {"apps": 16, "tasks": 8, "states": 1, "depth": 2, "score": 0.5, "compute": 5e18, "model": "9B"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    table = load_table(path)
    assert table.models() == ["4B", "9B"]
    with pytest.raises(RunTableError, match=r"runs of 2 models \(4B, 9B\); choose one"):
        table.for_model(None)
    with pytest.raises(RunTableError, match=r"no runs of model '27B' \(models: 4B, 9B\)"):
        table.for_model("27B")
    nine = table.for_model("9B")
    assert len(nine) == 2 and nine.compute_name() == "compute"
    assert nine.compute().tolist() == [3e18, 5e18]  # the column wins over any proxy
    assert nine.compute("n").tolist() == [3e18, 5e18]


# -- budget suggestions ------------------------------------------------------------------------------


def best_apps(params: CompositionParams, budget: int) -> int:
    only_apps_and_tasks = CompositionLimits(depths=[1], max_states=1)  # the A-vs-T trade alone
    return suggest_compositions(params, budget, only_apps_and_tasks, top=1)[0].apps


def test_budget_prefers_more_apps_at_large_budgets() -> None:
    # At the best split of N = A·T (S = D = 1), a = log₂A solves c_a·(1 − σ(u)) = ν·b_t·(1 − σ(v)),
    # u = c₀ + c_a·a, v = b₀ + b_t·(log₂N − a). A larger N raises v for every a, so the task side's
    # marginal gain falls and the optimum moves toward more apps: best A never decreases with N.
    params = CompositionParams(c0=-4.0, ca=0.4, b0=-1.5, bt=0.7, nu=1.5)  # ceiling far from saturated
    budgets = [2**k for k in range(4, 21, 2)]
    apps = [best_apps(params, n) for n in budgets]
    assert apps == sorted(apps) and apps[-1] >= 16 * apps[0], apps
    # the first-order condition changes sign around the suggested A (a discrete optimum of a concave trade)
    n = 2**16
    a = best_apps(params, n)

    def gain(apps_: float) -> float:  # ∂ log P / ∂ log₂A along A·T = N
        u = params.c0 + params.ca * math.log2(apps_)
        v = params.b0 + params.bt * math.log2(n / apps_)
        return params.ca * (1 - sigmoid(u)) - params.nu * params.bt * (1 - sigmoid(v))

    assert gain(a / 2) > 0 > gain(a * 2)


def test_budget_prefers_more_apps_when_c_a_is_large() -> None:
    # the apps side's marginal gain c_a·(1 − σ(u)) grows with c_a while the ceiling is unsaturated
    small = CompositionParams(c0=-5.0, ca=0.15, b0=-1.5, bt=0.7, nu=1.5)
    large = small.model_copy(update={"ca": 0.45})
    n = 2**16
    assert best_apps(large, n) > best_apps(small, n)
    assert best_apps(large, n) >= 64


def test_budget_respects_limits_and_collapses_ties() -> None:
    limits = CompositionLimits(max_apps=16, max_states=4, depths=[1, 2])
    suggestions = suggest_compositions(DEFAULT_PARAMS, 4096, limits, top=5)
    assert len(suggestions) == 5
    assert [s.predicted for s in suggestions] == sorted((s.predicted for s in suggestions), reverse=True)
    for s in suggestions:
        assert s.apps <= 16 and s.states <= 4 and s.depth in (1, 2)
        assert s.n == s.apps * s.tasks * s.states <= 4096
        assert s.predicted == pytest.approx(float(DEFAULT_PARAMS.predict(s.apps, s.tasks, s.states, s.depth)[0]))
    # one entry per (A·S·D, T): the law cannot tell (16, S=2, D=1) from (8, S=2, D=2) or (16, S=1, D=2)
    keys = [(s.apps * s.states * s.depth, s.tasks) for s in suggestions]
    assert len(set(keys)) == len(keys)
    best = suggestions[0]
    assert best.apps == 16 and best.depth == 2  # with c_a > 0: all the apps allowed, the deepest data
    # a budget that is not a power of two: A·S from divisors and powers of two, T = ⌊N/(A·S)⌋
    odd = suggest_compositions(DEFAULT_PARAMS, 1000, CompositionLimits(max_apps=64, depths=[1]), top=3)
    assert all(s.n <= 1000 for s in odd) and odd[0].n >= 900
    # the apps you have are tried whether or not they divide the budget (364 with 3 apps left A=3 out)
    three = suggest_compositions(DEFAULT_PARAMS, 364, CompositionLimits(max_apps=3, max_states=1, depths=[2]), top=1)
    assert three[0].apps == 3 and three[0].n <= 364


def test_budget_errors() -> None:
    with pytest.raises(BudgetError, match="budget must be between 1"):
        suggest_compositions(DEFAULT_PARAMS, 0)
    with pytest.raises(BudgetError, match="no composition of 8 instances fits the limits"):
        suggest_compositions(DEFAULT_PARAMS, 8, CompositionLimits(min_apps=16))


# -- the plot ------------------------------------------------------------------------------------------


def test_plot_writes_a_png(tmp_path: Path) -> None:
    grid = SimulationGrid(apps=[1, 4, 16, 64], tasks=[1, 4, 16, 64, 256], states=[1, 2], depths=[1, 4])
    report = evaluate_holdout(simulate_table(DEFAULT_PARAMS, grid, noise=0.01, seed=2))
    path = plot_holdout(report, tmp_path / "plots" / "scaling.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 30_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > height > 400


def test_a_plot_of_runs_past_the_largest_budget_is_drawn(tmp_path: Path) -> None:
    """The frontier reaches 16x the largest compute and asked for budgets a suggestion refuses (over 1e12 instances):
    on a table whose largest N is 1e11, `scaling fit --plot` printed the fit, then failed without a plot."""
    grid = SimulationGrid(apps=[1, 100, 10_000], tasks=[1, 1_000, 1_000_000], states=[1, 10], depths=[1])
    report = evaluate_holdout(simulate_table(DEFAULT_PARAMS, grid, noise=0.01, seed=2))
    assert max(r.n for r in report.rows) == 10**11
    assert plot_holdout(report, tmp_path / "big.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- bad tables and unfittable tables ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("A,T,S,score\n1,2,1,0.5\n", r"header: missing column 'D' \(columns: A, T, S, score\)"),
        ("A,T,S,D,score\n1,2,1,1,0.5\n2,x,1,1,0.4\n", r"row 2 \(line 3\), column 'T': expected a number, got 'x'"),
        ("A,T,S,D,score\n-2,2,1,1,0.5\n", r"row 1 \(line 2\), column 'A': apps must be a positive integer, got '-2'"),
        ("apps,T,S,D,score\n2.5,2,1,1,0.5\n", r"column 'apps': apps must be a positive integer, got '2.5'"),
        ("A,T,S,D,score\n1,2,1,1,87.5\n", r"column 'score': '87.5' is outside \[0, 1\].*divide percentages by 100"),
        ("A,T,S,D,score\n1,2,1,,0.5\n", r"row 1 \(line 2\), column 'D': empty"),
        ("A,T,S,D,score\n1,2,1,1,nan\n", r"column 'score': expected a finite number"),
        ("A,T,S,D,score,compute\n1,2,1,1,0.5,10\n2,2,1,1,0.6,\n", r"row 2 has no compute while others have"),
        ("A,apps,T,S,D,score\n1,1,2,1,1,0.5\n", r"columns 'A' and 'apps' both give A"),
        ("A,T,S,D,score\n", r"no runs"),
        ("", r"empty file"),
    ],
)
def test_bad_csv_tables_name_row_and_column(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(RunTableError, match=message) as info:
        load_table(path)
    assert isinstance(info.value, EnvFactoryError) and "\n" not in str(info.value)


def test_bad_json_tables(tmp_path: Path) -> None:
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"A": 1, "T": 2, "S": 1, "D": 1, "score": 0.5}\n{"A": 1,\n', encoding="utf-8")
    with pytest.raises(RunTableError, match=r"line 2: not valid JSON"):
        load_table(jsonl)
    js = tmp_path / "bad.json"
    js.write_text('{"A": 1}', encoding="utf-8")
    with pytest.raises(RunTableError, match=r"expected a list of runs"):
        load_table(js)
    js.write_text('[{"A": 1, "T": 2, "S": 1, "D": 1, "score": "high"}]', encoding="utf-8")
    with pytest.raises(RunTableError, match=r"row 1, column 'score': expected a number, got 'high'"):
        load_table(js)
    with pytest.raises(RunTableError, match=r"unknown table format '.txt'"):
        load_table(tmp_path / "runs.txt")
    with pytest.raises(RunTableError, match=r"no such file"):
        load_table(tmp_path / "missing.csv")


def test_unfittable_tables(hand_made: Path) -> None:
    table = load_table(hand_made)
    few = table.subset(range(7))  # 7 runs, ⌈1.75⌉ = 2 held out: 5 left for 5 parameters
    with pytest.raises(FitError, match=r"composition law has 5 parameters and needs at least 6 runs to fit; got 5"):
        evaluate_holdout(few)
    with pytest.raises(FitError, match=r"needs at least 6 runs to fit; got 3"):
        fit_law("composition", table.subset(range(3)))
    same_t = RunTable(runs=[r.model_copy(update={"tasks": 8}) for r in table.runs])
    with pytest.raises(FitError, match=r"every run has the same T"):
        fit_law("composition", same_t)
    with pytest.raises(ScalingError, match=r"unknown law 'power'"):
        fit_law("power", table)


# -- the CLI sub-app -----------------------------------------------------------------------------------


def test_cli_simulate_fit_suggest(tmp_path: Path) -> None:
    runner = CliRunner()
    table = tmp_path / "sim.csv"
    res = runner.invoke(
        app, ["simulate", "--out", str(table), "--ca", "0.4", "--seed", "3", "--tasks", "1,4,16,64,256"]
    )
    assert res.exit_code == 0, res.output
    assert "wrote 315 runs" in res.output
    first = load_table(table).runs[0]
    assert (first.apps, first.tasks, first.states, first.depth) == (1, 1, 1, 1)

    plot, report = tmp_path / "fit.png", tmp_path / "report.json"
    res = runner.invoke(app, ["fit", str(table), "--plot", str(plot), "--json", str(report)], env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    for needle in ("composition law", "N-only baseline", "c_a", "MAE held-out", "baseline / composition held-out MAE"):
        assert needle in res.output
    assert plot.read_bytes()[:4] == b"\x89PNG"
    data = json.loads(report.read_text(encoding="utf-8"))
    assert data["n_held"] == math.ceil(0.25 * 315) and data["ratio"] > 3
    ca = next(p for p in data["composition"]["fit"]["params"] if p["name"] == "ca")
    assert ca["value"] == pytest.approx(0.4, abs=0.03)

    res = runner.invoke(app, ["suggest", str(table), "--budget", "4096", "--max-apps", "32", "--top", "3"])
    assert res.exit_code == 0, res.output
    assert "best compositions for N = 4096" in res.output and "A ≤ 32" in res.output


def test_cli_errors_are_envfactory_errors(tmp_path: Path, hand_made: Path) -> None:
    runner = CliRunner()
    bad = tmp_path / "bad.csv"
    bad.write_text("A,T,S,D,score\n1,2,1,1,0.5\n-1,2,1,1,0.5\n", encoding="utf-8")
    res = runner.invoke(app, ["fit", str(bad)])
    assert res.exit_code != 0 and isinstance(res.exception, RunTableError)  # the main CLI prints `error: ...`
    res = runner.invoke(app, ["suggest", str(hand_made), "--budget", "64", "--depths", "1,x"])
    assert isinstance(res.exception, ScalingError) and "--depths expects comma-separated" in str(res.exception)
    res = runner.invoke(app, ["suggest", str(hand_made), "--budget", "64", "--min-states", "4", "--max-states", "2"])
    assert isinstance(res.exception, ScalingError) and "max_states 2 is below min_states 4" in str(res.exception)
    res = runner.invoke(app, ["fit", str(hand_made), "--holdout", "1.5"])
    assert isinstance(res.exception, ScalingError) and "hold-out fraction must be in [0, 1)" in str(res.exception)


def test_simulated_noise_is_seeded_and_clipped() -> None:
    grid = SimulationGrid(apps=[1, 64], tasks=[1, 256], states=[1], depths=[1])
    a = simulate_table(DEFAULT_PARAMS, grid, noise=0.5, seed=4)
    b = simulate_table(DEFAULT_PARAMS, grid, noise=0.5, seed=4)
    assert a.runs == b.runs
    scores = np.array([r.score for r in a.runs])
    assert ((scores >= 0) & (scores <= 1)).all()
