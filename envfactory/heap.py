"""The cyclic garbage collector during a long batch: what was alive before it (a pool, a tool graph, the
models' classes) moved out of the collector's view for its length (`frozen_heap`), so that its collections
walk only the batch's own objects. The HTTP server does the same for its whole life (`serve.http`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap() -> Iterator[None]:
    """`gc.freeze()` for the block, `gc.unfreeze()` after it; nothing when something froze the heap already (a
    server, a caller managing its own): theirs is left as it is. Frozen objects are still freed when their
    last reference goes; only cycles among them wait for the block's end."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
