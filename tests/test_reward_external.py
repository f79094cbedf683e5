"""The reward on an external suite: every BFCL multi_turn_base turn, as an RL record built from dumps the
way the export builds one (initial and final configs are dumps; the reward forks sessions from them),
scores its own ground truth 1.0 — R_traj 1 and R_state 1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.env.session import Session
from envfactory.export import catalog_from_pool, convert_to_rl_data
from envfactory.reward import CompositeReward
from envfactory.suites import bfcl
from envfactory.tasks.plan import SynthConfig, load_conversations
from envfactory.tasks.run import run_batch

ROOT = Path(__file__).resolve().parent.parent
ENTRIES = bfcl.load_entries("multi_turn_base") if bfcl.available() else []


def hermes(calls: list[tuple[str, dict[str, object]]]) -> str:
    return "".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>\n" for n, a in calls)


@pytest.mark.skipif(not ENTRIES, reason="bfcl-eval is not installed")
def test_every_bfcl_turn_scores_its_own_ground_truth_one() -> None:
    pool = EnvPool(Settings(root=ROOT, bfcl=True))
    scorer = CompositeReward(pool)
    scored = 0
    for entry in ENTRIES:
        classes = [c for c in entry.involved_classes if bfcl.class_importable(c)]
        sessions = {c: Session.fork(bfcl.environment(c), entry.config_for(c)) for c in classes}
        names = {c: bfcl.environment(c).name for c in classes}
        for turn_no, turn in enumerate(entry.ground_truth):
            initial = {names[c]: s.dump() for c, s in sessions.items()}
            calls = []
            for text in turn:
                call = bfcl.parse_call(text)
                owner = bfcl.route(call.name, entry.involved_classes)
                if owner not in sessions:
                    continue
                args = sessions[owner].env.call_arguments(call)
                sessions[owner].call(call.name, args)
                calls.append((names[owner], call.name, args))
            if not calls:
                continue
            final = {names[c]: s.dump() for c, s in sessions.items()}
            record = {
                "ground_truth": json.dumps([{"name": n, "arguments": a} for _, n, a in calls]),
                "initial_config": json.dumps(initial),
                "final_config": json.dumps(final),
                "mcp_servers": json.dumps(list(initial)),
            }
            result = scorer.score(hermes([(n, a) for _, n, a in calls]), **record)
            where = f"{entry.id} turn {turn_no}: {result.reasons}"
            assert (result.r_traj, result.r_state, result.reward) == (1.0, 1.0, 1.0), where
            scored += 1
    assert scored > 500


def test_every_native_turn_of_a_306_unit_run_scores_its_own_ground_truth_one(tmp_path: Path) -> None:
    """The same promise on our own data: an offline synth run over every native environment (9 × T=17 × S=2
    × D=2 = 306 units), each turn exported as an RL record by the exporter, scores its ground truth 1.0 —
    and a completion missing the turn's last call does not."""
    settings = Settings(root=ROOT, bfcl=False)
    out = tmp_path / "run"
    config = SynthConfig.model_validate({"T": 17, "S": 2, "D": 2, "A": 9, "seed": 0, "out": out, "plot": False})
    with open(os.devnull, "w") as devnull:
        run_batch(config, settings, console=Console(file=devnull))
    conversations = load_conversations(out)
    pool = EnvPool(settings)
    scorer = CompositeReward(pool)
    scored: dict[str, int] = {}
    for conv in conversations:
        for sample in convert_to_rl_data(conv, catalog_from_pool(pool, conv.servers)):
            truth = json.loads(sample.reward_model.ground_truth)
            kwargs = sample.extra_info.mcp_factory_kwargs
            record = (sample.reward_model.ground_truth, kwargs.initial_config, kwargs.final_config, kwargs.mcp_servers)
            calls = [(c["name"], c["arguments"]) for c in truth]
            result = scorer.score(hermes(calls), *record)
            assert (result.r_traj, result.r_state, result.reward) == (1.0, 1.0, 1.0), (conv.id, result.reasons)
            if len(calls) > 1:
                assert scorer.score(hermes(calls[:-1]), *record).r_traj < 1.0, conv.id
            for server in json.loads(kwargs.mcp_servers):
                scored[server] = scored.get(server, 0) + 1
    assert set(scored) == set(EnvPool(settings).names())  # every native environment
    assert sum(scored.values()) > 1000
