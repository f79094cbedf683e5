"""Corpus benchmark: how many healthy environments and tools the real API corpus compiles into, and how fast.

    python benchmarks/corpus.py [--out DIR] [--limit N | --every K] [--processes 2] [--executor local|ray]
                                [--ray-address ADDR] [--report-only]

Compiles the fetched corpus (`envfactory corpus fetch` first) with `envfactory.compiler` — no model —
into `--out` (resumable: specs already reported are not compiled again; `--report-only` only reads the
report), then prints the funnel (specs → compiled → with scenarios → healthy → usable for chains: a write
tool and a dependency between tools), the tools, the time, the reasons operations were left out, and the
pools the systems our users compare us with train on, as published (all written by large LLMs), beside.
It also loads the healthy pool lazily and times listing it and loading every environment.

Time is measured two ways: the run's wall clock, and the CPU seconds of each spec's unit (compile,
scenarios, the health gate), which do not depend on what else the machine runs. The target — the whole
corpus in 20 minutes on 2 cores — is 2 × 20 × 60 / 2,639 ≈ 0.91 CPU-seconds a spec on average; `--every K`
compiles a fixed sample (every K-th spec by id) and extrapolates to the whole corpus.
"""

from __future__ import annotations

import argparse
import collections
import os
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
from envfactory.errors import EnvFactoryError
from envfactory.executor import Executor, ExecutorSettings, ProcessExecutor, make_executor

PUBLISHED = [  # (system, environments, tools) as their papers report them
    ("EnvFactory paper", "85", "842"),
    ("SynthAPI", "64 apps", "10,472"),
    ("EnvScaler", "191", "—"),
    ("Agent World Model", "1,000", "~35 each"),
    ("Agent-World", "1,978", "19,822"),
]
TARGETS = {"healthy": 500, "tools": 10_000, "minutes": 20, "cores": 2}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="default <data dir>/compiled")
    ap.add_argument("--limit", type=int, default=None, help="only the first N specs")
    ap.add_argument("--every", type=int, default=None, help="a fixed sample: every K-th spec by id")
    ap.add_argument("--processes", type=int, default=2, help="worker processes (with ray: workers)")
    ap.add_argument("--executor", choices=["local", "ray"], default="local")
    ap.add_argument("--ray-address", default=None, help="a Ray cluster to join (default: a local instance)")
    ap.add_argument("--report-only", action="store_true", help="read an earlier run's report, compile nothing")
    args = ap.parse_args()
    console = Console()
    settings = get_settings()
    out = args.out or settings.data_path / "compiled"
    corpus = corpus_jobs(Corpus(settings))
    jobs = corpus[:: args.every] if args.every else corpus
    jobs = jobs[: args.limit] if args.limit else jobs
    load_before = os.getloadavg()
    started = time.monotonic()
    ran = 0
    if not args.report_only:
        executor: Executor = (
            ProcessExecutor(args.processes, unit_timeout=300)
            if args.executor == "local"
            else make_executor(ExecutorSettings(kind="ray", address=args.ray_address, workers=args.processes))
        )
        try:
            for ran, _ in enumerate(build_many(jobs, out, BuildSettings(), executor), 1):
                if ran % 100 == 0:
                    console.print(f"{ran} specs, {time.monotonic() - started:.0f} s")
        except EnvFactoryError as e:  # a folder another build made, or one being written
            raise SystemExit(f"error: {e}") from None
    wall = time.monotonic() - started
    load_after = os.getloadavg()
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
    cpu = sum(r.cpu_seconds for r in reports)
    per_spec = cpu / max(1, len(reports))
    budget = TARGETS["cores"] * TARGETS["minutes"] * 60 / len(corpus)  # CPU seconds a spec may take on average
    times = Table("what", "measured", "target", title=f"Time ({TARGETS['cores']} cores, {len(reports):,} specs)")
    times.add_row(
        "CPU seconds a spec (compile, scenarios, the gate)", f"{per_spec:.2f} s", f"≤ {budget:.2f} s"
    )  # fmt: skip
    times.add_row(
        f"the whole corpus ({len(corpus):,} specs) at that rate, {TARGETS['cores']} processes",
        f"{per_spec * len(corpus) / TARGETS['cores'] / 60:.1f} min",
        f"≤ {TARGETS['minutes']} min",
    )
    if not args.report_only and ran:
        times.add_row(
            f"this run's wall clock ({ran:,} specs, {args.executor}, {args.processes} workers)",
            f"{wall / 60:.1f} min ({wall / ran:.2f} s a spec)",
            f"≤ {TARGETS['minutes'] * 60 / len(corpus):.2f} s a spec",
        )
        times.add_row("load average before → after (1 min)", f"{load_before[0]:.1f} → {load_after[0]:.1f}", "")
    slowest = sorted(reports, key=lambda r: -r.cpu_seconds)[:3]
    times.add_row("slowest specs", ", ".join(f"{r.spec_id} {r.cpu_seconds:.1f} s" for r in slowest), "")
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
