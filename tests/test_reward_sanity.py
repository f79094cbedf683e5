"""The demo's last stage on a real offline run: every export format written, and the reward sanity order
(ground truth 1.0 > redundant call > wrong argument > empty) on completions made from real RL records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from envfactory.cli.demo import export_demo
from envfactory.cli.reward_sanity import KINDS, completions, reward_sanity
from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.export import FORMATS, convert_to_rl_data
from envfactory.export.tools_schema import catalog_for
from envfactory.reward import CompositeReward
from envfactory.tasks.plan import SynthConfig, load_conversations
from envfactory.tasks.run import run_batch
from envfactory.toolgraph import ToolGraph, save_graph

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, graph: ToolGraph) -> Settings:
    """A data dir holding an offline demo run (the demo's own layout), made as `envfactory demo` makes it."""
    data = tmp_path_factory.mktemp("sanity-data")
    settings = Settings(root=ROOT, data_dir=data)
    graph_file = save_graph(graph, data / "graph.json")
    config = SynthConfig.model_validate(
        {"T": 2, "S": 1, "D": 2, "seed": 0, "concurrency": 1, "plot": False, "graph": graph_file}
        | {"envs": ["hotels", "flights"], "out": data / "demo" / "synth"}
    )
    run_batch(config, settings, console=Console(quiet=True))
    assert load_conversations(data / "demo" / "synth"), "the offline run kept no conversation"
    return settings


def test_demo_export_stage_writes_every_format_and_the_order_holds(settings: Settings, pool: EnvPool) -> None:
    console = Console(record=True, width=160)
    sanity = export_demo(settings, pool, console)
    for fmt in FORMATS:
        summary = json.loads((settings.data_path / "demo" / "export" / fmt / "export.json").read_text())
        assert summary["format"] == fmt and summary["samples"] > 0
    assert [r.kind for r in sanity.rows] == list(KINDS)
    scores = [r.result.reward for r in sanity.rows]
    assert scores[0] == 1.0 and scores[0] > scores[1] > scores[2] > scores[3] == 0.0
    redundant, wrong = sanity.rows[1].result, sanity.rows[2].result
    # the redundant read leaves the state right: only the trajectory term and the length penalty notice
    assert redundant.r_state == 1.0 and redundant.p_length == 1 and redundant.r_traj < 1.0
    # the wrong argument changes what a write does: the state term sees it
    assert wrong.r_state < 1.0 and wrong.p_length == 0
    assert "holds" in console.export_text()


def test_every_record_with_a_read_and_a_write_keeps_the_order(settings: Settings, pool: EnvPool) -> None:
    conversations = load_conversations(settings.data_path / "demo" / "synth")
    catalog = catalog_for(pool, conversations)
    samples = [s for c in conversations for s in convert_to_rl_data(c, catalog)]
    scorer = CompositeReward(pool)
    checked = 0
    for sample in samples:
        made = completions(pool, sample)
        if made is None:
            continue
        report = reward_sanity(pool, [sample], scorer)
        assert report.ordered, (sample.extra_info.conversation_id, [r.result for r in report.rows])
        checked += 1
    assert checked >= 2


def test_no_usable_record_is_an_actionable_error(pool: EnvPool) -> None:
    with pytest.raises(EnvFactoryError, match="D ≥ 2"):
        reward_sanity(pool, [])
