"""The pool at scale: listing it, building an environment on first use, and memory, for 100/300/600 compiled
environments beside the native pool.

    python benchmarks/pool_scale.py --compiled DIR [--sizes 100,300,600] [--unbounded]

DIR is a folder of compiled environments (`envfactory corpus compile --out DIR`). For each size N the first
N of them by name are hard-linked (or copied) into a temporary folder, which joins the bundled pool (envs/,
BFCL's classes when installed) as `compiled_dir`, and a fresh process measures, in order:

- list: `names()` and every `entry()` (what `envs list` and the hub's `list_apps` show), and RSS after it;
- first use: `get()` of every environment once, in name order (each a build: median, 95th percentile,
  the slowest, the total), and RSS after touching all of them with the cache bound as configured
  (`pool_cache_envs`, `pool_cache_mb`) — with `--unbounded`, again with a bound larger than the pool;
- `envfactory envs list` and the hub's start (the server built and `list_apps` answered) as subprocesses.

Beside them: the pool before it loaded lazily (every environment built to list it, all kept), as measured
in the session before on this machine: 170 compiled environments, 11.8 s, 409 MB. Today's equivalent of that
eager listing is the "touch all" total (every environment built) and, with `--unbounded`, its memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
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
from envfactory.env.compiled import PLAN_FILE  # noqa: E402
from envfactory.env.pool import EnvPool  # noqa: E402
from envfactory.errors import EnvFactoryError  # noqa: E402

BEFORE = {"environments": 170, "list_s": 11.8, "rss_mb": 409.0}  # eager: every environment built to list it


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _subset(source: Path, n: int, into: Path) -> list[str]:
    """The first `n` compiled environments of `source` (by name) in `into`: hard links, else copies."""
    names = sorted(p.name for p in source.iterdir() if not p.name.startswith(".") and (p / PLAN_FILE).is_file())[:n]
    for name in names:
        try:
            shutil.copytree(source / name, into / name, copy_function=os.link)
        except OSError:
            shutil.rmtree(into / name, ignore_errors=True)
            shutil.copytree(source / name, into / name)
    return names


def child(compiled: Path, unbounded: bool) -> dict[str, Any]:
    """One measurement in this (fresh) process."""
    limits: dict[str, Any] = {"pool_cache_envs": 10**9, "pool_cache_mb": 10.0**9} if unbounded else {}
    settings = Settings(root=ROOT, compiled_dir=compiled, **limits)
    out: dict[str, Any] = {"rss_start_mb": _rss_mb()}
    t0 = time.perf_counter()
    pool = EnvPool(settings)
    names = pool.names()
    broken = 0
    for name in names:
        try:
            pool.entry(name)
        except EnvFactoryError:  # a broken one is counted, the listing goes on
            broken += 1
    out |= {"list_s": time.perf_counter() - t0, "listed": len(names), "broken": broken, "rss_list_mb": _rss_mb()}
    out["builds_listing"] = pool.stats().builds
    compiled_names = [n for n in names if pool.compiled(n)]
    times = []
    failed = 0
    for name in compiled_names:
        t = time.perf_counter()
        try:
            pool.get(name)
        except EnvFactoryError:
            failed += 1
            continue
        times.append(time.perf_counter() - t)
    times.sort()
    s = pool.stats()
    out |= {
        "compiled": len(compiled_names),
        "failed_builds": failed,
        "build_median_s": statistics.median(times) if times else 0.0,
        "build_p95_s": times[int(0.95 * (len(times) - 1))] if times else 0.0,
        "build_max_s": times[-1] if times else 0.0,
        "touch_all_s": sum(times),
        "rss_all_mb": _rss_mb(),
        "peak_mb": _peak_mb(),
        "resident": s.resident,
        "resident_mb": s.resident_bytes / 2**20,
        "evictions": s.evictions,
        "bound": f"{s.max_envs} envs / {s.max_bytes / 2**20:.0f} MB of files",
    }
    return out


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {res.stderr.strip()[-500:]}")
    return time.perf_counter() - t


HUB_START = """
import sys, time
from pathlib import Path
from envfactory.config import get_settings
from envfactory.env.pool import EnvPool
from envfactory.serve.hub_server import build_hub_server
server = build_hub_server(EnvPool(get_settings()))
print(len(server.hub.list_apps()))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compiled", type=Path, required=True, help="a folder of compiled environments")
    ap.add_argument("--sizes", default="100,300,600")
    ap.add_argument("--unbounded", action="store_true", help="also touch all with no cache bound")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-unbounded", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.child_unbounded)))
        return 0
    console = Console(width=200)
    rows: list[tuple[int, dict[str, Any], dict[str, Any] | None, float, float]] = []
    py = [sys.executable]
    for n in [int(x) for x in args.sizes.split(",")]:
        with tempfile.TemporaryDirectory(prefix="pool-scale-") as tmp:
            folder = Path(tmp) / "compiled"
            folder.mkdir()
            got = len(_subset(args.compiled, n, folder))
            env = {**os.environ, "PYTHONPATH": str(ROOT), "ENVFACTORY_COMPILED_DIR": str(folder), "COLUMNS": "200"}

            def measure(*extra: str, env: dict[str, str] = env, folder: Path = folder) -> dict[str, Any]:
                cmd = [*py, __file__, "--compiled", str(args.compiled), "--child", str(folder), *extra]
                res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
                if res.returncode != 0:
                    raise SystemExit(res.stderr[-2000:])
                return dict(json.loads(res.stdout.strip().splitlines()[-1]))

            bounded = measure()
            unbounded = measure("--child-unbounded") if args.unbounded else None
            cli = _timed([*py, "-m", "envfactory.cli", "envs", "list"], env)
            hub = _timed([*py, "-c", HUB_START], env)
            rows.append((got, bounded, unbounded, cli, hub))
            console.print(f"{got} compiled: done", highlight=False)

    table = Table(title="The pool at scale (native pool + N compiled environments)")
    table.add_column("")
    table.add_column(f"before: eager, {BEFORE['environments']} compiled", justify="right")
    for got, *_ in rows:
        table.add_column(f"{got} compiled", justify="right")

    def row(label: str, before: str, cell: Any) -> None:
        table.add_row(label, before, *[cell(r) for r in rows])

    row("listed (native + BFCL + compiled)", "", lambda r: f"{r[1]['listed']}")
    row("list: names + every entry", f"{BEFORE['list_s']} s", lambda r: f"{r[1]['list_s']:.2f} s")
    row("  environments built to list", "all", lambda r: f"{r[1]['builds_listing']} (BFCL's)")
    row("  RSS after listing", f"{BEFORE['rss_mb']:.0f} MB", lambda r: f"{r[1]['rss_list_mb']:.0f} MB")
    row("`envfactory envs list` (process)", "", lambda r: f"{r[3]:.1f} s")
    row("hub start + list_apps (process)", "", lambda r: f"{r[4]:.1f} s")
    row("first use: build, median", "", lambda r: f"{r[1]['build_median_s'] * 1000:.0f} ms")
    row("first use: build, p95 / slowest", "", lambda r: f"{r[1]['build_p95_s']:.2f} / {r[1]['build_max_s']:.1f} s")
    row("touch all compiled: total", "", lambda r: f"{r[1]['touch_all_s']:.0f} s")
    row("  RSS after touching all (bounded)", "", lambda r: f"{r[1]['rss_all_mb']:.0f} MB")
    row("  peak RSS (bounded)", "", lambda r: f"{r[1]['peak_mb']:.0f} MB")
    row("  kept built / evicted", "", lambda r: f"{r[1]['resident']} / {r[1]['evictions']}")
    row("  bound", "", lambda r: r[1]["bound"])
    if args.unbounded:
        row("  RSS after touching all, unbounded", "", lambda r: f"{r[2]['rss_all_mb']:.0f} MB" if r[2] else "")
    console.print(table)
    console.print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
