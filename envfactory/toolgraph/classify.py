"""`user_provided` by heuristic: can a user say this input's value, or must a prior tool produce it?

External (user-provided) inputs are what a person can put in a request — a city, a name, a date, a
message, an amount, a choice among options. Internal ones are what only the system knows — a
`hotel_id`, an access token, coordinates — and must come from an earlier tool's output. The rules,
first match wins:

1. **id-like** (a token id/ids/uuid/guid/key/token/handle/cursor/hash/secret/session, or a
   description saying the value is "returned by" / "obtained from" a tool) or **coordinates**
   (lat/lng/latitude/longitude/coordinate): internal — *unless no tool of its environment outputs
   it* (a tool that itself requires an input of that name does not count), then external: nothing
   could first produce it, so the user has to say it (their customer number, client credentials);
2. **sayable**: an enum, a boolean, a date/time/e-mail/URI format, a number (amounts, counts,
   limits), or a name token from `EXTERNAL_WORDS` (names, people, places, dates and times, text,
   amounts, categories, credentials): external;
3. **ambiguous** (anything else, e.g. `symbol`, `stock`): internal when a tool of its environment
   outputs it with similarity ≥ `lean_internal_threshold` (it leans on that producer), else external.

The LLM classification (`llm_classify`) replaces these rules when an LLM is configured.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel

from envfactory.toolgraph.params import ParamSpec
from envfactory.words import tokens

VerdictSource = Literal["heuristic", "llm"]

ID_WORDS = frozenset({"id", "uuid", "guid", "key", "token", "handle", "cursor", "hash", "secret", "session"})
COORDINATE_WORDS = frozenset({"lat", "lng", "lon", "latitude", "longitude", "coordinate", "coord", "geo"})
EXTERNAL_WORDS = frozenset(
    # people and accounts a user names
    {"name", "username", "user", "person", "people", "guest", "passenger", "attendee", "organizer", "owner"}
    | {"recipient", "receiver", "author", "member", "participant", "customer", "email", "phone", "first", "last"}
    | {"password", "passport", "birth", "dob", "iban", "card", "number", "cardholder"}
    # places
    | {"city", "country", "region", "address", "street", "zip", "zipcode", "postal", "location", "destination"}
    | {"origin", "place", "airport", "venue", "from", "to"}
    # dates and times
    | {"date", "day", "time", "start", "end", "month", "year", "week", "hour", "minute", "duration", "night"}
    | {"check", "deadline", "when", "after", "before", "since", "until"}
    # text
    | {"title", "subject", "query", "keyword", "search", "text", "content", "message", "comment", "note", "body"}
    | {"description", "reason", "resolution", "review", "question", "answer", "bio", "summary", "tag", "mention"}
    | {"file", "folder", "directory", "dir", "path", "pattern", "line", "word"}
    # amounts and choices
    | {"amount", "price", "cost", "budget", "quantity", "count", "limit", "size", "party", "rating", "star"}
    | {"currency", "language", "category", "cuisine", "genre", "type", "kind", "mode", "status", "priority"}
    | {"level", "unit", "option", "color", "value", "temperature", "speed", "distance", "seat", "bag", "cabin"}
    | {"class", "format", "style", "sort"}
)
SAYABLE_FORMATS = frozenset({"date", "date-time", "time", "email", "uri", "url", "hostname", "duration"})
_PRODUCED_CUE = re.compile(r"\b(returned|obtained|given|produced|provided) (by|from)\b|\bfrom a previous\b", re.I)


class Verdict(BaseModel):
    """The classification of one input parameter, with who decided and why."""

    user_provided: bool
    source: VerdictSource = "heuristic"
    reason: str


def classify(
    param: ParamSpec, producer_score: float | None, lean_internal_threshold: float, *, schema_produced: bool = False
) -> Verdict:
    """The heuristic verdict for one input; `producer_score` is the best similarity of any output of
    another tool of the same environment (None when no output matches above the edge threshold);
    `schema_produced`: a schema rule relates an output of the environment to it (`schema_edges`)."""
    words = set(tokens(param.name))
    produced = producer_score is not None or schema_produced
    if words & ID_WORDS or words & COORDINATE_WORDS or _PRODUCED_CUE.search(param.description):
        kind = "coordinates" if words & COORDINATE_WORDS else "an identifier"
        if not produced:
            return Verdict(user_provided=True, reason=f"{kind}, but no tool of the environment outputs it")
        return Verdict(user_provided=False, reason=f"{kind}: must come from a prior tool")
    if param.enum:
        return Verdict(user_provided=True, reason="a choice among fixed options")
    base = param.json_type.removeprefix("array<").removesuffix(">")
    if base == "boolean":
        return Verdict(user_provided=True, reason="a yes/no flag")
    if param.format in SAYABLE_FORMATS:
        return Verdict(user_provided=True, reason=f"a {param.format} the user can say")
    if base in ("integer", "number"):
        return Verdict(user_provided=True, reason="a number (an amount, a count, a limit)")
    sayable = words & EXTERNAL_WORDS
    if sayable:
        return Verdict(user_provided=True, reason=f"a {sorted(sayable)[0]}: the user can say it")
    if produced and producer_score is not None and producer_score >= lean_internal_threshold:
        return Verdict(
            user_provided=False, reason=f"ambiguous, but a tool outputs it (similarity {producer_score:.2f})"
        )
    return Verdict(user_provided=True, reason="nothing says it comes from a tool")
