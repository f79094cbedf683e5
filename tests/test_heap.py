"""`frozen_heap`: the heap alive before a batch is out of the collector's view during it, and back after it —
unless the process froze it already, whose freeze stays as it is."""

from __future__ import annotations

import gc

from envfactory.heap import frozen_heap


def test_the_heap_is_frozen_for_the_block_and_back_after() -> None:
    gc.unfreeze()  # whatever an earlier test froze in this process: back in view, as in a fresh one
    alive = [[] for _ in range(10)]
    with frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen >= len(alive)
        made_inside = [[] for _ in range(10)]
        assert gc.get_freeze_count() == frozen  # what the block makes stays in the collector's view
        assert all(gc.is_tracked(x) for x in made_inside)
    assert gc.get_freeze_count() == 0


def test_a_freeze_made_before_is_left_as_it_was() -> None:
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with frozen_heap():
            pass
        assert gc.get_freeze_count() == before
    finally:
        gc.unfreeze()


def test_the_heap_is_back_after_an_error() -> None:
    gc.unfreeze()
    try:
        with frozen_heap():
            raise KeyError("stop")
    except KeyError:
        pass
    assert gc.get_freeze_count() == 0
