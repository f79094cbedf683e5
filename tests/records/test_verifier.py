"""The verifier's state comparison (`records.verifier.state_differences`): its shortcut for two states that are
one JSON document (`same_document`) answers what the long way (mask both, diff) answers."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envfactory.env.diff import StateDiff, diff_states
from envfactory.records.models import Assertion, MaskSpec
from envfactory.records.verifier import (
    answer_budget,
    answer_forms,
    answer_states,
    canonical,
    check_assertion,
    replace_ids,
    same_document,
    state_differences,
)

NAN = math.nan
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.0, 1.0, -2.5, NAN]),
    st.sampled_from(["", "a", "BK-0001", "<masked>"]),
)
JSON = st.recursive(
    LEAVES,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abcd"), inner, max_size=3)),
    max_leaves=12,
)


def _twin(value: Any, draw: Any) -> Any:
    """A copy of `value` that may differ in a leaf's type (1 / 1.0 / True), a list turned tuple, key order."""
    if isinstance(value, dict):
        items = [(k, _twin(v, draw)) for k, v in value.items()]
        if draw(st.booleans()):
            items.reverse()
        return dict(items)
    if isinstance(value, list):
        out = [_twin(v, draw) for v in value]
        return tuple(out) if draw(st.integers(0, 9)) == 0 else out
    if draw(st.integers(0, 5)) == 0 and isinstance(value, bool | int | float) and not isinstance(value, float):
        return float(value) if not isinstance(value, bool) else int(value)
    return value


def _long_way(initial: dict[str, Any], goal: dict[str, Any], actual: dict[str, Any], mask: MaskSpec) -> list[str]:
    diff = diff_states(canonical(initial, goal, mask), canonical(initial, actual, mask))
    return (
        [f"missing {p}" for p in diff.removed]
        + [f"unexpected {p}" for p in diff.added]
        + [f"different {p}" for p in diff.changed]
    )


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(["bookings", "notes", "n"]), JSON, max_size=3), st.data())
def test_the_shortcut_answers_what_the_long_way_answers(goal: dict[str, Any], data: Any) -> None:
    actual = _twin(goal, data.draw)
    initial: dict[str, Any] = data.draw(st.sampled_from([{}, {"n": 1}, {"bookings": {}}]))
    for mask in (MaskSpec(), MaskSpec(generated_ids=False)):
        assert state_differences(initial, goal, actual, mask) == _long_way(initial, goal, actual, mask)
        if same_document(goal, actual):
            assert _long_way(initial, goal, actual, mask) == []


def _walk(a: Any, b: Any, prefix: str, out: StateDiff) -> None:
    """The diff the straightforward way: every node walked, none skipped as one document."""
    if a is b:
        return
    key = lambda k: f"{prefix}.{k}" if prefix else str(k)  # noqa: E731
    if isinstance(a, dict) and isinstance(b, dict):
        for k, v in a.items():
            _walk(v, b[k], key(k), out) if k in b else out.removed.append(key(k))
        out.added.extend(key(k) for k in b if k not in a)
    elif isinstance(a, list) and isinstance(b, list):
        for i in range(min(len(a), len(b))):
            _walk(a[i], b[i], f"{prefix}[{i}]", out)
        out.removed.extend(f"{prefix}[{i}]" for i in range(len(b), len(a)))
        out.added.extend(f"{prefix}[{i}]" for i in range(len(a), len(b)))
    elif a != b or type(a) is not type(b):
        out.changed.append(prefix or "<root>")


@settings(max_examples=400)
@given(st.dictionaries(st.sampled_from(["bookings", "notes", "n"]), JSON, max_size=3), st.data())
def test_the_diff_skips_only_what_walking_it_would_find_equal(before: dict[str, Any], data: Any) -> None:
    """`diff_states` skips a record that is one JSON document with its counterpart: it finds exactly what the walk
    of every node finds, over twins that differ in a leaf's type (1 / 1.0 / True), NaNs, list or tuple, key order."""
    after = data.draw(st.one_of(st.just(_twin(before, data.draw)), st.dictionaries(st.sampled_from("bn"), JSON)))
    want = StateDiff()
    _walk(before, after, "", want)
    assert diff_states(before, after) == want.sorted()


def test_what_one_document_is() -> None:
    shared = NAN
    assert same_document({"a": [1, "x"], "b": None}, {"a": [1, "x"], "b": None})
    assert same_document({"a": shared}, {"a": shared})  # one NaN object: the diff skips it too (`a is b`)
    assert not same_document({"a": NAN}, {"a": float("nan")})  # two NaNs: the diff calls them different
    assert not same_document({"a": 1}, {"a": 1.0}) and not same_document({"a": 1}, {"a": True})
    assert not same_document({"a": [1]}, {"a": (1,)})
    assert not same_document({"a": 1, "b": 2}, {"b": 2, "a": 1})  # another order: the long way decides (none)
    assert not same_document({"a": object()}, {"a": object()})


def _walked(initial: dict[str, Any], final: dict[str, Any], mask: MaskSpec) -> dict[str, Any]:
    """`canonical` with no created record (and no masked path), the long way: every value copied by `replace_ids`."""
    return {k: replace_ids(v, set()) for k, v in final.items() if k != "counters"}


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(["bookings", "notes", "n", "counters"]), JSON, max_size=4), st.data())
def test_with_no_record_created_canonical_is_the_state_as_it_is(final: dict[str, Any], data: Any) -> None:
    """No id is new (`initial` holds every record of `final`): the canonical form is `final` without its counters,
    shared rather than copied; diffs between two such forms are what they were between copies."""
    initial = {k: v for k, v in final.items() if isinstance(v, dict)}
    other = _twin(final, data.draw)
    mask = MaskSpec()
    assert canonical(initial, final, mask) == _walked(initial, final, mask)
    assert diff_states(canonical(initial, final, mask), canonical(initial, other, mask)) == diff_states(
        _walked(initial, final, mask), _walked(initial, other, mask)
    )


# ---- what an answer states -------------------------------------------------------------------------------

_VALUES = st.one_of(
    st.integers(-(10**9), 10**9),
    st.floats(-1e7, 1e7, allow_nan=False, allow_infinity=False).map(lambda x: round(x, 2)),
    st.text("ABCDEFabcdef0123456789-", min_size=1, max_size=12),
    st.dates().map(lambda d: d.isoformat()),
)


@settings(max_examples=300, deadline=None)
@given(
    value=_VALUES,
    before=st.sampled_from(["", "It is ", "Done: ", "(", "the total, "]),
    after=st.sampled_from(["", ".", " in all", ")", "!"]),
)
def test_every_form_of_a_value_states_it_in_a_sentence(value: Any, before: str, after: str) -> None:
    for form in answer_forms(value):
        assert answer_states(before + form + after, value), (form, value)


@settings(max_examples=100, deadline=None)
@given(digits=st.integers(17, 4299), lead=st.integers(1, 9), sign=st.sampled_from([1, -1]))
def test_an_integer_no_float_holds_has_its_forms_and_no_overflow(digits: int, lead: int, sign: int) -> None:
    """A task's `answer_contains` of a 400-digit integer made every `complete_task` fail with "int too large to
    convert to float" (found by a reviewer)."""
    value = sign * lead * 10 ** (digits - 1)
    assert str(value) in answer_forms(value)
    assert answer_states(f"It is {value}.", value)
    assert answer_forms(10**5000) == []  # past Python's 4,300-digit limit no answer can state it


@settings(max_examples=300, deadline=None)
@given(
    value=st.integers(0, 10**6),
    digit=st.integers(1, 9),
    pad=st.sampled_from(["{d}{v}", "{v}{d}", "{v}.{d}", "{d},{v:03d}"]),
)
def test_a_number_inside_another_is_not_stated(value: int, digit: int, pad: str) -> None:
    """A substring test let `0123456789` state every digit and `15` state 5: an RL policy's cheap way to
    pass. A value is stated only as a whole number (or word)."""
    text = pad.format(d=digit, v=value)
    if str(value) in (text.replace(",", ""), text.replace(",", "").rstrip(".0")):
        return  # (the padding happened to write the value itself)
    assert not answer_states(f"The answer is {text}.", value), text


@pytest.mark.parametrize(
    ("answer", "value"),
    [  # honest answers a whole-word test refused (a skeptic's)
        ("The disk is 20GB.", 20),
        ("It weighs 5kg.", 5),
        ("The meeting is at 10am.", 10),
        ("Room on the 3rd floor.", 3),
        ("Rated 5.0 stars.", 5),
        ("The budget for FY2026 is set.", 2026),
        ("残りは5件です。", 5),
        ("お届け先は東京都です。", "東京"),
    ],
)
def test_a_number_may_touch_letters_and_a_word_any_other_script(answer: str, value: Any) -> None:
    assert answer_states(answer, value)


def test_a_stuffed_answer_is_refused_and_told_without_the_value() -> None:
    check = Assertion(kind="answer_contains", value=5088.75, max_chars=answer_budget("Your balance is 5,088.75."))
    assert check_assertion(check, {}, "Your balance is 5,088.75 EUR.") is None
    assert check_assertion(check, {}, "Your balance is 5,089.7.") is not None
    everything = "; ".join(f"account AC-{i}: {i * 17.25:.2f}" for i in range(1, 400))  # 5,088.75 is AC-295
    assert "5088.75" in everything and answer_states(everything, 5088.75)
    full, told = check_assertion(check, {}, everything) or ("", "")
    assert "at most 400" in full and "5088" not in told and "state what was asked" in told
    old = Assertion(kind="answer_contains", value=5088.75)  # a task made before the budget: no limit
    assert check_assertion(old, {}, everything) is None
    assert answer_budget("x" * 1000) == 3000 and answer_budget("short") == 400
