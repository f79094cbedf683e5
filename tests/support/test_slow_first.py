"""The suite's ordering plugin (tests/support/slow_first.py): slowest files first, each file's tests together,
in order."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.slow_first import RECORD, slowest_first


@dataclass
class FakeItem:  # only `nodeid` is read
    nodeid: str


def test_files_go_slowest_first_and_keep_their_tests_together_in_order() -> None:
    rng = random.Random(7)
    for _ in range(200):
        files = [f"tests/test_{i}.py" for i in range(rng.randint(1, 8))]
        items = [FakeItem(f"{rng.choice(files)}::t{n}") for n in range(rng.randint(0, 40))]
        seconds = {f: float(rng.randint(0, 3)) for f in files if rng.random() < 0.7}
        out = slowest_first(items, seconds)  # type: ignore[arg-type]
        assert sorted(map(id, out)) == sorted(map(id, items))  # the same items, none lost or doubled
        order = [i.nodeid.split("::")[0] for i in out]
        runs = [f for n, f in enumerate(order) if n == 0 or order[n - 1] != f]
        assert len(runs) == len(set(runs))  # each file's tests are contiguous
        assert [seconds.get(f, 0.0) for f in runs] == sorted((seconds.get(f, 0.0) for f in runs), reverse=True)
        for f in runs:  # within a file, pytest's order
            mine = f + "::"
            assert [i for i in out if i.nodeid.startswith(mine)] == [i for i in items if i.nodeid.startswith(mine)]
        first_seen = list(dict.fromkeys(i.nodeid.split("::")[0] for i in items))
        for a, b in itertools.pairwise(runs):  # ties keep pytest's order
            if seconds.get(a, 0.0) == seconds.get(b, 0.0):
                assert first_seen.index(a) < first_seen.index(b)


def test_a_run_records_file_seconds_and_the_next_run_uses_them(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.support.slow_first"]\n')
    (tmp_path / "test_fast.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_b():\n    time.sleep(0.3)\n")

    def run() -> list[str]:
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-v",
                "-p",
                "no:randomly",
                "-p",
                "no:xdist",
                "-p",
                "no:cacheprovider",
                str(tmp_path),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            timeout=120,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        return [line.split("::")[0] for line in res.stdout.splitlines() if "::test_" in line and "PASSED" in line]

    assert run() == ["test_fast.py", "test_slow.py"]  # no record yet: pytest's order
    assert "test_slow.py" in (tmp_path / RECORD).read_text()
    assert run() == ["test_slow.py", "test_fast.py"]  # the slow file now goes first
    (tmp_path / "test_slow.py").rename(tmp_path / "test_renamed.py")  # a moved file: its old key goes
    assert run() == ["test_fast.py", "test_renamed.py"]
    assert set(json.loads((tmp_path / RECORD).read_text())) == {"test_fast.py", "test_renamed.py"}
