"""Offline synthesis is the same for the same seed however it runs: serial or on threads, the summary and
statistics kept while writing (RunLog) or read back from the folder, a resumed run, and the initial-state
generator's per-thread Faker against a Faker built and seeded per state (the old way)."""

from __future__ import annotations

import random
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from faker import Faker

from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.executor import LocalExecutor
from envfactory.records.run_folder import CONVERSATIONS, DROPPED, HELDOUT
from envfactory.tasks import initial_state
from envfactory.tasks.initial_state import generate_initial_state
from envfactory.tasks.plan import (
    RunLog,
    SynthConfig,
    SynthConfigError,
    load_conversations,
    plan_units,
    run_units,
    summarize,
)
from envfactory.tasks.run import OfflineRunner
from envfactory.tasks.stats import dataset_stats
from envfactory.toolgraph import ToolGraph
from tests.support.paths import ROOT


class Serial:
    """Units one after another on the calling thread."""

    name = "serial"

    def map(self, runner: Any, jobs: Any) -> Any:
        for job in jobs:
            yield job, runner(job)


def _sorted_bytes(out: Path) -> dict[str, bytes]:
    return {
        name: b"".join(sorted((out / name).read_bytes().splitlines(keepends=True))) if (out / name).exists() else b""
        for name in (CONVERSATIONS, DROPPED, HELDOUT)
    }


@pytest.mark.parametrize("seed", [0, 7])
def test_same_seed_same_files_serial_threads_and_resumed(
    seed: int, tmp_path: Path, pool: EnvPool, graph: ToolGraph
) -> None:
    config = SynthConfig.model_validate(
        {"A": 3, "T": 2, "S": 2, "D": 2, "seed": seed, "holdout_tasks": 0.5, "out": tmp_path}
    )
    plan = plan_units(config, pool, graph)
    runner = OfflineRunner(Settings(root=ROOT, bfcl=False), pool)
    outputs = []
    for label, executor in (("serial", Serial()), ("threads", LocalExecutor(2))):
        log = RunLog()
        out = tmp_path / label
        assert run_units(plan.units, runner, out, executor=executor, log=log) == (0, len(plan.units))
        # what was kept while writing is what the folder says
        assert summarize(plan, out, 0, log) == summarize(plan, out, 0)
        assert dataset_stats(log.facts()) == dataset_stats(load_conversations(out))
        outputs.append(_sorted_bytes(out))
    resumed = tmp_path / "resumed"
    run_units(plan.units[:3], runner, resumed, executor=Serial())
    log = RunLog()
    seen: list[Any] = []  # a resumed run's progress starts at what was done before (a bar mixed the two counts)
    ran = run_units(plan.units, runner, resumed, executor=LocalExecutor(2), log=log, progress=seen.append)
    assert ran == (3, len(plan.units) - 3) and seen[0] == 3 and len(seen) == len(plan.units) - 3 + 1
    assert summarize(plan, resumed, 3, log) == summarize(plan, resumed, 3)
    assert dataset_stats(log.facts()) == dataset_stats(load_conversations(resumed))
    outputs.append(_sorted_bytes(resumed))
    assert outputs[0][CONVERSATIONS] and outputs[0] == outputs[1] == outputs[2]


def test_thread_faker_gives_a_seeded_new_fakers_states(pool: EnvPool, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    jobs = [(name, rng.getrandbits(32)) for name in sorted(pool.native_names())[:4] for _ in range(3)]

    def states() -> list[str]:
        with ThreadPoolExecutor(2) as ex:  # two threads, states of several environments interleaved on each
            made = ex.map(lambda j: generate_initial_state(pool.get(j[0]), seed=j[1], depth=2), jobs)
            return [s.model_dump_json() for s in made]

    shared = states()

    def fresh(locale: str, seed: int) -> Faker:
        faker = Faker(locale)
        faker.seed_instance(seed)
        return faker

    monkeypatch.setattr(initial_state, "seeded_faker", fresh)
    assert shared == states()


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, tuple | list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def test_a_run_keeps_what_the_statistics_read_not_its_conversations(
    tmp_path: Path, pool: EnvPool, graph: ToolGraph
) -> None:
    """A run's log holds a few strings and numbers a conversation (a conversation's model is ~370 KB, 7× its JSON
    line: a 100,000-unit run held tens of GB), and the statistics made of them are those of the folder."""
    config = SynthConfig.model_validate({"A": 3, "T": 2, "S": 2, "D": 2, "seed": 3, "out": tmp_path})
    plan = plan_units(config, pool, graph)
    log = RunLog()
    run_units(plan.units, OfflineRunner(Settings(root=ROOT, bfcl=False), pool), tmp_path, executor=Serial(), log=log)
    kept = load_conversations(tmp_path)
    assert kept and len(log.train) == len(kept)
    assert all(isinstance(leaf, str | int) for leaf in _leaves(log.train))
    held = sum(sys.getsizeof(leaf) for leaf in _leaves(log.train)) + sum(map(sys.getsizeof, log.train))
    assert held * 10 < (tmp_path / CONVERSATIONS).stat().st_size
    assert dataset_stats(log.facts()) == dataset_stats(kept)


def test_a_resume_keeps_facts_of_the_earlier_lines_and_names_a_line_that_is_no_conversation(
    tmp_path: Path, pool: EnvPool, graph: ToolGraph
) -> None:
    """A resumed run's earlier conversations are read a line at a time into what the statistics read of them (they
    were held as parsed rows, ~220 KB each); a line that is no conversation stops the resume before any unit runs,
    naming its row (it used to surface as a pydantic traceback once every unit had run)."""
    config = SynthConfig.model_validate({"A": 3, "T": 2, "S": 2, "D": 2, "seed": 3, "out": tmp_path})
    plan = plan_units(config, pool, graph)
    runner = OfflineRunner(Settings(root=ROOT, bfcl=False), pool)
    run_units(plan.units[:-2], runner, tmp_path, executor=Serial())
    earlier = RunLog.read(tmp_path)
    assert earlier.train and all(isinstance(leaf, str | int) for leaf in _leaves(earlier.train))
    assert dataset_stats(earlier.facts()) == dataset_stats(load_conversations(tmp_path))
    assert RunLog.read(tmp_path, facts=False).train_ids() == earlier.train_ids()

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / CONVERSATIONS).write_text('{"id": "x/t0/s0", "nodes": "not a list"}\n')
    ran: list[Any] = []
    with pytest.raises(SynthConfigError, match=r"row 1 is not a conversation: .*fix or remove it to resume"):
        run_units(plan.units, runner, bad, executor=Serial(), progress=ran.append, log=RunLog())
    assert ran == [] and not (bad / DROPPED).exists()


def test_a_conversation_twice_in_a_run_folder_stops_the_resume(tmp_path: Path, pool: EnvPool, graph: ToolGraph) -> None:
    """A line copied twice into conversations.jsonl (or one conversation in both splits) was counted twice by the
    resumed run's summary (25 of 24 units), which export then refused: the resume stops first, naming both rows."""
    config = SynthConfig.model_validate({"A": 2, "T": 2, "S": 1, "D": 2, "seed": 5, "out": tmp_path})
    plan = plan_units(config, pool, graph)
    runner = OfflineRunner(Settings(root=ROOT, bfcl=False), pool)
    run_units(plan.units, runner, tmp_path, executor=Serial())
    path = tmp_path / CONVERSATIONS
    lines = path.read_text().splitlines(keepends=True)
    assert lines
    cid = RunLog.read(tmp_path, facts=False).train_ids()[0]
    for twice, where in ((lines[0], CONVERSATIONS), (None, HELDOUT)):
        if twice is not None:
            path.write_text("".join(lines) + twice)
        else:
            path.write_text("".join(lines))
            (tmp_path / HELDOUT).write_text(lines[0])
        for facts in (True, False):
            with pytest.raises(SynthConfigError, match=rf"conversation '{cid}' is there twice \(.*{where} row \d+\)"):
                RunLog.read(tmp_path, facts=facts)
        with pytest.raises(SynthConfigError, match="is there twice"):
            run_units(plan.units, runner, tmp_path, executor=Serial(), log=RunLog())
