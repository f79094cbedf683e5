"""The resource grammar of REST paths: which route is a collection, an item, or an action on an item.

`/v1/owners/{ownerId}/pets/{petId}` reads as two levels: the collection `/v1/owners` with id variable
`ownerId`, and the collection `/v1/owners/{ownerId}/pets` (a child of the first) with id variable
`petId`. A route that ends in a literal after an item (`/orders/{id}/cancel`) is either a child
collection or an action, decided by the caller from the method and the verb. Routes the grammar cannot
read (two variables in a row, a variable inside a segment) are reported as such, never guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_VAR = re.compile(r"\{([^{}/]+)\}")


@dataclass(frozen=True)
class Level:
    """One collection on the way down a route, and the variable that picks an item of it (if any)."""

    collection: str  # the collection's route, e.g. /v1/owners/{ownerId}/pets
    var: str | None  # the id variable after it, e.g. petId


@dataclass(frozen=True)
class Shape:
    """What a route is: `levels` down to its last collection, and how it ends."""

    levels: tuple[Level, ...]
    ends: str  # "collection" (…/pets), "item" (…/pets/{id}) or "tail" (…/pets/{id}/cancel)
    tail: str | None = None  # the last literal of a "tail" route

    @property
    def collection(self) -> str:
        return self.levels[-1].collection

    @property
    def parents(self) -> tuple[Level, ...]:
        """The levels above the route's own collection (each with its id variable)."""
        return self.levels[:-1]


def normalize(route: str) -> str:
    return "/" + "/".join(s for s in route.split("/") if s)


def is_var(segment: str) -> bool:
    return bool(_VAR.fullmatch(segment))


def var_name(segment: str) -> str:
    m = _VAR.fullmatch(segment)
    assert m is not None
    return m.group(1)


def shape(route: str) -> Shape | str:
    """The route's `Shape`, or why the grammar cannot read it (a string)."""
    segments = [s for s in route.split("/") if s]
    if not segments:
        return "the root path names no collection"
    if is_var(segments[0]):
        return "the path starts with a parameter"
    levels: list[Level] = []
    prefix: list[str] = []
    i = 0
    while i < len(segments):
        seg = segments[i]
        if "{" in seg or "}" in seg:
            if not is_var(seg):
                return f"segment {seg!r} mixes text and a parameter"
            if not prefix or is_var(prefix[-1]):
                return "two path parameters in a row"
            levels.append(Level("/" + "/".join(prefix), var_name(seg)))
            prefix.append(seg)
            i += 1
            continue
        prefix.append(seg)
        i += 1
    if is_var(segments[-1]):
        return Shape(tuple(levels), "item")
    last = "/" + "/".join(prefix)
    if levels and len(segments) >= 2 and is_var(segments[-2]):
        return Shape((*levels, Level(last, None)), "tail", segments[-1])
    return Shape((*levels, Level(last, None)), "collection")
