"""`frozen_heap`: the heap alive before a batch is out of the collector's view during it, and back after it —
unless the process froze it already, whose freeze stays as it is. Run in a fresh interpreter (a test process's
heap may be frozen already by what ran before)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.paths import ROOT

FRESH = textwrap.dedent(
    """
    import gc
    from envfactory.heap import frozen_heap

    assert gc.get_freeze_count() == 0
    alive = [[] for _ in range(10)]
    with frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen >= len(alive), frozen
        made_inside = [[] for _ in range(10)]
        assert gc.get_freeze_count() <= frozen  # what the block makes stays in view (freed frozen objects lower it)
        assert all(gc.is_tracked(x) for x in made_inside)
    assert gc.get_freeze_count() == 0

    try:  # back after an error too
        with frozen_heap():
            raise KeyError("stop")
    except KeyError:
        pass
    assert gc.get_freeze_count() == 0

    gc.freeze()  # a freeze made before the block
    before = gc.get_freeze_count()
    with frozen_heap():
        assert gc.get_freeze_count() <= before
    assert 0 < gc.get_freeze_count() <= before  # still frozen: the block did not unfreeze it
    print("ok")
    """
)


def test_the_heap_is_frozen_for_the_block_and_back_after_and_a_freeze_made_before_stays() -> None:
    res = subprocess.run(
        [sys.executable, "-c", FRESH], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
