"""Evaluation harness overhead: attempts/s with the scripted model (no model time), and what the harness
adds to each attempt beside a bare in-process replay of the same calls.

    python benchmarks/eval.py [--turns 40] [--repeats 3]

The items are the verified turns of a small offline synth run (hotels, banking, shop, restaurants).
The model is a stand-in that answers each turn with its ground truth (its calls in one step, then an
answer: what the scripted model does in the tests, keyed by the turn so that concurrent attempts get
their own turn's calls), so the model costs ~0 and every second measured is the harness's: building
the toolset and the episode, binding tools, running the calls, the verifier, the ground-truth replay
for the results check, the composite reward, and writing one fsync'ed JSONL line per attempt. The
baseline is `replay()` of the same calls from the same state (what any harness must at least do).
The target: the harness adds < 5 % to an attempt whose model steps take 1 s each (two per attempt).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envfactory.config import Settings  # noqa: E402
from envfactory.env.pool import EnvPool  # noqa: E402
from envfactory.eval.agent import AgentLimits  # noqa: E402
from envfactory.eval.items import EvalItem, items_from_conversations, load_conversations  # noqa: E402
from envfactory.eval.run import EvalSettings, run_eval, turn_runner  # noqa: E402
from envfactory.records.episode import replay  # noqa: E402
from envfactory.records.models import ToolCall  # noqa: E402
from envfactory.tasks.plan import SynthConfig  # noqa: E402
from envfactory.tasks.run import run_batch  # noqa: E402
from tests.eval_helpers import GroundTruthModels  # noqa: E402

MODEL_STEP_S = 1.0  # the model step the overhead is compared with
TARGET = 0.05


def _items(tmp: Path, n: int) -> tuple[list[EvalItem], EnvPool]:
    settings = Settings(root=ROOT, bfcl=False, data_dir=tmp / "data")
    config = {"envs": ["hotels", "banking", "shop", "restaurants"], "T": 3, "S": 1, "D": 1, "seed": 1, "plot": False}
    run_batch(SynthConfig.model_validate({**config, "out": tmp / "run"}), settings)
    pool = EnvPool(settings)
    items = items_from_conversations(load_conversations(tmp / "run"), pool)
    return [i for i in items if i.ground_truth][:n], pool


def _harness(items: list[EvalItem], pool: EnvPool, concurrency: int, tmp: Path) -> float:
    """Seconds for one attempt at every item through `run_eval` (fresh output folder)."""
    out = Path(tempfile.mkdtemp(dir=tmp))
    start = time.perf_counter()
    runner = turn_runner(pool, AgentLimits())
    summary = run_eval(items, GroundTruthModels(items), runner, out, EvalSettings(concurrency=concurrency))
    elapsed = time.perf_counter() - start
    if summary.success_rate != 1.0:
        raise SystemExit(f"the ground truth should solve every turn, got {summary.success_rate:.2f}")
    return elapsed


def _bare(items: list[EvalItem], pool: EnvPool) -> float:
    start = time.perf_counter()
    for item in items:
        calls = [ToolCall(server=c.server, name=c.tool, arguments=c.arguments) for c in item.ground_truth]
        replay(pool, calls, item.initial, item.servers)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        items, pool = _items(tmp, args.turns)
        n = len(items)
        bare = statistics.median(_bare(items, pool) for _ in range(args.repeats)) / n
        table = Table(
            "concurrency",
            "attempts/s",
            "ms/attempt",
            "bare replay ms",
            "harness ms",
            "of 2 × 1 s steps",
            "< 5 %",
            title=f"eval harness, stand-in model, {n} verified turns (median of {args.repeats})",
        )
        for concurrency in (1, 4, 16):
            per = statistics.median(_harness(items, pool, concurrency, tmp) for _ in range(args.repeats)) / n
            overhead = per - bare
            share = overhead / (2 * MODEL_STEP_S)
            table.add_row(
                str(concurrency),
                f"{1 / per:,.0f}",
                f"{per * 1000:.1f}",
                f"{bare * 1000:.2f}",
                f"{overhead * 1000:.1f}",
                f"{share:.2%}",
                "yes" if share < TARGET else "no",
            )
        console.print(table)


if __name__ == "__main__":
    main()
