"""benchmarks/summary.py: the table of docs/performance.md is rebuilt from the figures the benchmarks write
(`--json`), replacing only its own block."""

from __future__ import annotations

import ast
import datetime
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import summary
from figures import Figure, read_figures, write_figures

REWARD = Figure(
    path="reward",
    measure="composite reward",
    value=5676.0,
    shown="5,676 /s (8.1× naive)",
    beside="naive: 701 /s",
    target=">= 10,000 /s",
    met=False,
)


def test_figures_round_trip_and_refuse_unknown_fields(tmp_path: Path) -> None:
    out = tmp_path / "f.json"
    write_figures(out, [REWARD])
    assert read_figures(out) == [REWARD]
    out.write_text('[{"path": "x", "measure": "y", "value": 1, "shown": "1", "oops": 2}]')
    with pytest.raises(ValueError, match="oops"):
        read_figures(out)
    write_figures(None, [REWARD])  # no path: nothing written, no error


def test_the_block_is_replaced_and_the_rest_kept(tmp_path: Path) -> None:
    doc = tmp_path / "performance.md"
    doc.write_text("# Benchmarks\n\nintro\n\n## Later\n\ntext\n")
    when = datetime.datetime(2026, 12, 6, 6, 0, tzinfo=datetime.UTC)
    summary.write(doc, summary.markdown([REWARD], [], when, (1.0, 1.0, 1.0)))
    first = doc.read_text()
    assert first.startswith("# Benchmarks\n\n" + summary.START) and first.endswith("intro\n\n## Later\n\ntext\n")
    assert "| reward | composite reward | 5,676 /s (8.1× naive) | naive: 701 /s | >= 10,000 /s | **no** |" in first
    slower = REWARD.model_copy(update={"shown": "4,000 /s"})
    summary.write(doc, summary.markdown([slower], ["trainer client: exit 1: boom"], when, (2.0, 1.0, 1.0)))
    second = doc.read_text()
    assert second.count(summary.START) == 1 and second.count(summary.END) == 1
    assert "4,000 /s" in second and "5,676" not in second and "| (failed) | trainer client: exit 1: boom |" in second
    assert second.split(summary.END, 1)[1] == first.split(summary.END, 1)[1]  # the hand-written text after it kept


def test_every_benchmark_the_summary_runs_takes_json() -> None:
    """Each script the summary runs declares `--json` (add_json_flag) and writes its figures."""
    scripts = {Path(arg).name for _, command in summary.runs(False, False) for arg in command if arg.endswith(".py")}
    assert scripts == {"reward.py", "scale.py", "sessions.py", "toolgraph.py"}
    for name in scripts:
        calls = {
            node.func.id
            for node in ast.walk(ast.parse((ROOT / "benchmarks" / name).read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
        assert {"add_json_flag", "write_figures"} <= calls, name


def test_the_doc_holds_the_block() -> None:
    text = (ROOT / "docs" / "performance.md").read_text()
    assert text.count(summary.START) == 1 and text.count(summary.END) == 1
