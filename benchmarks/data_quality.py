"""Data-quality benchmark: offline conversations measured beside the EnvFactory paper's data.

    python benchmarks/data_quality.py [--large-tasks 17] [--skip-large]
        [--compiled DIR [--compiled-apps 100] [--compiled-tasks 2] [--graph FILE]]

Two plans, run offline (no model) on the bundled pool, each from scratch in a temporary folder:
- **demo** — what `make demo` runs (T=3, S=2, D=2, seed 0, over the environments it samples);
- **large** — every native environment, T=17, S=2, D=2: 9 × 17 × 2 = 306 units.

With `--compiled DIR` (a folder of environments compiled from API specs, `envfactory corpus build`), a
third plan runs over them alone, printed beside the native ones:
- **compiled** — A=100 (a seeded sample of DIR's environments), T=2, S=1, D=2; its tool graph is
  `--graph` (one `envfactory graph build` made with ENVFACTORY_COMPILED_DIR=DIR), else built first.

Figures (definitions in `envfactory/tasks/quality.py`): turns per conversation and calls per turn
(the paper's data: 4.82 and 3.29 — the paper counts steps, which include its turns' own lookups),
requests with an internal id, id-valued arguments found in no earlier result, empty results followed
by more calls in the same turn, canned answers, distinct answers, distinct-2 over requests, keep-rate,
and speed (units/s, ms per tool call, whole batch including states, solving, wording and writing).
The "before" column is the offline path as it was before this work (commit b16788b), measured on
this machine on the demo plan on 2026-12-03 with the same definitions; "before (compiled)" is the compiled
plan before ids were resolved through the compiled plan (commit eb1d8ca), measured on 2026-12-04.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envfactory.config import Settings  # noqa: E402
from envfactory.env.pool import EnvPool  # noqa: E402
from envfactory.tasks.plan import SynthConfig, load_conversations, read_jsonl  # noqa: E402
from envfactory.tasks.quality import PAPER_STEPS_PER_TURN, PAPER_TURNS_PER_CONVERSATION, measure  # noqa: E402
from envfactory.tasks.run import run_batch  # noqa: E402

# the offline path before this work (commit b16788b), demo plan, measured here with quality.measure
BEFORE: dict[str, Any] = {
    "turns_per_conversation": 1.22,
    "calls_per_turn": 2.49,
    "requests_with_internal_id": 0.436,
    "incoherent_id_arguments": 0.219,
    "empty_then_more": 10,
    "canned_answers": 0.487,
    "distinct_answers": 0.615,
    "distinct_2_requests": 0.339,
    "distinct_2_per_100": 0.339,  # (its 39 requests are one chunk)
    "keep_rate": 32 / 54,
    "ms_per_call": 14.6,
}

# the compiled plan before ids were resolved through the plan (commit eb1d8ca), measured here on 2026-12-04:
# A=100 environments sampled (seed 0) from a folder of 170 healthy compiled ones, graph built over them
COMPILED_BEFORE: dict[str, Any] = {
    "turns_per_conversation": 3.86,
    "calls_per_turn": 1.72,
    "requests_with_internal_id": 0.005,
    "requests_with_own_id": 0.0,
    "incoherent_id_arguments": 0.014,
    "empty_then_more": 2,
    "canned_answers": 0.075,
    "distinct_answers": 1.00,
    "distinct_2_requests": 0.44,
    "distinct_2_per_100": 0.51,
    "keep_rate": 98 / 193,
    "ms_per_call": 151.2,
}


def run(plan: dict[str, Any], root: Path, compiled: Path | None = None, graph: Path | None = None) -> dict[str, Any]:
    out = root / "run"
    if compiled is None:
        settings = Settings(root=ROOT, bfcl=False, compiled_dir=None)
    else:  # the compiled environments alone (a data folder of the run's own, for a graph built here)
        settings = Settings(root=ROOT, bfcl=False, compiled_dir=compiled, data_dir=root / "data")
        pool = EnvPool(settings)
        plan = {**plan, "envs": [n for n in pool.native_names() if pool.compiled(n)], "graph": graph}
    config = SynthConfig.model_validate({**plan, "out": out, "plot": False})
    started = time.perf_counter()
    run_batch(config, settings, console=Console(file=open("/dev/null", "w")))  # noqa: SIM115
    seconds = time.perf_counter() - started
    conversations = load_conversations(out)
    dropped = read_jsonl(out / "dropped.jsonl")
    figures = measure(conversations).model_dump()
    units = len(conversations) + len(dropped)
    figures.update(
        units=units,
        keep_rate=len(conversations) / units if units else 0.0,
        units_per_s=units / seconds,
        ms_per_call=1000 * seconds / max(1, figures["calls"]),
        seconds=seconds,
    )
    if compiled is not None:
        figures["envs"] = len({c.servers[0] for c in conversations})
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--large-tasks", type=int, default=17, help="T of the large plan (9 envs x T x 2 states)")
    p.add_argument("--skip-large", action="store_true")
    p.add_argument("--compiled", type=Path, help="also a plan over this folder of compiled environments")
    p.add_argument("--compiled-apps", type=int, default=100, help="A of the compiled plan")
    p.add_argument("--compiled-tasks", type=int, default=2, help="T of the compiled plan")
    p.add_argument("--graph", type=Path, help="the compiled plan's tool graph (else built first)")
    p.add_argument("--skip-native", action="store_true", help="only the compiled plan")
    p.add_argument("--keep", type=Path, help="write the runs here (one folder per plan) instead of a temporary folder")
    a = p.parse_args()
    plans: dict[str, dict[str, Any]] = {}
    if not a.skip_native:
        plans["demo"] = {"T": 3, "S": 2, "D": 2, "seed": 0}
    if not a.skip_large and not a.skip_native:
        plans["large"] = {"T": a.large_tasks, "S": 2, "D": 2, "seed": 0, "A": 9}
    if a.compiled is not None:
        plans["compiled"] = {"T": a.compiled_tasks, "S": 1, "D": 2, "seed": 0, "A": a.compiled_apps}
    results: dict[str, dict[str, Any]] = {}
    for name, plan in plans.items():
        with tempfile.TemporaryDirectory(prefix=f"envfactory-quality-{name}-") as tmp:
            where = Path(tmp) if a.keep is None else a.keep.resolve() / name
            if name == "compiled":
                results[name] = run(plan, where, a.compiled.resolve(), a.graph.resolve() if a.graph else None)
            else:
                results[name] = run(plan, where)

    def pct(v: float) -> str:
        return f"{100 * v:.1f} %"

    rows: list[tuple[str, str, str, str, Any]] = [
        ("turns per conversation", f"{PAPER_TURNS_PER_CONVERSATION}", ">= 3", "turns_per_conversation", "{:.2f}"),
        ("calls per turn", f"{PAPER_STEPS_PER_TURN} (steps)", "", "calls_per_turn", "{:.2f}"),
        ("requests with an internal id", "", "<= 5 %", "requests_with_internal_id", pct),
        ("requests saying the user's own id", "", "", "requests_with_own_id", pct),
        ("id arguments in no earlier result", "0 (by construction)", "0", "incoherent_id_arguments", pct),
        ("empty results followed by more calls", "", "0", "empty_then_more", "{}"),
        ("canned answers", "", "0", "canned_answers", pct),
        ("answers telling a page token, an etag, a uuid", "", "0", "answers_telling_bookkeeping", pct),
        ("distinct answers / answers", "", "", "distinct_answers", "{:.2f}"),
        ("distinct-2 over requests (whole run)", "", "", "distinct_2_requests", "{:.2f}"),
        ("distinct-2 per 100 requests", "", ">= 0.5", "distinct_2_per_100", "{:.2f}"),
        ("keep-rate", "", ">= 80 %", "keep_rate", pct),
        ("units / s", "", "", "units_per_s", "{:.1f}"),
        ("ms per tool call (whole batch)", "", "not slower", "ms_per_call", "{:.1f}"),
    ]
    table = Table(title="offline data quality (no model), beside the EnvFactory paper's data")
    befores = {"before (demo)": BEFORE} | ({"before (compiled)": COMPILED_BEFORE} if "compiled" in results else {})
    for col in ("figure", "paper", "target", *befores, *(f"ours: {n}" for n in results)):
        table.add_column(col)
    for label, paper, target, key, fmt in rows:
        show = fmt if callable(fmt) else fmt.format
        then = ["" if (b := before.get(key)) is None else show(b) for before in befores.values()]
        table.add_row(label, paper, target, *then, *(show(r[key]) for r in results.values()))
    console = Console(width=170)
    console.print(table)
    for name, r in results.items():
        console.print(
            f"{name}: {r['units']} units, {r['conversations']} conversations, {r['turns']} turns, "
            f"{r['calls']} calls in {r['seconds']:.0f} s" + (f" over {r['envs']} environments" if "envs" in r else "")
        )


if __name__ == "__main__":
    main()
