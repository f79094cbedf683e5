"""Corpus benchmark: how many healthy environments and tools the real API corpus compiles into, and how fast.

    python benchmarks/corpus.py [--out DIR] [--limit N] [--processes 2] [--report-only]

Compiles the fetched corpus (`envfactory corpus fetch` first) with `envfactory.compiler` — no model —
into `--out` (resumable: specs already reported are not compiled again; `--report-only` only reads the
report), then prints the funnel (specs → compiled → with scenarios → healthy → usable for chains: a write
tool and a dependency between tools), the tools, the time, the reasons operations were left out, and the
pools the systems our users compare us with train on, as published (all written by large LLMs), beside.
It also loads the healthy pool lazily and times listing it and loading every environment.
"""

from __future__ import annotations

import argparse
import collections
import resource
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from envfactory.compiler.build import BuildSettings, build_many, corpus_jobs, read_reports, yield_of
from envfactory.config import Settings, get_settings
from envfactory.corpus import Corpus
from envfactory.env.pool import EnvPool
from envfactory.executor import ProcessExecutor

PUBLISHED = [  # (system, environments, tools) as their papers report them
    ("EnvFactory paper", "85", "842"),
    ("SynthAPI", "64 apps", "10,472"),
    ("EnvScaler", "191", "—"),
    ("Agent World Model", "1,000", "~35 each"),
    ("Agent-World", "1,978", "19,822"),
]
TARGETS = {"healthy": 500, "tools": 10_000, "minutes": 20}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="default <data dir>/compiled")
    ap.add_argument("--limit", type=int, default=None, help="only the first N specs")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--report-only", action="store_true", help="read an earlier run's report, compile nothing")
    args = ap.parse_args()
    console = Console()
    settings = get_settings()
    out = args.out or settings.data_path / "compiled"
    jobs = corpus_jobs(Corpus(settings))
    jobs = jobs[: args.limit] if args.limit else jobs
    started = time.monotonic()
    if not args.report_only:
        for i, _ in enumerate(build_many(jobs, out, BuildSettings(), ProcessExecutor(args.processes)), 1):
            if i % 100 == 0:
                console.print(f"{i} specs, {time.monotonic() - started:.0f} s")
    wall = time.monotonic() - started
    wanted = {j.spec_id for j in jobs}
    reports = [r for r in read_reports(out) if r.spec_id in wanted]
    y = yield_of(reports)

    funnel = Table("stage", "specs / environments", "tools", title="The corpus, compiled (no model)")
    funnel.add_row("specs in the corpus", f"{y.specs:,}", "")
    funnel.add_row("compiled (reads and writes)", f"{y.compiled:,}", f"{y.tools_compiled:,}")
    funnel.add_row("with scenarios", f"{y.with_scenarios:,}", "")
    funnel.add_row("healthy (every envs health dimension)", f"{y.healthy:,}", f"{y.tools_healthy:,}")
    funnel.add_row("usable for chains", f"{y.usable:,}", "")
    funnel.add_row(
        "target", f"≥ {TARGETS['healthy']} healthy", f"≥ {TARGETS['tools']:,}"
    )  # fmt: skip
    console.print(funnel)
    times = Table("what", "measured", "target", title="Time (2 cores)")
    times.add_row("this run's wall clock", f"{wall / 60:.1f} min" if not args.report_only else "(report only)", "")
    times.add_row(
        "CPU time over all specs (sum of units)", f"{y.seconds / 60:.1f} min", f"≤ {TARGETS['minutes']} min wall"
    )
    console.print(times)
    if y.failing:
        console.print("unhealthy, by failing dimension: " + ", ".join(f"{k} {v}" for k, v in sorted(y.failing.items())))
    statuses = collections.Counter(r.status for r in reports)
    console.print("specs by outcome: " + ", ".join(f"{k} {v}" for k, v in statuses.most_common()))
    reasons: collections.Counter[str] = collections.Counter()
    for r in reports:
        reasons.update(r.skip_reasons)
    left = Table("operations left out, why", "count", title="Never a tool that pretends")
    for reason, n in reasons.most_common(8):
        left.add_row(reason, f"{n:,}")
    console.print(left)
    peers = Table("system", "environments", "tools", title="Published pools (LLM-written)")
    for row in PUBLISHED:
        peers.add_row(*row)
    peers.add_row("EnvFactory here (compiled, healthy)", f"{y.healthy:,}", f"{y.tools_healthy:,}")
    console.print(peers)

    t0 = time.monotonic()
    pool = EnvPool(Settings(root=out, envs_dir=out / ".none", compiled_dir=out, bfcl=False))
    names = pool.native_names()
    listed = time.monotonic() - t0
    t1 = time.monotonic()
    for name in names:
        pool.get(name)
    loaded = time.monotonic() - t1
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lazy = Table("pool of compiled environments", "measured", title="Loading lazily")
    lazy.add_row("environments", f"{len(names):,}")
    lazy.add_row("list them", f"{listed:.2f} s")
    lazy.add_row("load every one", f"{loaded:.1f} s")
    lazy.add_row("peak RSS of this process", f"{rss:.0f} MB")
    console.print(lazy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
