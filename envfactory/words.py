"""Names as words: the one home of the word rules every stage uses on field, parameter, tool and record names.

- tokens: `booking_id`, `bookingId` and `BookingIDs` all give `["booking", "id"]`: names are split at
  underscores, non-alphanumerics and case changes (`split_words`), lower-cased, and plural tokens are made
  singular (`tokens`; so `paper_ids` meets `paper_id`); the tool graph's parameter similarity works on them;
- `singular`: one English singular for identifiers and collection names (`hotels` → hotel, `statuses` →
  status, `article_phrases` → article_phrase); the compiler names `<singular>_id` parameters with it and
  π*, the state generators and the wording find a collection from such a name with the same rule;
- `spoken_name`: a name as a user says it (`checkIn_date` → "check in date"), for requests and answers;
- names: role qualifiers (`from_`, `new_`), record decorations (`HotelSummary`), tool verbs
  (`get_order_details` is about an order), the names an id field goes by (`record_id_names`);
- field-word lists: which field names hold free text (`is_free_text`: masked arguments, no reward compares
  their wording; `is_long_text`: state fields the generator fills with sentences).

It imports nothing of envfactory (the layer test keeps it at the bottom).
"""

from __future__ import annotations

import re
from functools import lru_cache

_SPLIT = re.compile(r"[^A-Za-z0-9]+")
# lower→Upper, Upper→Upper+lower ("HTTPServer" → HTTP Server), letter↔digit
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=[0-9])|(?<=[0-9])(?=[A-Za-z])")

# Role words that say which of two values of the same kind is meant, not what the value is:
# `from_account_id` takes an `account_id`; `new_start` takes a `start`.
QUALIFIERS = frozenset(
    {"from", "to", "src", "dst", "source", "target", "new", "old", "current", "existing", "selected", "original"}
    | {"parent", "primary", "my", "the", "a"}
)

# Words that decorate a record's class name without naming the entity: `HotelSummary` is a hotel.
RECORD_DECORATIONS = frozenset(
    {"summary", "detail", "info", "record", "result", "response", "data", "out", "output", "view", "model", "dto"}
)

# Leading verbs of tool names (`get_order_details` is about an order) and words after the noun.
TOOL_VERBS = frozenset(
    {"get", "list", "search", "find", "fetch", "retrieve", "view", "show", "read", "lookup", "query", "browse"}
    | {"create", "add", "make", "new", "post", "book", "reserve", "update", "modify", "edit", "set", "change"}
    | {"delete", "remove", "cancel", "check", "register", "submit", "send", "place", "request", "open", "close"}
    | {"start", "stop", "display", "all", "my", "current"}
)
_TOOL_TAIL = frozenset({"by", "for", "with", "from", "in", "of", "on"})
_TOOL_TRAILING = frozenset({"detail", "details", "info"})

_NOT_PLURAL = ("ss", "us", "is", "ous", "ics")
_SAME_SINGULAR = ("series", "species")  # one series, two series (not "sery")
# names repeat across a pool's tools (tens of thousands of them in a compiled pool): each is split once
_CACHE = 1 << 17


def singular(token: str) -> str:
    """A crude English singular, enough for identifiers and collection names: `cities`→`city`,
    `statuses`→`status`, `matches`→`match`, `boxes`→`box`; a word of three letters or fewer (`ids`, `aws`,
    `bus`) and one that only looks plural (`status`, `address`, `analysis`) stay as they are (`tokens`
    reads `ids` as `id`)."""
    if len(token) <= 3 or token.endswith(_NOT_PLURAL) or token.endswith(_SAME_SINGULAR):
        return token
    if token.endswith("ies"):
        return token[:-3] + "y"
    if token.endswith(("sses", "xes", "ches", "shes", "uses")):
        return token[:-2]
    if token.endswith("s"):
        return token[:-1]
    return token


# singular words that end in s (besides -ss, and the -sis/-xis of `analysis`, `axis`); any other word ending in s is
# taken as plural already (`statistics`, `settings`, `apis`, `skus`, `schemas`, `menus`)
_SINGULAR_S = frozenset(
    {"status", "bus", "campus", "virus", "bonus", "census", "corpus", "radius", "focus", "nexus", "genus", "plus"}
    | {"minus", "consensus", "syllabus", "stimulus", "apparatus", "prospectus", "cactus", "fungus", "circus"}
    | {"chorus", "alias", "canvas", "atlas", "bias", "gas", "lens", "iris"}
)


# nouns with no plural of their own (`3 metadata`, not `metadatas`), or one that does not end in s
_SAME_PLURAL = frozenset(
    {"metadata", "data", "information", "media", "criteria", "feedback", "software", "hardware", "equipment", "staff"}
)
_IRREGULAR = {"child": "children", "person": "people", "man": "men", "woman": "women", "index": "indices"}


def plural(noun: str) -> str:
    """The plural of a noun phrase's last word: `reservation order` → reservation orders, `city` → cities,
    `status` → statuses, `analysis` → analyses; a word already plural stays (`statistics`, `settings`, `apis`,
    `photos`): the plural of a plural is itself."""
    head, sep, word = noun.rpartition(" ")
    low = word.lower()
    last = low.rsplit("_", 1)[-1]  # `order_status` is a status
    if not low:
        return noun
    if last in _SAME_PLURAL or last in _IRREGULAR.values():
        made = word
    elif last in _IRREGULAR:
        made = word[: len(word) - len(last)] + _IRREGULAR[last]
    elif last == "axis" or (last.endswith("sis") and len(last) > 4):
        made = word[:-2] + "es"  # analysis → analyses, axis → axes (not the plural of a word in -si: rare)
    elif last in _SINGULAR_S or last.endswith("ss"):
        made = word + "es"
    elif low.endswith("s"):
        made = word  # statistics, settings, details, news, photos, apis
    elif low.endswith("y") and low[-2:-1] not in "aeiou":
        made = word[:-1] + "ies"
    elif low.endswith(("x", "z", "ch", "sh")):
        made = word + "es"
    else:
        made = word + "s"
    return head + sep + made


@lru_cache(maxsize=_CACHE)
def spoken_name(name: str) -> str:
    """A name as a user says it: `checkIn_date` → `check in date`, `HotelSummary` → `hotel summary`."""
    return " ".join(re.sub(r"([a-z])([A-Z])", r"\1 \2", name).replace("_", " ").split()).lower()


@lru_cache(maxsize=_CACHE)
def snake_case(text: str) -> str:
    """`getPetById` → `get_pet_by_id`, `list-pets` → `list_pets`, `HTTPStatus` → `http_status`."""
    s = re.sub(r"([A-Z])(?=[A-Z][a-z])", r"\1_", text)  # (not `([A-Z]+)([A-Z][a-z])`: quadratic on a run of capitals)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_").lower()


@lru_cache(maxsize=_CACHE)
def _split_words(name: str) -> tuple[str, ...]:
    words: list[str] = []
    name = name.replace("IDs", "Ids")  # `BookingIDs`: a plural acronym, not I + Ds
    for part in _SPLIT.split(name):
        words.extend(w.lower() for w in _CAMEL.split(part) if w)
    return tuple(words)


def split_words(name: str) -> list[str]:
    """`fanSpeed` → [fan, speed]; `HotelSummary` → [hotel, summary]; `cityA` → [city, a]; lower case."""
    return list(_split_words(name))


@lru_cache(maxsize=_CACHE)
def _tokens(name: str) -> tuple[str, ...]:
    return tuple(singular(w) if w != "ids" else "id" for w in _split_words(name))


def tokens(name: str) -> list[str]:
    """The name's words, singular, in order (`ids` and `id` are one token; `id` itself stays `id`)."""
    return list(_tokens(name))


def unqualified(name: str) -> list[str]:
    """Tokens without leading role qualifiers (`from_account_id` → [account, id]). Only leading ones:
    in `travel_from` the last word is the meaning. The full tokens if nothing is left."""
    toks = tokens(name)
    start = 0
    while start < len(toks) - 1 and toks[start] in QUALIFIERS:
        start += 1
    return toks[start:]


def snake(words: list[str]) -> str:
    return "_".join(words)


def record_words(record: str) -> list[str]:
    """The entity a record class names: `HotelSummary` → [hotel]; `FlightBooking` → [flight, booking]."""
    words = [singular(w) for w in split_words(record)]
    kept = [w for w in words if w not in RECORD_DECORATIONS]
    return kept or words


def tool_noun(tool_name: str) -> list[str]:
    """The entity a tool is about, from its name: `get_order_details` → [order]; `list_all_airports` →
    [airport]; `get_symbol_by_name` → [symbol]. Empty when the name is only verbs (`logout`)."""
    words = split_words(tool_name)
    while words and (words[0] in TOOL_VERBS or words[0] in _TOOL_TAIL or words[0] == "to"):
        words = words[1:]
    for i, w in enumerate(words):
        if w in _TOOL_TAIL:
            words = words[:i]
            break
    while len(words) > 1 and words[-1] in _TOOL_TRAILING:
        words = words[:-1]
    return [singular(w) for w in words]


def record_id_names(record: list[str]) -> list[str]:
    """Names an `id` field of a record goes by: `x_id` for record words x (the node's name), then the head
    noun's id for compound records (`flight_booking` → `booking_id`), then plain `id`."""
    if not record:
        return ["id"]
    names = [snake([*record, "id"])]
    if len(record) > 1:
        names.append(snake([record[-1], "id"]))
    names.append("id")
    return names


# ---- field-word lists: names of free-text fields (a suffix of the lower-cased name: `long_description`, `subtext`)
# the words both lists share
FREE_TEXT_WORDS = ("description", "message", "body", "note", "notes", "comment", "text", "reason", "summary", "bio")
# arguments whose exact wording no reward compares (masked); value makers write a sentence for them
MASKED_TEXT_WORDS = (*FREE_TEXT_WORDS, "content", "review")
# state fields the initial-state generator fills with sentences when the exemplars' values are long
LONG_TEXT_WORDS = (*FREE_TEXT_WORDS, "abstract", "subject", "request", "requests")

_MASKED_TEXT = re.compile(rf"({'|'.join(MASKED_TEXT_WORDS)})$")
_LONG_TEXT = re.compile(rf"({'|'.join(LONG_TEXT_WORDS)})$")


def is_free_text(name: str) -> bool:
    """An argument of free text whose wording does not matter (`description`, `commitMessage`, `file_content`)."""
    return _MASKED_TEXT.search(name.lower()) is not None


# a response's bookkeeping, no fact about the record: where the next page starts, a cache validator, a link to itself.
# Whole names only (`time_signature`, an SSH key's `fingerprint` and `@odata.count` are facts a user asks about)
_BOOKKEEPING = re.compile(
    r"^(?:(?:next|prev|previous|start|end)_)?(?:page_token|page_cursor|cursor|continuation(?:_token)?|sync_token"
    r"|marker|key_marker|version_id_marker|upload_id_marker)$"
    r"|^(?:next|prev|previous)_(?:token|link|key|page_link)$"
    r"|^(?:etag|e_tag|self_link|resource_version|last_evaluated_key|exclusive_start_key|is_truncated)$"
    r"|^(?:status_code|http_status|http_status_code)$"
    r"|^odata_(?:context|etag|type|id|next_link|delta_link|edit_link|read_link|metadata|media_etag)$"
)


def is_bookkeeping(name: str) -> bool:
    """A field a response carries for the client, not the user: `nextPageToken`, `NextToken`, `Marker`,
    `NextKeyMarker`, `LastEvaluatedKey`, `etag`, `selfLink`, `@odata.nextLink`, `continuationToken`, an envelope's
    `status_code` (an answer never tells them, a user never asks for them)."""
    return _BOOKKEEPING.search(snake_case(name)) is not None


def is_long_text(name: str) -> bool:
    """A state field that holds prose (`abstract`, `special_requests`, `newsletter_subject`)."""
    return _LONG_TEXT.search(name.lower()) is not None
