"""Argument values the privileged solver makes up when neither the state nor an earlier call supplies one.

Read from the parameter's JSON Schema (enum, type, format, bounds) and its name (a guest's name,
an email, a date, a number of nights), with dates relative to the environment's clock so that a
check-in is in the future of the state, not of the wall clock. Seeded: one `random.Random` and one
Faker per solve.
"""

from __future__ import annotations

import base64
import random
import re
import string
from collections.abc import Callable
from datetime import date, datetime, timedelta
from itertools import chain
from typing import Any

import rstr
from faker import Faker

from envfactory.env.json_schema import readable, search, shortest_match
from envfactory.tasks.fakers import thread_faker
from envfactory.words import is_free_text, snake_case

_MINUTES = re.compile(r"(minutes|duration|duration_min)$")
_BOUND = re.compile(r"(\w+) must be between (-?[\d.]+) and (-?[\d.]+)")
_IBAN = re.compile(r"[A-Z]{2}\d{2}[A-Z0-9]{11,30}")
_CODE = re.compile(r"[A-Z0-9][A-Z0-9-]{0,9}")  # a seat, a flight number, a short code
_INTEGER_FORMATS = frozenset({"integer", "int32", "int64"})  # a spec's "number" that holds whole numbers
# a description that says a number counts things: "The number of adult guests staying in the room", "Count of retries"
_COUNT_DESCRIBED = re.compile(r"^\W*(?:the\s+)?(?:total\s+)?(?:number|count|quantity)\s+of\b", re.I)


def _whole_number(schema: dict[str, Any]) -> bool:
    """A `number` schema whose values are whole numbers all the same: its format says so (`integer`, `int32`), its
    description says it counts something, or every example it gives is whole (and it has one)."""
    if schema.get("format") in _INTEGER_FORMATS or _COUNT_DESCRIBED.match(str(schema.get("description", ""))):
        return True
    examples = schema.get("examples")
    return (
        isinstance(examples, list)
        and bool(examples)
        and all(type(x) is int or (type(x) is float and x.is_integer()) for x in examples)
    )


def item_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema of an array's items (a string where it says none), with the array's description where the items
    have none: "Email addresses of everyone who...", "Telephone numbers of each of the recipients" say what an item
    is (an address, a phone number), where the item's own schema says only "string"."""
    given = schema.get("items")
    item: dict[str, Any] = dict(given) if isinstance(given, dict) else {"type": "string"}
    if not item.get("description") and schema.get("description"):
        item["description"] = schema["description"]
    return item


_SMALL_COUNT = re.compile(r"(nights|quantity|qty|count|guests|seats|people|party_size|size|tickets|passengers|days)$")


class ValueMaker:
    """Makes a plausible value for one parameter schema."""

    def __init__(
        self, rng: random.Random, clock: datetime, id_lookup: Callable[[str], str | None] | None = None
    ) -> None:
        self.rng = rng
        self.clock = clock
        self.id_lookup = id_lookup  # `device_id` → the id of some device of the state (for nested records)
        self.defs: dict[str, Any] = {}
        self.faker_seed = rng.getrandbits(32)
        self._faker_random = random.Random(self.faker_seed)  # what `seed_instance(faker_seed)` gives a new Faker

    @property
    def faker(self) -> Faker:
        """This thread's one Faker on this maker's own stream (`tasks.fakers`)."""
        return thread_faker(self._faker_random)

    def make(
        self,
        name: str,
        schema: dict[str, Any],
        bounds: tuple[float, float] | None = None,
        like: list[Any] | None = None,
        *,
        by_name: bool = False,
    ) -> Any:
        """A value for parameter `name`; `bounds` (learned from a tool's error message) override the schema's.
        `$ref`s resolve through `self.defs` (set it to the input schema's `$defs`). `like`: values the
        state holds in a field of that name: a new string takes their shape (an email at their domain, a
        seat `14C` for `12A`), so a tool that checks the shape accepts it. `by_name`: a string the schema says
        nothing of takes the shape its name asks for (`runtime_version` 2.4.1, `location` eastus, `role_arn` an
        ARN, `sku` Standard: `_by_name`), not a dictionary word; for a spec's fields (compiled environments),
        whose tools check only the schema (a hand-written tool may check its own vocabulary)."""
        schema = _plain(schema)
        shaped = self._shaped(like or [], schema)
        if shaped is not None and _fits_string(shaped, schema):
            return shaped
        ref = schema.get("$ref")
        if isinstance(ref, str):
            schema = {
                **_plain(self.defs.get(ref.rsplit("/", 1)[-1], {})),
                **{k: v for k, v in schema.items() if k != "$ref"},
            }
        if bounds is not None:
            schema = {**schema, "minimum": bounds[0], "maximum": bounds[1]}
        if schema.get("enum"):
            return self.rng.choice(list(schema["enum"]))
        kind = schema.get("type", "string")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        low = name.lower()
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "number" and _whole_number(schema):  # a spec's count: 2 adults, not 42.54
            kind = "integer"
        if kind == "integer":
            if _MINUTES.search(low) and "minimum" not in schema:
                return self.rng.choice([30, 45, 60, 90])
            lo, hi = _bounds(schema, (1, 4) if _SMALL_COUNT.search(low) else (1, 5))
            return self.rng.randint(int(lo), int(hi))
        if kind == "number":
            lo, hi = _bounds(schema, (10.0, 200.0))
            return round(self.rng.uniform(float(lo), float(hi)), 2)
        if kind == "array":
            item = item_schema(schema)
            count = max(1, int(schema.get("minItems", 1)))
            return [self.make(name.rstrip("s"), item, by_name=by_name) for _ in range(count)]
        if kind == "object" or "properties" in schema:
            props = schema.get("properties") or {}
            required = [k for k in props if k in schema.get("required", [])]
            optional = [k for k in props if k not in required]
            if optional:  # a record of settings means little without one of them
                required.append(self.rng.choice(optional))
            return {k: self.make(k, props[k], by_name=by_name) for k in required}
        if low.endswith("_id") and self.id_lookup is not None and (found := self.id_lookup(low[:-3])) is not None:
            return found
        fmt = schema.get("format")
        described = str(schema.get("description", ""))
        if fmt is None and _EMAIL_DESCRIBED.match(described):
            fmt = "email"  # `people`, `to`, `cc`: what the description says they hold
        elif fmt is None and _STAMP_DESCRIBED.search(described):
            fmt = "date-time"
        elif fmt is None and _PHONE_DESCRIBED.match(described):
            fmt = "phone"  # `destinations`: "Telephone numbers of each of the recipients"
        value = (self._by_name(snake_case(name), described) if by_name and fmt is None else None) or self._string(
            low, fmt
        )
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and not _matches(pattern, value):  # a shape only the pattern says: one that fits
            value = self._xeger(pattern, value)
        shortest = schema.get("minLength")
        if isinstance(shortest, int) and not isinstance(pattern, str):
            while len(value) < shortest:  # a name or an ARN the schema wants longer: more words of its kind
                value = f"{value}-{self.faker.word()}"
        longest = schema.get("maxLength")
        return value[:longest] if isinstance(longest, int) and longest >= 0 else value

    def _xeger(self, pattern: str, fallback: str) -> str:
        made = pattern_value(self.rng, pattern)
        return fallback if made is None else made

    def _shaped(self, like: list[Any], schema: dict[str, Any]) -> str | None:
        examples = [v for v in like if isinstance(v, str) and v]
        if not examples or schema.get("type", "string") != "string" or schema.get("enum") or schema.get("format"):
            return None
        example = self.rng.choice(sorted(examples))
        compact = example.replace(" ", "")
        if _IBAN.fullmatch(compact):  # an IBAN: the same country and length, new digits, a valid checksum
            return self._iban(compact)
        if "@" in example and all("@" in e for e in examples):  # an email: a new person at the same domain
            return f"{self.faker.user_name()}@{example.split('@', 1)[1]}"
        if _CODE.fullmatch(example) and any(c.isdigit() for c in example):  # a code: new digits, new letters
            return "".join(
                str(self.rng.randint(0, 9))
                if c.isdigit()
                else self.rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ")
                if c.isalpha()
                else c
                for c in example
            )
        return None

    def _iban(self, example: str) -> str:
        country = example[:2]
        bban = "".join(
            str(self.rng.randint(0, 9)) if c.isdigit() else self.rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
            for c in example[4:]
        )
        digits = "".join(str(int(c, 36)) for c in bban + country + "00")
        return f"{country}{98 - int(digits) % 97:02d}{bban}"

    def future_date(self) -> date:
        return self.clock.date() + timedelta(days=self.rng.randint(3, 40))

    def future_moment(self) -> str:
        """A time on a `future_date`, in working hours, as ISO 8601 text."""
        return (
            datetime.combine(self.future_date(), datetime.min.time()) + timedelta(hours=self.rng.randint(9, 17))
        ).isoformat()

    def _by_name(self, name: str, description: str = "") -> str | None:
        """A value shaped as a field of that name holds one (`_NAMED`), or None: the generic rules decide. A location
        is a cloud region where the field's description says so (a resource's, an Azure one), else a city; a language
        a programming one where the description speaks of code, else a locale."""
        for pattern, kind in _NAMED:
            if pattern.search(name):
                rng, f = self.rng, self.faker
                if kind == "region" and name.endswith("location") and not _CLOUD.search(description):
                    return str(f.city())
                if kind == "language" and _CODE_LANGUAGE.search(description):
                    return rng.choice(("Python", "Go", "TypeScript", "Java", "Rust"))
                if kind == "sku":  # a product's code, unique to it
                    letters = "".join(rng.choice(string.ascii_uppercase) for _ in range(3))
                    return f"{letters}-{rng.randint(1000, 99999)}"
                if kind == "version":
                    return f"{rng.randint(1, 4)}.{rng.randint(0, 12)}.{rng.randint(0, 9)}"
                if kind == "arn":
                    return f"arn:aws:iam::{rng.randint(10**11, 10**12 - 1)}:role/{f.word()}-{f.word()}"
                if kind == "path":
                    return f"{f.word()}/{f.word()}/{f.word()}.{rng.choice(_EXTENSIONS)}"
                if kind == "file":
                    return f"{f.word()}-{f.word()}.{rng.choice(_EXTENSIONS)}"
                if kind == "host":
                    return str(f.domain_name())
                if kind == "ip":
                    return str(f.ipv4()) + ("/24" if "cidr" in name else "")
                if kind == "color":
                    return str(f.color_name())
                if kind == "url":
                    return f"https://example.com/{f.slug()}"
                if kind == "image":
                    return f"https://example.com/{f.slug()}.{rng.choice(('png', 'jpg', 'svg'))}"
                if kind == "hex":  # a digest: SHA-256 long (`hash while` said nothing a checksum holds)
                    return "".join(rng.choice("0123456789abcdef") for _ in range(64))
                if kind == "stamp":
                    return self.future_moment()
                if kind == "name":
                    if _PERSON_DESCRIBED.search(description):
                        return None  # a person's name: the generic rules give one
                    return f"{f.word().lower()}-{f.word().lower()}-{rng.randint(1, 99)}"
                return rng.choice(_VOCABULARY[kind])
        return None

    def _string(self, name: str, fmt: Any) -> str:
        f = self.faker
        if fmt in _INTEGER_TEXT:  # Google's int64 fields: a number written as text ("manifest size bytes human")
            return str(self.rng.randint(1, 5000))
        if fmt in _DECIMAL_TEXT:
            return f"{self.rng.uniform(1, 1000):.2f}"
        if fmt == "byte":  # base64 ("fingerprint area")
            return base64.b64encode(bytes(self.rng.getrandbits(8) for _ in range(9))).decode()
        if fmt == "date" or re.search(r"(^|_)(date|day|check_in|check_out|birthday|due)$", name):
            return self.future_date().isoformat()
        if (
            fmt == "date-time"
            or name.endswith(("_at", "datetime", "start", "end", "start_time", "end_time"))
            or (fmt is None and _STAMP_NAME.search(name))
        ):
            return self.future_moment()
        if fmt == "time" or re.search(r"(^|_)time$", name):
            return f"{self.rng.randint(9, 20):02d}:{self.rng.choice(['00', '30'])}"
        if fmt == "email" or "email" in name:
            return str(f.email())
        if fmt in URL_FORMATS:  # a callback URI: an address, not "growth"
            return f"https://example.com/{f.slug()}"
        if fmt == "phone" or "phone" in name:
            return str(f.phone_number())
        if _FIRST_NAME.search(name):  # (before the "…name" rule below: "first name Despite its level")
            return str(f.first_name())
        if _LAST_NAME.search(name):
            return str(f.last_name())
        if _USER_NAME.search(name):
            return str(f.user_name())
        if name.endswith("name") and any(w in name for w in ("guest", "customer", "owner", "passenger", "holder")):
            return str(f.name())
        if name in ("name", "full_name", "contact_name", "payee_name", "recipient", "person"):
            return str(f.name())
        if "city" in name:
            return str(f.city())
        if "country" in name:
            return str(f.country())
        if "address" in name:
            return str(f.address()).replace("\n", ", ")
        if "currency" in name:
            return "USD"
        if name.endswith(("title", "subject", "name", "label")):
            return str(f.sentence(nb_words=3)).rstrip(".")
        if is_free_text(name):
            return str(f.sentence(nb_words=8))
        return str(f.word())


# strings a spec leaves undescribed, by what their name says they hold (`ValueMaker._by_name`); checked in order
_NAMED: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), kind)
    for pattern, kind in (
        (r"(^|_)version$", "version"),
        (r"(^|_)arn$", "arn"),
        (r"(^|_)time_?zone$", "timezone"),
        (r"(^|_)(region|location|zone|availability_zone|datacenter)$", "region"),
        (r"(^|_)(path|folder|directory)$", "path"),
        (r"(^|_)(file|file_?name)$", "file"),
        (r"(^|_)(content_type|mime_type|media_type)$", "mime"),
        (r"(^|_)(host_?name|host|domain|domain_name|fqdn)$", "host"),
        (r"(^|_)(ip|ip_address|ipv4|cidr|cidr_block)$", "ip"),
        (r"(^|_)(language|lang|locale)$", "language"),
        (r"(^|_)(environment|stage)$", "environment"),
        (r"(^|_)sku$", "sku"),
        (r"(^|_)(type|kind|mode|tier|category|plan|edition|class)$", "kind"),
        (r"(^|_)status$", "status"),  # (not `state`: an address's)
        (r"(^|_)colou?r$", "color"),
        (r"(^|_)(url|uri|link|href)$", "url"),  # `selfLink`, `documentationLink`: an address, not "hotel"
        (r"(^|_)(logo|image|icon|avatar|photo|picture|thumbnail)(_url|_uri)?$", "image"),  # `logo`: not "around"
        (r"(^|_)(hash|checksum|digest|sha256|sha1|md5)$", "hex"),
        (r"(^|_)timestamp$", "stamp"),  # Google's `creationTimestamp`: RFC 3339 text with no format
        (r"^name$", "name"),  # a resource's own name: `deployment-orchid`, not a person's (unless described so)
    )
)
_VOCABULARY: dict[str, tuple[str, ...]] = {
    "region": ("eastus", "westeurope", "northeurope", "us-east-1", "eu-west-1", "us-west-2", "europe-west1"),
    "language": ("en", "de", "fr", "es", "pt", "ja"),
    "timezone": ("Europe/Lisbon", "America/New_York", "Asia/Tokyo", "Europe/Berlin", "UTC"),
    "environment": ("production", "staging", "development"),
    "kind": ("Standard", "Basic", "Premium", "Default", "Custom", "Shared", "Dedicated"),
    "status": ("active", "pending", "inactive"),
    "mime": ("application/json", "text/csv", "text/plain", "image/png", "application/pdf"),
}
_EXTENSIONS = ("json", "csv", "py", "txt", "yaml")
_FIRST_NAME = re.compile(r"(^|_)(first_?name|given_?name|forename)$")
_LAST_NAME = re.compile(r"(^|_)(last_?name|family_?name|surname)$")
_USER_NAME = re.compile(r"(^|_)(user_?name|login_?name|screen_?name)$")
URL_FORMATS = frozenset({"uri", "url", "uri-reference", "iri", "iri-reference"})  # a string that is an address
_INTEGER_TEXT = frozenset({"int64", "int32", "uint64", "uint32", "integer", "long"})  # a string's format
_DECIMAL_TEXT = frozenset({"double", "float", "decimal", "number"})
_CLOUD = re.compile(r"region|azure|resource|data ?cent(?:er|re)|availability|zone|cloud", re.IGNORECASE)
# a `name` whose description says it is a person's ("The user's full name", "Name of the contact")
_PERSON_DESCRIBED = re.compile(
    r"\b(person|people|user|customer|member|contact|employee|patient|author|owner|guest|passenger|student|"
    r"full name|first name|last name|given name|family name)s?\b",
    re.IGNORECASE,
)
_CODE_LANGUAGE = re.compile(r"programming|source code|repositor|\bcode\b", re.IGNORECASE)

# a description that says the value is an email address: "Email addresses of everyone who must be free", "The
# recipient's email address" (not "Whether to send an email")
_EMAIL_DESCRIBED = re.compile(
    r"^\W*(?:(?:[\w'’-]+\s+){0,3}e-?mail\s+address(?:es)?|e-?mail)\b"
    r"(?!\s+(?:body|subject|message|text|content|template|thread)\b)",
    re.I,
)
# a description that says the value is a phone number: "Telephone numbers of each of the recipients", "The
# customer's mobile number" (not "Whether the phone number is verified", "The type of phone number", "Phone number
# format"): only articles and possessives before it, nothing that makes it a property of the number after it
_PHONE_DESCRIBED = re.compile(
    r"^\W*(?:(?:the|a|an|one|or|more|list|of|each|all|valid|[\w-]+['’]s)\s+){0,4}(?:tele)?(?:phone|mobile|cell)\s+"
    r"numbers?\b(?!\s+(?:format|type|country|code|prefix|extension|verification|verified|status)\b)",
    re.I,
)
# a field that holds a moment: named so (`updated`, `created_on`, `last_modified`), or described so ("Last
# modification time of the task (as a RFC 3339 timestamp)."): Google's specs give no format, and their records
# said "updated": "event"
# (not `deleted`, `completed`, `expires`: flags and durations as often; not a bare "timestamp" in a description:
# "sort by name or timestamp", "Unix timestamp in seconds")
_STAMP_NAME = re.compile(r"^(last_)?(updated|created|modified|timestamp)(_on|_time)?$")
_STAMP_DESCRIBED = re.compile(r"^(?!.*\b(duration|interval|period|format)\b).*\b(rfc\s?3339|iso\s?8601)\b", re.I | re.S)
_READABLE = string.ascii_letters + string.digits
_PATTERN_TRIES = 4
_MADE_LIMIT = 10_000  # characters of a made value: what a compiled schema bounds a string to
_REPEAT_LIMIT = 12  # an unbounded repeat (`*`, `+`) as a person writes it, not up to a hundred times


class SeededXeger(rstr.Rstr):
    """Strings that match a pattern (rstr's xeger), the same for the same seed in every process, and readable:
    "any character", a negated class and "not a space" drawn from letters and digits in a fixed order (rstr
    draws a negated class from a set, whose order follows each process's string-hash seed, so two workers made
    two different scenarios of one spec), unbounded repeats kept short."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(
            rng, printable=_READABLE, nonwhitespace=_READABLE, whitespace=" ", nonword="-", nondigits=_READABLE[:52]
        )
        self._cases = {
            **self._cases,
            "not_literal": lambda x: self._random.choice(_READABLE.replace(chr(x), "") or "-"),
        }

    def _handle_in(self, value: Any) -> Any:
        candidates = list(chain(*(self._handle_state(i) for i in value)))
        if candidates and candidates[0] is False:
            excluded = set(candidates[1:])
            candidates = [c for c in _READABLE + "-_." if c not in excluded] or ["-"]
        return self._random.choice(candidates)

    def _handle_repeat(self, start_range: int, end_range: int, value: Any) -> str:
        # (rstr's own caps the end at 100 whatever the start: `x{300}` raised, and its values were never made)
        times = self._random.randint(start_range, min(end_range, max(start_range, _REPEAT_LIMIT)))
        return "".join("".join(self._handle_state(i) for i in value) for _ in range(times))


def pattern_value(rng: random.Random, pattern: str) -> str | None:
    """A string matching a schema's `pattern`, as readable as the pattern allows (`SeededXeger`), the
    shortest of a few draws; None when the pattern cannot be read (a lookaround...) or nothing drawn matches."""
    shortest = shortest_match(pattern)
    if shortest is None or shortest > _MADE_LIMIT:  # no value of it we would keep (`x{30000000}`: 30 MB a draw)
        return None
    maker = SeededXeger(rng)
    made: list[str] = []
    for _ in range(_PATTERN_TRIES):
        try:
            value = str(maker.xeger(pattern))
        except Exception:  # rstr reads a subset of regular expressions
            return None
        if len(value) <= _MADE_LIMIT and _matches(pattern, value):  # (nested repeats can still outgrow it)
            made.append(value)
    return min(made, key=len) if made else None


def _fits_string(value: str, schema: dict[str, Any]) -> bool:
    """A made string meets the schema's pattern and lengths."""
    pattern = schema.get("pattern")
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    return (
        (not isinstance(pattern, str) or _matches(pattern, value))
        and (not isinstance(lo, int) or len(value) >= lo)
        and (not isinstance(hi, int) or len(value) <= hi)
    )


def _matches(pattern: str, value: str) -> bool:
    """Whether a made value fits a schema's pattern, matched under a time limit (the patterns come from specs and
    environments: `(a|a){40}` backtracked for ever here, in a batch's worker); one that cannot be told in time
    does not fit. A pattern the matcher cannot read constrains nothing here."""
    found = search(pattern, value)
    return found if found is not None else not readable(pattern)


def learned_bounds(message: str) -> dict[str, tuple[float, float]]:
    """Bounds a tool stated in an error ("duration_minutes must be between 15 and 480"): a privileged
    solver may read the environment's answers and try again inside them."""
    return {m[0]: (float(m[1]), float(m[2])) for m in _BOUND.findall(message)}


def _plain(schema: dict[str, Any]) -> dict[str, Any]:
    """`anyOf: [T, null]` as T (optional parameters)."""
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            concrete = [o for o in options if isinstance(o, dict) and o.get("type") != "null"]
            if concrete:
                return {**{k: v for k, v in schema.items() if k != key}, **concrete[0]}
    return schema


def _bounds(schema: dict[str, Any], default: tuple[float, float]) -> tuple[float, float]:
    lo = schema.get("minimum", schema.get("exclusiveMinimum", default[0]))
    hi = schema.get("maximum", schema.get("exclusiveMaximum", max(default[1], lo)))
    return (lo, hi) if lo <= hi else (lo, lo)


def fits(value: Any, schema: dict[str, Any]) -> bool:
    """Whether a value read from the state has the parameter's JSON type (so it may be passed as is)."""
    schema = _plain(schema)
    if schema.get("enum"):
        return value in schema["enum"]
    kind = schema.get("type")
    if isinstance(kind, list):
        return any(fits(value, {**schema, "type": k}) for k in kind)
    checks: dict[str, Any] = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
        "null": lambda v: v is None,
    }
    return checks.get(str(kind), lambda v: v is not None)(value)
