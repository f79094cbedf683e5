"""`mentions`: its quick test that the value occurs at all never changes the answer of the whole-token match."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from envfactory.records.spoken import mentions

PIECES = [
    "BK-0002",
    "bk-0002",
    "Lisbon",
    "LISBON",
    "ß",
    "SS",
    "İstanbul",
    "istanbul",
    "K",
    "\u212a",
    "-",
    " ",
    "12",
    "x",
]


def _whole_token(text: str, value: str) -> bool:
    if not value or (len(value) < 2 and not value.isdigit()):
        return False
    return re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text, re.IGNORECASE) is not None


@settings(max_examples=1500, deadline=None)
@given(
    text=st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=4)), max_size=8).map("".join),
    value=st.one_of(st.sampled_from(PIECES), st.text(max_size=6)),
)
def test_mentions_is_the_whole_token_match(text: str, value: str) -> None:
    assert mentions(text, value) == _whole_token(text, value)


def test_mentions_finds_tokens_in_any_case_and_not_inside_words() -> None:
    assert mentions("Your booking BK-0002 is confirmed.", "bk-0002")
    assert not mentions("Your booking BK-00021 is confirmed.", "BK-0002")
    assert mentions("Flights to İstanbul", "İstanbul") and not mentions("Lisbonne", "Lisbon")
