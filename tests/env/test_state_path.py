"""The one state-path syntax and resolver (`envfactory.env.state_path`): every path it writes for a leaf of
any JSON state reads back to that leaf; the forms the stored formats hold (the verifier's `a[0]`, the
scenario files' `a.0`, StateDiff's dotted keys) read the same value."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from envfactory.env.diff import diff_states
from envfactory.env.state_path import MISSING, get_path, leaf_paths, parse_path, resolve_path

# keys with every character the syntax gives a meaning to, numerals, and the empty key
KEYS = st.text(alphabet=st.sampled_from(list('ab.[]"0-1 é')), max_size=5)
PLAIN_KEYS = st.text(alphabet=st.sampled_from(list("abcxyz_-")), min_size=1, max_size=4)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3)


def _json(keys: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        SCALARS,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
        max_leaves=25,
    )


@settings(max_examples=400, deadline=None)
@given(_json(KEYS))
def test_every_leaf_path_reads_back_to_its_leaf(state: Any) -> None:
    leaves = list(leaf_paths(state))
    assert leaves  # a scalar or an empty container is one leaf, at ""
    for path, leaf in leaves:
        found = resolve_path(state, path)
        assert found is leaf or (found == leaf and type(found) is type(leaf)), (path, state)


@settings(max_examples=200, deadline=None)
@given(_json(PLAIN_KEYS), _json(PLAIN_KEYS))
def test_the_paths_a_state_diff_writes_resolve_in_the_state_they_name(before: Any, after: Any) -> None:
    """StateDiff's paths are in the one syntax: a removed path is in `before`, an added one in `after`."""
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return
    diff = diff_states(before, after)
    assert all(resolve_path(before, p) is not MISSING for p in diff.removed + diff.changed if p != "<root>")
    assert all(resolve_path(after, p) is not MISSING for p in diff.added + diff.changed if p != "<root>")


def test_the_stored_forms_read_the_same_value() -> None:
    state = {"bookings": {"BK-0001": {"status": "paid", "rooms": [{"n": 1}, {"n": 2}]}}, "files": {"a.txt": 3}}
    for path in ("bookings.BK-0001.rooms[1].n", "bookings.BK-0001.rooms.1.n", "bookings.BK-0001.rooms[-1].n"):
        assert get_path(state, path) == 2
    assert get_path(state, "files.a.txt") == get_path(state, 'files["a.txt"]') == 3
    assert get_path([{"id": 7}], "[0].id") == 7 and get_path(state, "") is state
    assert resolve_path(state, "bookings.BK-0001.rooms[2]") is MISSING
    assert resolve_path(state, "bookings.BK-0001.status.x") is MISSING
    assert resolve_path({"a": {"0": 1}}, "a.0") == 1 and resolve_path({"a": {"0": 1}}, "a[0]") is MISSING


def test_a_bracket_that_is_no_index_or_quoted_key_is_part_of_the_key() -> None:
    assert get_path({"a[x]": {"b": 1}}, "a[x].b") == 1
    assert [s if isinstance(s, int) else s.name for s in parse_path('a["b.c"][0].d')] == ["a", "b.c", 0, "d"]
