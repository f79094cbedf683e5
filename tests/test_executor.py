"""The local executor (threads): what a batch stopped early leaves running."""

from __future__ import annotations

import threading
import time

from envfactory.executor import LocalExecutor


def test_a_batch_stopped_early_starts_none_of_its_queued_units() -> None:
    """Ctrl-C during `eval` took a minute: the thread pool's exit ran every queued attempt before the process could
    stop. Now the units not yet started are cancelled, and only the ones running finish."""
    started: list[int] = []
    lock = threading.Lock()

    def unit(job: int) -> int:
        with lock:
            started.append(job)
        time.sleep(0.2)
        return job

    results = LocalExecutor(concurrency=2).map(unit, list(range(40)))
    first = next(results)
    results.close()  # what an exception (KeyboardInterrupt) in the consumer's loop does to the generator
    assert first[0] == first[1] and 2 <= len(started) <= 4, started
    time.sleep(0.5)
    assert len(started) <= 4  # nothing started after the stop
