"""`envfactory eval --suite bfcl-multi-turn-*`: a model plays BFCL entries on our environments.

The ground truth played by the scripted model is judged solved on every sampled entry of the four
categories (missed functions shown at their turn); a play that skips a turn's calls is judged as
`bfcl_eval`'s own checker judges the same decoded answer; the command runs end to end.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("bfcl_eval")

from envfactory.eval.agent import AgentLimits
from envfactory.eval.bfcl import SUITES, BFCLItem, bfcl_attempt, bfcl_items, play_entry
from envfactory.llm.scripted import ScriptedChatModel
from envfactory.suites.bfcl import available, parse_call
from envfactory.suites.bfcl.adapter import environment
from envfactory.suites.bfcl.entries import BFCLEntry, route
from envfactory.suites.bfcl.judge import judge_entry
from tests.support.paths import ROOT

pytestmark = pytest.mark.skipif(not available(), reason="bfcl-eval is not installed")


def scripted_truth(entry: BFCLEntry, skip_turn: int | None = None) -> list[Any]:
    """Per turn: the ground truth's calls in one reply (named arguments), then a short answer."""
    script: list[Any] = []
    for turn, calls in enumerate(entry.ground_truth):
        made = []
        for text in calls:
            call = parse_call(text)
            owner = route(call.name, entry.involved_classes)
            assert owner is not None
            made.append({"name": call.name, "args": environment(owner).call_arguments(call)})
        if made and turn != skip_turn:
            script.append({"tool_calls": made})
        script.append("Done.")
    return script


def _sample(suite: str, n: int) -> list[BFCLItem]:
    return random.Random(suite).sample(bfcl_items(suite), n)


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_the_ground_truth_played_by_the_model_solves_the_entries(suite: str) -> None:
    for item in _sample(suite, 6):
        record = bfcl_attempt(ScriptedChatModel(script=scripted_truth(item.entry)), item, 0, AgentLimits())
        assert record.success and record.error is None, (item.id, record.reasons)
        assert record.calls == record.chain_length


def test_a_skipped_turn_is_judged_as_bfcls_checker_judges_it() -> None:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    for n, item in enumerate(_sample("bfcl-multi-turn-base", 8)):
        entry = item.entry
        skip = max(i for i, calls in enumerate(entry.ground_truth) if calls)
        model = ScriptedChatModel(script=scripted_truth(entry, skip_turn=skip))
        answer, error, _ = play_entry(model, entry, AgentLimits())
        assert error is None and answer[skip] == []
        ours = judge_entry(entry, answer)
        test_entry = {
            "id": entry.id,
            "initial_config": entry.initial_config,
            "involved_classes": entry.involved_classes,
        }
        theirs = multi_turn_checker(answer, entry.ground_truth, test_entry, "multi_turn_base", f"eval_skip_{n}")
        assert not ours.valid and ours.valid == theirs["valid"] and ours.error_type == theirs["error_type"]


def test_the_suite_runs_from_the_command(tmp_path: Path) -> None:
    items = bfcl_items("bfcl-multi-turn-base")[:2]
    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump([r for item in items for r in scripted_truth(item.entry)]))
    env = {
        **os.environ,
        "ENVFACTORY_ROOT": str(ROOT),
        "ENVFACTORY_LLM_ROLES__EVAL__PROVIDER": "scripted",
        "ENVFACTORY_LLM_ROLES__EVAL__SCRIPT": str(script),
        "COLUMNS": "200",
    }
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "envfactory.cli",
        "eval",
        "--suite",
        "bfcl-multi-turn-base",
        "--out",
        str(out),
        "--limit",
        "2",
    ]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "pass@1" in res.stdout and '"success_rate": 1.0' in (out / "summary.json").read_text()
    bad = subprocess.run([*cmd[:5], "bfcl-nope", *cmd[6:]], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "unknown suite 'bfcl-nope'" in bad.stderr and bad.stderr.count("\n") == 1
