"""A benchmark's figures for another commit and this tree, measured at the same time, one core each.

    python benchmarks/side_by_side.py REF [--rounds 2] -- scale.py --per-core-only

This machine's speed moves by tens of per cent within minutes (issue 29's notes), so a figure measured after
another, even alternating, is not comparable with it; two processes running together see the same machine. REF
is checked out in a temporary worktree (`git worktree add --detach`, removed afterwards); each side runs
`python benchmarks/SCRIPT ARGS --json OUT` from its own tree (the scripts put their own tree first on the
import path), pinned to a core of its own with `taskset`, and the two swap cores every run. Prints each figure
of every run, both sides and their ratio, and the mean ratio. For in-process benchmarks (`reward.py`,
`scale.py --per-core-only`): servers that a benchmark starts import the installed package, not REF's. Needs two
cores, `git` and `taskset`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from figures import Figure, read_figures
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


class SideBySideError(Exception):
    """What stops a side-by-side run, said in one line."""


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SideBySideError(f"git {' '.join(args)}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return done.stdout.strip()


def _cores() -> tuple[int, int]:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) < 2 or shutil.which("taskset") is None:
        raise SideBySideError("needs two cores this process may use and `taskset` (util-linux)")
    return cores[-2], cores[-1]


def _start(tree: Path, core: int, script: list[str], out: Path) -> subprocess.Popen[str]:
    command = ["taskset", "-c", str(core), sys.executable, str(tree / "benchmarks" / script[0]), *script[1:]]
    return subprocess.Popen(
        [*command, "--json", str(out)], cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _finish(side: str, proc: subprocess.Popen[str], out: Path) -> list[Figure]:
    _, err = proc.communicate()
    if proc.returncode != 0 or not out.is_file():
        tail = (err.strip().splitlines() or ["no output"])[-1]
        raise SideBySideError(f"{side}: the benchmark failed (exit {proc.returncode}): {tail}")
    return read_figures(out)


def paired(theirs: list[Figure], ours: list[Figure]) -> list[tuple[str, float, float]]:
    """(figure, REF's value, this tree's value) for the figures both sides gave with the same path and measure (a
    measure that names its output's digest pairs only when both outputs are the same); an unpaired figure is a
    `SideBySideError`, so that two outputs that differ are never compared as one."""
    key = {(f.path, f.measure): f.value for f in ours}
    alone = [f"{f.path}: {f.measure}" for f in theirs if (f.path, f.measure) not in key]
    alone += [
        f"{f.path}: {f.measure}" for f in ours if (f.path, f.measure) not in {(g.path, g.measure) for g in theirs}
    ]
    if alone:
        raise SideBySideError(f"figures only one side gave (a different output?): {'; '.join(alone)}")
    return [(f"{f.path}: {f.measure}", f.value, key[(f.path, f.measure)]) for f in theirs]


def side_by_side(
    ref: str, script: list[str], rounds: int, console: Console
) -> list[tuple[str, list[float], list[float]]]:
    """(figure, REF's values, this tree's values) over `rounds` × 2 runs, the cores swapped every run."""
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    first, second = _cores()
    values: dict[str, tuple[list[float], list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "other"
        _git("worktree", "add", "--detach", str(other), commit)
        try:
            for run in range(rounds * 2):
                cores = (first, second) if run % 2 == 0 else (second, first)
                outs = Path(tmp) / f"{run}-ref.json", Path(tmp) / f"{run}-here.json"
                console.print(f"run {run + 1}/{rounds * 2}: {ref} on core {cores[0]}, this tree on core {cores[1]}")
                procs = _start(other, cores[0], script, outs[0]), _start(ROOT, cores[1], script, outs[1])
                theirs, ours = _finish(ref, procs[0], outs[0]), _finish("this tree", procs[1], outs[1])
                for name, a, b in paired(theirs, ours):
                    got = values.setdefault(name, ([], []))
                    got[0].append(a)
                    got[1].append(b)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, capture_output=True)
    return [(name, a, b) for name, (a, b) in values.items()]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], usage="%(prog)s REF [--rounds N] -- SCRIPT [ARGS]"
    )
    parser.add_argument("ref", help="the commit to measure beside this tree (a hash, a branch, HEAD~3)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of two runs, the cores swapped between them")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    script = argv[cut + 1 :]  # a benchmark of benchmarks/ that takes --json, and its arguments
    if not script or not (HERE / script[0]).is_file() or args.rounds < 1:
        parser.error("give a benchmark after --, e.g. `-- scale.py --per-core-only`, and --rounds of at least 1")
    console = Console()
    try:
        results = side_by_side(args.ref, script, args.rounds, console)
    except SideBySideError as e:
        console.print(f"side_by_side: {e}", highlight=False)
        raise SystemExit(1) from None
    table = Table(title=f"{' '.join(script)}: {args.ref} and this tree at the same time, one core each")
    for col in ("figure", args.ref, "this tree", "this / ref", "mean ratio"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for name, theirs, ours in results:
        ratios = [b / a for a, b in zip(theirs, ours, strict=True) if a]
        mean = f"{statistics.mean(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else "-"
        table.add_row(
            name,
            " ".join(f"{v:,.4g}" for v in theirs),
            " ".join(f"{v:,.4g}" for v in ours),
            " ".join(f"{r:.2f}" for r in ratios),
            mean,
        )
    console.print(table)


if __name__ == "__main__":
    main()
