"""The process executor (`envfactory corpus compile`'s default): worker processes on this machine; a worker that
dies costs its own unit a retry, never the rest of the batch."""

from __future__ import annotations

import pytest

from envfactory.executor import ProcessExecutor, WorkerLost
from tests.support.executor import DiesOn, HangsOn


def test_a_dead_worker_costs_its_own_unit_and_nothing_else() -> None:
    results = list(ProcessExecutor(processes=2, retries=1).map(DiesOn(fatal=3), list(range(12))))
    assert sorted(unit for unit, _ in results) == list(range(12))  # every unit exactly once
    lost = {unit: r for unit, r in results if isinstance(r, WorkerLost)}
    assert list(lost) == [3] and "died 2 times" in lost[3].reason
    assert all(r == unit * 10 for unit, r in results if unit != 3)


def test_units_come_back_from_every_worker() -> None:
    results = dict(ProcessExecutor(processes=2).map(DiesOn(fatal=-1), list(range(7))))
    assert results == {u: u * 10 for u in range(7)}


def test_a_unit_past_its_time_is_stopped_and_the_batch_goes_on() -> None:
    """A spec whose pattern backtracked for ever held its worker, and `corpus compile`, for ever: a unit running
    past `unit_timeout` has its worker killed and comes back at once as lost (not retried); the units in flight
    beside it are run again, and every unit comes back exactly once."""
    results = list(ProcessExecutor(processes=2, unit_timeout=3).map(HangsOn(stuck=2), list(range(8))))
    assert sorted(unit for unit, _ in results) == list(range(8))
    lost = {unit: r for unit, r in results if isinstance(r, WorkerLost)}
    assert list(lost) == [2] and "ran longer than 3 s and was stopped" in lost[2].reason
    assert all(r == unit * 10 for unit, r in results if unit != 2)


@pytest.mark.timeout(60)
def test_a_batch_stopped_while_a_unit_hangs_stops_at_once() -> None:
    """Ctrl-C during `corpus compile` once hung: the pool's exit waited for the units in flight, and a unit stuck
    in a regular expression never ends. A batch stopped early (an exception in its consumer, Ctrl-C) kills its
    workers instead."""
    results = ProcessExecutor(processes=2).map(HangsOn(stuck=0), list(range(6)))
    first = next(results)
    assert first == (1, 10)  # unit 0 hangs in the other worker
    results.close()  # returns: nothing waits for unit 0
