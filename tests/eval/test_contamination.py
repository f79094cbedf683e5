"""`envfactory contamination RUN --against bfcl`: planted copies of BFCL's questions are found, clean data is not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("bfcl_eval")

from envfactory.config import Settings
from envfactory.eval.contamination import check, ngrams, words
from envfactory.suites.bfcl.entries import load_entries
from envfactory.tasks.plan import SynthConfig, load_conversations
from envfactory.tasks.run import run_batch
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("contamination") / "run"
    settings = Settings(root=ROOT, bfcl=False, data_dir=tmp_path_factory.mktemp("data"))
    run_batch(SynthConfig.model_validate({"envs": ["hotels", "banking"], "T": 1, "out": out, "plot": False}), settings)
    return out


def test_clean_data_shows_no_copied_request(run: Path) -> None:
    report = check(load_conversations(run))
    assert report.requests > 0 and report.benchmark_requests > 1000
    assert report.exact_matches == 0 and report.requests_with_shared_ngram == 0


def test_planted_copies_are_found(run: Path) -> None:
    conversations = load_conversations(run)
    question = str(load_entries("multi_turn_base")[7].question[0][0]["content"])
    copied, embedded = conversations[0].model_copy(deep=True), conversations[0].model_copy(deep=True)
    copied.nodes[0].query = question.upper() + "  "  # normalization: case and spacing do not hide a copy
    embedded.nodes[0].query = "Before anything else: " + " ".join(words(question)[:9]) + " and then stop."
    report = check([*conversations, copied, embedded])
    assert report.exact_matches == 1 and report.requests_with_shared_ngram == 2
    assert report.max_ngram_share == 1.0 and any(question.upper() in e for e in report.examples)
    assert ngrams(["a", "b", "c"], 2) == {("a", "b"), ("b", "c")}


def test_the_command(run: Path, tmp_path: Path) -> None:
    """The table counts every shared argument value (it showed the 50 the report lists: "50 of 64" for 60 shared),
    and a --json in a folder that does not exist yet is written there (the folder was checked, then not made)."""
    import json

    from envfactory.eval.contamination import _bfcl_texts

    _, _, values = _bfcl_texts()
    planted = sorted(v for v in values if len(v) >= 6)[:60]
    row = json.loads((run / "conversations.jsonl").read_text().splitlines()[0])
    row["nodes"][0]["raw_tool_call"][0]["arguments"]["extra"] = planted
    data = tmp_path / "planted.jsonl"
    data.write_text(json.dumps(row) + "\n")
    env = {**os.environ, "ENVFACTORY_ROOT": str(ROOT), "COLUMNS": "200"}
    report = tmp_path / "new" / "report.json"
    cmd = [sys.executable, "-m", "envfactory.cli", "contamination", str(data), "--json", str(report)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "exact matches" in res.stdout, res.stderr
    written = json.loads(report.read_text())
    assert written["shared_argument_count"] >= 60 and len(written["shared_argument_values"]) == 50
    shown = next(line for line in res.stdout.splitlines() if "argument values in BFCL's calls" in line)
    assert f"{written['shared_argument_count']} of {written['argument_values']}" in shown
    assert f"{written['benchmark_distinct']:,} distinct" in res.stdout
    assert written["benchmark_distinct"] < written["benchmark_requests"]
    cmd = [sys.executable, "-m", "envfactory.cli", "contamination", str(run)]
    bad = subprocess.run([*cmd, "--against", "tau2"], env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "only 'bfcl' is known" in bad.stderr and bad.stderr.count("\n") == 1
