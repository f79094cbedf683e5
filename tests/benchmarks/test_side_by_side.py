"""benchmarks/side_by_side.py: figures pair by what they measure (two outputs that differ never pair), and what
stops a run is said in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from figures import Figure
from side_by_side import SideBySideError, paired


def _figure(measure: str, value: float) -> Figure:
    return Figure(path="offline synthesis", measure=measure, value=value, shown=str(value))


def test_figures_pair_by_path_and_measure() -> None:
    theirs = [_figure("units (output abc)", 40.0), _figure("imports", 1.0)]
    ours = [_figure("imports", 0.5), _figure("units (output abc)", 60.0)]
    assert paired(theirs, ours) == [
        ("offline synthesis: units (output abc)", 40.0, 60.0),
        ("offline synthesis: imports", 1.0, 0.5),
    ]


def test_two_outputs_that_differ_never_pair() -> None:
    with pytest.raises(SideBySideError, match="only one side gave"):
        paired([_figure("units (output abc)", 40.0)], [_figure("units (output def)", 60.0)])


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["no-such-ref", "--", "scale.py", "--per-core-only"], 1, "side_by_side: git rev-parse"),
        (["HEAD"], 2, "give a benchmark after --"),
        (["HEAD", "--", "no_such_script.py"], 2, "give a benchmark after --"),
    ],
)
def test_what_stops_a_run_is_one_line(argv: list[str], code: int, said: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "side_by_side.py"), *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    out = (done.stdout + done.stderr).strip()
    assert done.returncode == code and said in out, out
