"""A served session's kept calls (`serve.limits.CallRing`) and the records they let go (`drop`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from envfactory.serve.limits import CallRing, drop


class Rec:
    """A call record: compared by identity only, as the server's are."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __eq__(self, other: object) -> bool:  # equal values must not make two records one
        return isinstance(other, Rec) and other.n == self.n

    __hash__ = None  # type: ignore[assignment]


@given(st.integers(0, 40), st.lists(st.integers(0, 39), max_size=12), st.booleans())
def test_drop_removes_exactly_the_records_let_go(n: int, picks: list[int], prefix: bool) -> None:
    records = [Rec(i % 3) for i in range(n)]  # equal values, distinct records
    chosen = [records[i] for i in dict.fromkeys(p for p in picks if p < n)]
    gone = records[: min(len(picks), n)] if prefix else chosen  # the ring's case: the oldest, in order
    expected = [r for r in records if all(r is not g for g in gone)]
    drop(records, iter(gone))  # any iterable, read once
    assert len(records) == len(expected) and all(a is b for a, b in zip(records, expected, strict=True))


@given(st.lists(st.integers(1, 50), max_size=60), st.integers(1, 8), st.integers(1, 200))
def test_a_ring_keeps_the_newest_within_its_bounds_and_history_follows(
    weights: list[int], calls: int, bytes_: int
) -> None:
    ring, history = CallRing(calls, bytes_), []
    for i, w in enumerate(weights):
        rec = Rec(i)
        history.append(rec)
        drop(history, ring.add(rec, w))
        kept = [item for item, _ in ring.items]
        assert len(history) == len(kept) and all(a is b for a, b in zip(history, kept, strict=True))
        assert len(kept) <= calls and (ring.total <= bytes_ or len(kept) == 0)
        assert ring.total == sum(w for _, w in ring.items)
        if kept:
            assert kept[-1] is rec or w > bytes_  # the newest stays unless it alone is over the bytes
