"""Values as people write them: dates in a few styles, times on a 12- or 24-hour clock, names in words.

One place for the forms, so that what a request or an answer says (`conversation`), what a verifier
accepts as stating a value (`verifier.answer_forms`) and what the quality figures count as reported
(`quality`) agree.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Any

from envfactory.words import spoken_name

_DAY = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_CLOCK = re.compile(r"(\d{2}):(\d{2})(:00)?")
DATE_STYLES = 4
# a value no user says: a uuid, a long hex digest (not a long number), a type tag (`tasks#task`; not `order#123`)
_OPAQUE = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|(?=[0-9]*[a-f])[0-9a-f]{32,}|[a-z]+#[a-z][A-Za-z]*",
    re.IGNORECASE,
)


def _day(text: str, style: int) -> str:
    if style == 0:
        return text
    try:
        when = date.fromisoformat(text)
    except ValueError:  # shaped like a date, but none (a code an API's pattern made: 2023-13-45)
        return text
    month = when.strftime("%B")
    if style == 1:
        return f"{month} {when.day}, {when.year}"
    if style == 2:
        return f"{when.day} {month} {when.year}"
    return f"{when.strftime('%A')}, {month} {when.day}, {when.year}"


def _clock(text: str, style: int) -> str:
    hour, minute = int(text[:2]), int(text[3:5])
    if style % 2 == 0:
        return text[:5]
    suffix = "am" if hour < 12 else "pm"
    twelve = hour % 12 or 12
    return f"{twelve} {suffix}" if minute == 0 else f"{twelve}:{minute:02d} {suffix}"


def unsayable(value: Any) -> bool:
    """A value an answer does not tell and a request does not ask for: a uuid, a long hex digest, a type tag."""
    return isinstance(value, str) and _OPAQUE.fullmatch(value) is not None


def say(value: Any, style: int = 0) -> str:
    """A value as a user writes it; `style` picks one of the ways people write dates and times (0: ISO)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value == int(value):
        return str(int(value))
    if isinstance(value, list):
        return ", ".join(say(v, style) for v in value) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{spoken_name(k)} {say(v, style)}" for k, v in value.items())
    text = str(value)
    if _DAY.fullmatch(text):
        return _day(text, style)
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:00(\.0+)?)?(Z|[+-]00:?00)?", text):  # (UTC, whole minutes)
        return _day(text[:10], style) + " at " + _clock(text[11:16], style)
    if _CLOCK.fullmatch(text):
        return _clock(text, style)
    return text


def _in_token(ch: str) -> bool:
    """An ASCII character that continues a token: a letter, a digit, `_` or `-`."""
    return ch.isalnum() or ch in "_-"


def mentions(text: str, value: str) -> bool:
    """`value` appears in `text` as a whole token (an id `BK-0002`, a number, a name), not inside a word."""
    if not value or (len(value) < 2 and not value.isdigit()):
        return False
    if value.isascii() and text.isascii():  # (ASCII: case maps one to one, and `\w` is a letter, digit or `_`)
        low, find = text.lower(), value.lower()  # every place it occurs, its neighbours looked at: no pattern
        at = low.find(find)
        while at >= 0:
            end = at + len(find)
            if (at == 0 or not _in_token(low[at - 1])) and (end == len(low) or not _in_token(low[end])):
                return True
            at = low.find(find, at + 1)
        return False
    return re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text, re.IGNORECASE) is not None


def renderings(value: Any) -> set[str]:
    """Every way `say` may write a value in a request."""
    return {say(value, style) for style in range(DATE_STYLES)}
