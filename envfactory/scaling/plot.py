"""One PNG of a hold-out report: how well each law fits, and where the composition law extrapolates.

Left panel — observed vs predicted score for both laws (composition law: circles, N-only baseline:
squares), runs used in the fit filled and held-out runs hollow, as in SynthAPI's figure; the diagonal
is a perfect prediction, and the legend gives each law's held-out MAE.

Right panel — score vs compute (log₂ axis): the observed runs (filled fit, hollow held-out, colored by
log₂(A·S·D)), the hold-out threshold, and the composition law's **frontier**: at each compute C, the
best prediction over the compositions that cost C, continued to 16× the table's largest compute (the
reach of SynthAPI's hold-out) and dashed beyond the largest fit run. A composition's compute is
N·D with the proxy N·D, N with the proxy N, and for a table with its own compute column k·N·D, k the
geometric mean of compute/(N·D) over the runs. The frontier uses `budget.suggest_compositions` with
limits that default to the table's range — A up to the most apps of any run, S within the runs' range,
D among the runs' depths — so beyond the table it extrapolates in T (and compute) only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from envfactory.scaling.budget import MAX_BUDGET, CompositionLimits, suggest_compositions
from envfactory.scaling.errors import ScalingError
from envfactory.scaling.fit import HoldoutReport
from envfactory.scaling.laws import CompositionParams

REACH = 16.0  # SynthAPI's held-out runs reach ≈16× the largest fit compute


def limits_from_report(report: HoldoutReport) -> CompositionLimits:
    """The table's range: A ≤ its most apps, S within its range, D among its depths."""
    states = [r.states for r in report.rows]
    return CompositionLimits(
        max_apps=max(r.apps for r in report.rows),
        min_states=min(states),
        max_states=max(states),
        depths=sorted({r.depth for r in report.rows}),
    )


def frontier(
    params: CompositionParams, report: HoldoutReport, computes: np.ndarray, limits: CompositionLimits
) -> np.ndarray:
    """The best predicted score at each compute (NaN where no composition is that cheap, or past the largest budget a
    suggestion searches, `budget.MAX_BUDGET` instances)."""
    by_n = report.compute_name.startswith("N (")
    ratios = [r.compute / (r.n * (1 if by_n else r.depth)) for r in report.rows]
    scale = float(np.exp(np.mean(np.log(ratios))))
    best = np.full(len(computes), np.nan)
    for i, c in enumerate(computes):
        for d in limits.depths:
            budget = int(c / (scale * (1 if by_n else d)) + 1e-9)
            if budget < 1 or budget > MAX_BUDGET:  # past what a suggestion searches: the curve stops there
                continue
            capped = limits.model_copy(update={"depths": [d]})
            top = suggest_compositions(params, budget, capped, top=1)[0]
            best[i] = top.predicted if np.isnan(best[i]) else max(best[i], top.predicted)
    return best


def check_plot_path(path: Path) -> None:
    """A `ScalingError` before any work when matplotlib cannot write a figure named so (its suffix names the
    format: .png, .svg, .pdf...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in formats:
        named = f"'.{suffix}'" if suffix else "no suffix"
        raise ScalingError(f"{path}: {named} is not a figure format; name it .png (or .{', .'.join(sorted(formats))})")


def plot_holdout(report: HoldoutReport, path: Path, limits: CompositionLimits | None = None) -> Path:
    """Write the two panels (module docstring) to `path` as PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display here; and never pick an interactive backend in a worker
    import matplotlib.pyplot as plt

    rows = report.rows
    held = np.array([r.held for r in rows])
    observed = np.array([r.score for r in rows])
    comp = np.array([r.composition for r in rows])
    base = np.array([r.n_only for r in rows])
    compute = np.array([r.compute for r in rows])
    diversity = np.log2([r.apps * r.states * r.depth for r in rows])

    fig, (ax_fit, ax_ext) = plt.subplots(1, 2, figsize=(13, 5.2))

    def mae(score: float | None) -> str:
        return "—" if score is None else f"{score:.4f}"

    for pred, marker, color, name, model in (
        (comp, "o", "#4c72b0", "composition law", report.composition),
        (base, "s", "#dd8452", "N-only baseline", report.n_only),
    ):
        ax_fit.scatter(
            observed[~held],
            pred[~held],
            marker=marker,
            color=color,
            s=18,
            alpha=0.7,
            label=f"{name}: fit runs (MAE {mae(model.mae_fit)})",
        )
        if held.any():
            ax_fit.scatter(
                observed[held],
                pred[held],
                marker=marker,
                facecolors="none",
                edgecolors=color,
                s=30,
                label=f"{name}: held-out (MAE {mae(model.mae_held)})",
            )
    ax_fit.plot([0, 1], [0, 1], color="0.4", linewidth=1, linestyle=":")
    ax_fit.set_xlim(-0.02, 1.02)
    ax_fit.set_ylim(-0.02, 1.02)
    ax_fit.set_xlabel("observed score")
    ax_fit.set_ylabel("predicted score")
    ratio = f", baseline/composition = {report.ratio:.1f}×" if report.ratio is not None else ""
    ax_fit.set_title(f"observed vs predicted ({report.n_held} of {len(rows)} held out{ratio})", fontsize=10)
    ax_fit.legend(fontsize=7, loc="upper left")

    cmap = plt.get_cmap("viridis")
    norm = matplotlib.colors.Normalize(
        vmin=float(diversity.min()), vmax=float(max(diversity.max(), diversity.min() + 1))
    )
    colors = cmap(norm(diversity))
    ax_ext.scatter(compute[~held], observed[~held], c=colors[~held], s=18, label="fit runs")
    if held.any():
        ax_ext.scatter(
            compute[held], observed[held], facecolors="none", edgecolors=colors[held], s=30, label="held-out runs"
        )
    fit_max = float(compute[~held].max())
    lo, hi = float(compute.min()), float(compute.max()) * REACH
    grid = np.exp2(np.arange(np.floor(np.log2(lo)), np.ceil(np.log2(hi)) + 0.5, 0.5))
    limits = limits or limits_from_report(report)
    curve = frontier(report.composition.fit.composition(), report, grid, limits)
    inside = grid <= fit_max
    ax_ext.plot(grid[inside], curve[inside], color="#4c72b0", linewidth=2, label="composition law: best composition")
    ax_ext.plot(
        grid[grid >= fit_max],
        curve[grid >= fit_max],
        color="#4c72b0",
        linewidth=2,
        linestyle="--",
        label="extrapolation",
    )
    ax_ext.axvspan(fit_max, hi, color="0.85", alpha=0.5, zorder=0)
    if report.threshold is not None:
        ax_ext.axvline(report.threshold, color="0.3", linewidth=1, linestyle=":", label="hold-out threshold")
    ax_ext.set_xscale("log", base=2)
    ax_ext.set_ylim(-0.02, 1.02)
    ax_ext.set_xlabel(report.compute_name)
    ax_ext.set_ylabel("score")
    apps = "any A" if limits.max_apps is None else f"A ≤ {limits.max_apps}"
    depths = ",".join(str(d) for d in limits.depths)
    ax_ext.set_title(f"fit and extrapolation ({apps}, D ∈ {{{depths}}})", fontsize=10)
    ax_ext.legend(fontsize=7, loc="lower right")
    fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax_ext, label="log₂(A·S·D)")

    c = report.composition.fit
    fig.suptitle(f"{c.formula}   ({report.source}{'' if report.model is None else ', ' + report.model})", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
