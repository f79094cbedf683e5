"""Requests and answers of offline conversations (no model): what a user says, and what the assistant reports.

The EnvFactory method refines execution checklists into what real users say; this module does it by
rule, seeded, from the solved trajectory (the LLM path keeps its own prompts):

- **action compression**: a turn's lookups (reads whose result a later call of the turn consumes)
  are not narrated; the request states the turn's goals (its writes, or the read the user wanted);
- **implicit reference**: an id argument is never spoken. A record found by a lookup of the same
  turn is named by what the user knows of it — its name or title, the lookup's criteria ("in
  Lisbon"), and, when the lookup returned several candidates the name does not tell apart, a detail
  only the target has ("the one on 2026-03-12"); a record from an earlier turn is "that booking";
  the user's own customer number (an identity id) is said once, as users do;
- every external value of the turn's calls (names, dates, cities, amounts, free text) appears in the
  request, so that the ground-truth calls follow from it;
- **several phrasings per tool**: written for the bundled environments in
  `prompts/template/conversation/tools.yaml`, derived from the tool's description for any other;
- **answers report results**: the new booking's id and total, the balance, the status, "I couldn't
  find any flights", never a list of tool names; several wordings
  (`prompts/template/conversation/en.yaml`).
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from envfactory.env.compiled import CompiledEnvironment
from envfactory.env.environment import BaseEnvironment
from envfactory.env.metadata import EnvMetadata
from envfactory.errors import InputError
from envfactory.inputs import read_yaml_model
from envfactory.records.models import PlannedCall, ToolResult
from envfactory.records.spoken import DATE_STYLES, mentions, say, unsayable
from envfactory.records.verifier import answer_states
from envfactory.tasks.compiled_refs import id_arguments
from envfactory.tasks.pi_star import LABEL_FIELDS, is_identity, label_of
from envfactory.words import is_bookkeeping, is_free_text, plural, singular, spoken_name

WORDING_FILE = Path("template") / "conversation" / "en.yaml"
PHRASINGS_FILE = Path("template") / "conversation" / "tools.yaml"


class WordingError(InputError):
    """The conversation wording files are missing or malformed."""


class Wording(BaseModel):
    model_config = ConfigDict(extra="forbid")

    openings: list[str]  # the first request of a conversation
    followups: list[str]  # the later ones
    closings: list[str]
    closing_p: float = 0.25
    joins: list[str]  # between two goals of one turn: "{first}, and then {second}"
    fallback_request: list[str]  # {action} {details}
    fallback_question: list[str]  # a read the user wanted: {action} {details}
    earlier_reference: list[str]  # a record of an earlier turn: {noun}
    found_reference: list[str]  # a record a lookup finds: {noun} {label} {criteria}
    found_unnamed: list[str] = ["the {noun} {label} {criteria}"]  # one with no name: {label} is a detail, or empty
    holder_reference: list[str]  # a record named in another one a lookup finds: {noun} {holder} {label} {criteria}
    distinguish: list[str]  # {field} {value}: the detail that picks the target among candidates
    vague_reference: list[str]  # a reference that leaves the choice open: {noun} or {nouns} {criteria}
    clarify_question: list[str]  # the assistant asks which: {count} {noun} {nouns} {criteria} {field} {options}
    clarify_reply: list[str]  # the user answers from what they know: {field} {value}
    identity: list[str]  # the user's own id, said once: {noun} {value}
    own_reference: list[str] = ["my {noun} {value}"]  # a record of the user's that no tool finds: {noun} {value}
    criteria: dict[str, str]  # parameter-name pattern → "in {value}" (first match; "*" last)
    done_write: list[str]  # {noun} {id} {facts}
    done_plain: list[str]  # a write whose result is no record: {facts}
    found_list: list[str]  # {count} {nouns} {items}
    found_none: list[str]  # {nouns}
    found_record: list[str]  # {noun} {label} {facts}
    found_plain: list[str]  # a record with no name or id (a cart): {noun} {facts}
    found_value: list[str]  # {value}
    # tools with no phrasings whose semantics are known (compiled from an API spec): see `SpecTool`
    spec_frames: list[str] = ["{clause}"]
    spec_forms: dict[str, list[str]] = {}
    spec_details: dict[str, list[str]] = {}
    spec_scope: list[str] = [" in {ref}"]
    spec_scope_again: list[str] = [""]  # a namespace said in an earlier turn: {noun} {value}, or "" (left out)
    spec_value: list[str] = ["{name} {value}"]  # a value a request sets or filters by: {name} {value}
    spec_value_described: list[str] = ["{name} {value}"]  # ...whose description names it: {name} {phrase} {value}


class SpecTool(BaseModel):
    """What a compiled tool does, for wording a request by rule: its semantics, the resource's label (what the
    spec calls one record), the argument naming the record it acts on, those naming where it is filed, and
    the state a transition moves it to."""

    semantics: str
    label: str
    id_param: str | None = None
    parents: list[str] = []
    target: Any = None
    records: dict[str, str] = {}  # argument → what the spec calls a record it names (`name_2_id` → "schema")
    scopes: list[str] = []  # arguments naming a namespace the record is in (a resource group, an account)
    phrases: dict[str, str] = {}  # argument → what its description calls it ("email address of the user")


def spec_tools(env: BaseEnvironment) -> dict[str, SpecTool]:
    """A compiled environment's tools as `SpecTool`s (none for an environment written in Python)."""
    if not isinstance(env, CompiledEnvironment):
        return {}
    return {
        o.spec.name: SpecTool(
            semantics=o.semantics,
            label=record_noun(env.resources[o.resource].label),
            id_param=o.id_param,
            parents=[a for a, _ in o.parents],
            target=o.target,
            records={a: record_noun(env.resources[r].label) for a, r in id_arguments(env, o.spec.name).items()},
            scopes=[a for a, _ in o.scopes],
            phrases=_phrases(o.spec.parameters),
        )
        for o in env.plan.operations
    }


def record_noun(label: str) -> str:
    """What a person calls a record of a resource the spec named after an action on it (`/deleteSite`,
    `/list-pipelines`): the noun without the verb ("site", "pipeline"); other labels as they are."""
    found = spoken_name(label).split()
    while len(found) > 1 and found[0] in _ACTIONS:
        found = found[1:]
    return " ".join(found)


def _phrases(parameters: dict[str, Any]) -> dict[str, str]:
    """Parameters whose description is a short noun phrase → that phrase (`noun_phrase`)."""
    out: dict[str, str] = {}
    for name, schema in parameters.items():
        phrase = noun_phrase(str(schema.get("description") or "")) if isinstance(schema, dict) else None
        if phrase is not None:
            out[name] = phrase
    return out


class Phrasings(BaseModel):
    """env → tool → phrasings with `{parameter}` placeholders and `[optional segments]`."""

    model_config = ConfigDict(extra="forbid")

    tools: dict[str, dict[str, list[str]]]


@lru_cache(maxsize=8)
def load_wording(prompts_dir: Path) -> tuple[Wording, Phrasings]:
    def error(message: str) -> WordingError:
        return WordingError(f"conversation wording {message}")

    wording = read_yaml_model(prompts_dir / WORDING_FILE, Wording, error=error)
    return wording, read_yaml_model(prompts_dir / PHRASINGS_FILE, Phrasings, error=error)


# ---- values as words ----------------------------------------------------------------------------


def noun_of(parameter: str) -> str:
    """What an id input names, in words: `hotel_id` → hotel, `from_account_id` → account."""
    noun = spoken_name(parameter.removesuffix("_ids").removesuffix("_id")) or "one"
    return re.sub(r"^(from|to|source|target|destination|origin|new|old|parent) ", "", noun)


def _action(description: str) -> str:
    first = re.split(r"(?<=[a-z0-9\)])[.;:,](\s|$)|\n", description.strip(), maxsplit=1)[0].strip()
    return first[:1].lower() + first[1:] if first else "do this"


_TAGS = re.compile(r"<[^>]{0,200}>")
_PREAMBLE = re.compile(
    r"^(?:this (?:endpoint|operation|action|api|call|method|request)(?: will| can)?"
    r"(?: (?:allows|lets|enables) you to| is used to)?|use this (?:endpoint|operation|api|method) to|allows you to"
    r"|(?:you can )?use this to|used to|use to(?: request an?(?= (?:update|delete|create|cancel) (?:an?|the) ))?)\s+",
    re.IGNORECASE,
)
_THIRD_PERSON = {"is": "be", "has": "have", "does": "do", "goes": "go"}
# a summary that only names the HTTP route it serves: "Handle GET request for patterns", "POST endpoint for users",
# "Handler for DELETE /pets" (the operation's semantics say what it does instead)
_ROUTE = re.compile(
    r"^(?:(?i:handles?|handler|serves?|process(?:es)?)(?: (?i:for|an?|the))? )?"
    r"(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS)"
    r"(?: (?:https? )?(?:requests?|calls?|endpoints?|methods?|operations?|route)\b|\s+/)"
)


def _code_spoken(text: str) -> str:
    """A spec's code spans said as words: "Get a specific `ReservationOrder`." → "Get a specific reservation order."
    (a backticked name is code, not a proper noun: "GitHub" outside backticks stays)."""

    def said(m: re.Match[str]) -> str:
        return spoken_name(m.group(1)) if m.group(1).isidentifier() else m.group(1)

    return re.sub(r"`([^`\n]{1,60})`", said, text)


def imperative(description: str, fallback: str) -> str | None:
    """An API operation's summary as what a user asks for: its first phrase, markup gone, "This endpoint
    allows you to" gone, the third person made an imperative ("Creates a framework" → "create a
    framework", "Returns a list of vaults" → "list vaults"); None when it says nothing usable."""
    text = _code_spoken(_TAGS.sub("", description).replace("&quot;", '"').replace("&amp;", "&"))
    text = re.sub(r"\{(\w+)\}", r"\1", text).replace("{", "").replace("}", "")  # a path template's {type}
    text = re.split(r"(?<=[A-Za-z0-9\)])[.;:!?](\s|$)|\n|\s\(", text.strip(), maxsplit=1)[0].strip()
    text = _PREAMBLE.sub("", text)
    if _ROUTE.match(text):  # "Handle GET request for patterns": the route, not what a user wants
        return None
    text = re.sub(r"^returns? (?:a |the )?list of ", "list ", text, flags=re.IGNORECASE)
    verb, _, rest = text.partition(" ")
    low = verb.lower()
    if low in _AUXILIARY and "?" in description:  # "Is the name available?": no request in its words
        return None
    if low in _QUESTION and rest:  # "How old is the person in the image?": what the user wants to find out
        verb, rest, low = "find", f"out {low} {rest}", "find"
    if low in _THIRD_PERSON:
        low = _THIRD_PERSON[low]
    elif re.fullmatch(r"[a-z]+(?:ss|sh|ch|x|z)es", low):
        low = low[:-2]
    elif re.fullmatch(r"[a-z]+[^aeiou]ies", low):
        low = low[:-3] + "y"
    elif re.fullmatch(r"[a-z]+[^s]s", low) and low not in ("this", "its", "has"):
        low = low[:-1]
    text = f"{low} {rest}".strip() if verb else ""
    words_ = text.split()
    if not 2 <= len(words_) <= 14 or not re.fullmatch(r"[a-z][a-z-]*", words_[0]) or words_[0] in _NOT_VERBS:
        return None
    return text if len(text) <= 100 else fallback


_CAPITALIZED = re.compile(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)*(?: [A-Z][a-z]+(?:[A-Z][a-z]+)*)*\b")


def resource_words(text: str, nouns: frozenset[str]) -> str:
    """A summary's capitalized or CamelCase words that name the API's records (`nouns`: spoken, singular) as a user
    says them: "list Steps for a given Execution" → "list steps for a given execution", "create a PerfSampleSeries"
    → "create a perf sample series". Other capitalized words stay, a run of them whole (a product, a brand: "Amazon Web
    Services", "Deployment Manager")."""

    def one(m: re.Match[str]) -> str:  # a run of capitalized words is one name ("Deployment Manager": left)
        words = spoken_name(m.group(0))
        return words if singular(words) in nouns else m.group(0)

    return _CAPITALIZED.sub(one, text) if nouns else text


# how a summary names its record by a key after its noun: "… by its ID", "… by Payment Transaction ID", "… by name"
_BY_KEY = r"\s+by (?:its |their |the |an? )?(?:[\w-]+ ){0,3}(?:id|identifier|uuid|name|key)"


def _label_nouns(label: str) -> str:
    """A regex alternation of `label` and its plural ("" for no label)."""
    return "|".join(re.escape(n) for n in dict.fromkeys((label, plural(label))) if n)


def _naming(summary: str, label: str) -> str | None:
    """`summary` up to the words that name the record it acts on, when it ends with them ("retrieve transaction",
    "delete a message", "get a bill payment by Payment Transaction ID" → "retrieve ", "delete ", "get "): the user's
    reference to the record takes their place ("retrieve the transaction with type Basic", not "retrieve transaction
    under the transaction with type Basic"). None when the summary does not end with the record's name."""
    nouns = _label_nouns(label)
    if not nouns:
        return None
    found = re.search(
        rf"(?:\b(?:a|an|the|one|single|specific|existing|given)\s+)*\b(?:{nouns})(?:{_BY_KEY})?$",
        summary,
        re.IGNORECASE,
    )
    if found is None or found.start() == 0:
        return None
    before = summary[: found.start()].split()
    # right after the verb or a preposition ("get details of"), not after another word of a longer name ("get a
    # webhook registration" for a record called "registration")
    if len(before) > 1 and before[-1].lower() not in _BEFORE_A_RECORD:
        return None
    return summary[: found.start()]


_BEFORE_A_RECORD = frozenset({"of", "for", "to", "from", "in", "on", "about", "into", "under", "within", "by", "with"})
_DETERMINERS = frozenset(
    {"a", "an", "the", "one", "single", "specific", "existing", "given", "all", "every", "each", "some", "any"}
    | {"this", "that", "these", "those", "my", "your", "new", "particular", "specified", "certain"}
)


def _qualified_naming(summary: str, label: str, ref: str) -> str | None:
    """`summary` with the record it names said as the user's reference `ref`, where the summary names it with a
    word or two more than its label ("retrieve a single screenshot cluster by its ID" for a record the spec calls
    "cluster", ref "the cluster from before" → "retrieve the screenshot cluster from before"); None unless the
    summary ends with such a name and `ref` says the label (a quoted name alone has no noun to qualify)."""
    nouns = _label_nouns(label)
    if not nouns or not re.search(rf"\b{re.escape(label)}\b", ref):
        return None
    found = re.search(rf"\b((?:[a-z]+ ){{1,2}})(?:{nouns})(?i:{_BY_KEY})?$", summary)  # (the qualifier in lower case)
    if found is None:
        return None
    qualifier = found.group(1).split()
    while qualifier and qualifier[0] in _DETERMINERS:
        qualifier.pop(0)  # "a single screenshot": the qualifier is "screenshot"
    before = summary[: found.start()].split()
    while before and before[-1].lower() in _DETERMINERS:
        before.pop()
    if not qualifier or not before or any(q in _BEFORE_A_RECORD for q in qualifier):
        return None  # nothing to qualify with, or no verb before it ("webhook registration" alone)
    said = re.sub(rf"\b{re.escape(label)}\b", f"{' '.join(qualifier)} {label}", ref, count=1)
    return f"{' '.join(before)} {said}"


def _in_place(clause: str, noun: str, phrase: str, end: int) -> tuple[str, int] | None:
    """`clause` with the record its summary (`clause[:end]`) speaks of in general ("for a given project", "of the
    specified deployment") said as `phrase` ("for that project"), and where the summary now ends; None when the
    summary speaks of no such record. Only the summary's own words are looked in: never a quoted name."""
    head = clause[:end]
    quoted = [m.span() for m in re.finditer(r'"[^"]*"', head)]
    for found in re.finditer(
        rf"\b(?:an?|the) (?:given |specified |particular |certain )?{re.escape(noun)}\b", head, re.IGNORECASE
    ):
        if not any(a < found.end() and found.start() < b for a, b in quoted):
            return clause[: found.start()] + phrase + clause[found.end() :], end + len(phrase) - len(found.group(0))
    return None


def _once(phrases: list[str], said: str = "") -> list[str]:
    """`phrases` (references to records, a lookup's criteria) less those that name only records `said` or a longer
    phrase of them names already: "the "X" history in my execution of the history "X"" says the history once. A
    record counts as named where its quoted name stands beside the same word (its noun: `history "X"` or `"X"
    history`), so a dataset "sales" does not stand for a project "sales". A phrase naming nothing in quotes is kept,
    unless it is said word for word."""
    kept: list[str] = []
    for i, phrase in enumerate(phrases):
        if phrase in said or phrase in phrases[:i]:
            continue
        names = _named_in(phrase)
        longer = [other for other in phrases if len(other) > len(phrase)]
        if names and any(all(any(form in text for form in forms) for forms in names) for text in (said, *longer)):
            continue
        kept.append(phrase)
    return kept


_NOT_NOUNS_BESIDE = frozenset({"the", "a", "an", "my", "that", "this", "of", "in", "for", "under", "with", "to"})


def _named_in(phrase: str) -> list[set[str]]:
    """For each quoted name in `phrase`, how it stands beside its noun: `history "X"` and `"X" history` for the
    word next to it (an article or a preposition is no noun); empty where no word stands beside it."""
    out: list[set[str]] = []
    for m in re.finditer(r'"[^"]+"', phrase):
        forms: set[str] = set()
        before = re.search(r"(\w+)\s+$", phrase[: m.start()])
        after = re.match(r"\s+(\w+)", phrase[m.end() :])
        for word in (before.group(1) if before else None, after.group(1) if after else None):
            if word is not None and word.lower() not in _NOT_NOUNS_BESIDE:
                forms |= {f"{word} {m.group(0)}", f"{m.group(0)} {word}"}
        out.append(forms)
    return out


_ARTICLE = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)
_NOT_NOUNS = re.compile(r"\b(?:id|ids|it is filed under|if|whether|must|should be set|you|your|this|true|false)\b")


def noun_phrase(description: str) -> str | None:
    """A parameter's description as what a user calls the value: its first sentence when that is a short noun
    phrase ("The email address of the user." → "email address of the user"); None otherwise (a sentence, a
    rule, an id the compiler described)."""
    text = _code_spoken(_TAGS.sub("", description)).replace("{", "").replace("}", "").strip()
    text = re.split(r"(?<=[A-Za-z0-9\)])[.;:!?](\s|$)|\n|\s\(", text, maxsplit=1)[0].strip()
    if not _ARTICLE.match(text):
        return None
    text = _ARTICLE.sub("", text)
    found = text.split()
    if not 1 <= len(found) <= 8 or _NOT_NOUNS.search(text.lower()) or not re.fullmatch(r"[A-Za-z][\w '/-]*", text):
        return None
    first, _, rest = text.partition(" ")
    # "Email address" → "email address"; an acronym or a name stays ("ARN of the detector", "Amazon Resource Name")
    proper = sum(c.isupper() for c in first) > 1 or rest[:1].isupper()
    return text if proper else first.lower() + (f" {rest}" if rest else "")


# verbs an API names a resource after when its path is an action (`/deleteSite`, `/create-index`)
_ACTIONS = frozenset(
    {"add", "cancel", "check", "create", "delete", "deregister", "describe", "disable", "enable", "get", "list"}
    | {"patch", "post", "put", "register", "remove", "run", "search", "send", "set", "start", "stop", "update"}
)


def _noun_forms(forms: list[str], label: str) -> list[str]:
    """The request forms that may say `label`: none that say it where it is no noun, a resource named after an
    action (`/deleteSite`: "delete site") or after a path's function word (`POST /batch/any`: "open an any")."""
    if label.split(" ", 1)[0] in _ACTIONS or label in _NO_NOUN:
        return [f for f in forms if "{label" not in f]
    return forms


# words a path may end with that name no record ("POST /batch/any": "open an any")
_NO_NOUN = frozenset(
    {"any", "all", "some", "each", "every", "none", "other", "one", "many", "self", "this", "that", "me", "mine"}
    | {"new", "current", "latest", "bulk", "multiple", "single"}
)
_AUXILIARY = frozenset(
    {"is", "are", "was", "were", "does", "do", "did", "can", "could", "has", "have", "will", "should"}
)
_QUESTION = frozenset({"how", "what", "which", "who", "whom", "whose", "when", "where", "why", "whether"})
_NOT_VERBS = frozenset(
    {"the", "a", "an", "this", "that", "these", "returns", "endpoint", "api", "deprecated", "note"}
    | {"is", "are", "does", "do", "can", "if", "for", "in", "on", "to", "of", "with", "by", "and", "or", "not", "no"}
)


_SALIENT = re.compile(
    r"(status|total|price|amount|balance|cost|fee|rating|date|day|start|check_in|time|seat|nights|party|quantity|level|power)"
)


_MONEY = re.compile(r"(total|price|amount|balance|cost|fee)")


class Count(int):
    """How many items a record's list field holds, told as "error events: 2" (`fact_text`), not "error events 2"."""


def fact_text(field: str, value: Any) -> str:
    """One fact of `facts` as an answer says it: "status confirmed", "error events: 2" (a list's count, said as a
    label and its number: a rule-made singular of a spec's field name reads worse, "1 cach", "1 movy")."""
    if isinstance(value, Count):
        return f"{spoken_name(field) or 'items'}: {int(value)}"
    return f"{spoken_name(field)} {say(value)}"


def _sayable(field: str, value: Any) -> bool:
    """A field of a record a user is told or picks it out by: not an id, not a response's bookkeeping
    (`is_bookkeeping`: page tokens, etags, an envelope's status code), not an opaque value (`unsayable`: a uuid, a
    digest, a type tag)."""
    return field != "id" and not field.endswith("_id") and not is_bookkeeping(field) and not unsayable(value)


def facts(record: dict[str, Any], limit: int = 3, first: str | None = None) -> list[tuple[str, Any]]:
    """The fields worth telling about a record: `first` (the fact asked for), then status, money, dates;
    without those, any other values (a list as its names, or its length as a `Count`). Never a response's
    bookkeeping (`is_bookkeeping`: page tokens, etags) nor an opaque value (a uuid, a digest, a type tag)."""
    chosen: list[tuple[str, Any]] = []
    if first is not None and first in record:
        chosen.append((first, record[first]))

    def plain(k: str, v: Any) -> bool:
        return k != first and k not in LABEL_FIELDS and v not in ("", None) and _sayable(k, v)

    salient = [
        (k, v)
        for k, v in record.items()
        if plain(k, v) and isinstance(v, int | float | str) and not isinstance(v, bool) and _SALIENT.search(k)
    ]
    salient.sort(key=lambda kv: 0 if "status" in kv[0] else 1 if _MONEY.search(kv[0]) else 2)  # stable
    chosen += salient[: max(0, limit - len(chosen))]
    for k, v in record.items():
        if len(chosen) >= limit or any(k == c for c, _ in chosen) or not plain(k, v):
            continue
        if isinstance(v, int | float | str) and not isinstance(v, bool):
            chosen.append((k, v))
        elif isinstance(v, list) and v:
            names = [lab[1] for x in v if isinstance(x, dict) and (lab := label_of(x)) is not None]
            chosen.append((k, ", ".join(names[:3]) if names else Count(len(v))))
    return chosen


def _agree(template: str, values: dict[str, str]) -> str:
    """A count of one takes its noun in the singular: `{nights} nights` with nights 1 reads "1 night"."""

    def one(m: re.Match[str]) -> str:
        return f"{{{m.group(1)}}} {singular(m.group(2))}" if values.get(m.group(1)) == "1" else m.group(0)

    return re.sub(r"{(\w+)} ([a-z]+s)\b", one, template)


def _fill(template: str, values: dict[str, str]) -> str | None:
    """`{name}` placeholders from `values`; a `[segment]` whose placeholders are missing is dropped;
    None when a placeholder outside segments is missing."""

    def segment(m: re.Match[str]) -> str:
        inner = m.group(1)
        names = re.findall(r"{(\w+)}", inner)
        return inner.format(**values) if all(n in values for n in names) else ""

    text = re.sub(r"\[([^\[\]]*)\]", segment, _agree(template, values))
    names = re.findall(r"{(\w+)}", text)
    if not all(n in values for n in names):
        return None
    return re.sub(r"\s+", " ", text.format(**values)).strip()


def _named(value: Any, state: dict[str, Any]) -> Any:
    """Ids inside an object argument (a scene's device settings) as the records' names: the user says
    "the Ceiling light", not "DV-001"."""
    if isinstance(value, list):
        return [_named(v, state) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for k, v in value.items():
        if k.endswith("_id") and isinstance(v, str):
            record = next(
                (r.get(v) for r in state.values() if isinstance(r, dict) and isinstance(r.get(v), dict)), None
            )
            labelled = label_of(record) if record else None
            if labelled is not None:
                out[k.removesuffix("_id")] = labelled[1]
                continue
        out[k] = _named(v, state)
    return out


def _holder_of(result: Any, param: str, value: Any) -> dict[str, Any] | None:
    """The record of a result that holds `value` in its field `param` (the reservation of a restaurant_id)."""
    stack = [result]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get(param) == value:
                return item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def _record_with(result: Any, value: Any) -> dict[str, Any] | None:
    stack = [result]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("id") == value:
                return item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


class Turn(BaseModel):
    """One turn to word: its calls and results, where it starts in the conversation."""

    calls: list[PlannedCall]
    results: list[ToolResult]
    start: int  # the position of its first call among the conversation's calls
    before: dict[str, Any] = {}  # the states when it starts (records an argument names by id inside an object)


class ConversationWriter:
    """Writes the requests and answers of one conversation, turn by turn; seeded for its wording."""

    def __init__(
        self,
        prompts_dir: Path,
        metadata: dict[str, EnvMetadata],
        rng: random.Random,
        ambiguity: float = 0.0,
        spec_tools: dict[str, dict[str, SpecTool]] | None = None,
    ) -> None:
        self.wording, self.phrasings = load_wording(prompts_dir)
        self.metadata, self.rng = metadata, rng
        self.spec_tools = spec_tools or {}  # env → tool → its semantics (compiled environments: worded by rule)
        self.ambiguity = ambiguity  # chance to leave out the detail that tells candidates apart
        # after `request`: (the turn's call after which the assistant asks, its question, the user's reply)
        self.clarification: tuple[int, str, str] | None = None
        self.results: list[ToolResult] = []  # every result so far (earlier turns)
        self.identities_said: set[str] = set()
        self.scopes_said: set[str] = set()  # `param=value` of namespaces said in earlier turns (a resource group)
        self._nouns: dict[str, frozenset[str]] = {}  # what each compiled environment's records are called
        self._earlier_forms: set[str] = set()  # how a request has referred to earlier records (`request`)
        self.style = rng.randrange(DATE_STYLES)  # one user writes dates one way throughout
        self._goal_says: set[str] = set()
        self._goal_asks: frozenset[str] = frozenset()  # the fields a read goal reads back: asked, not known

    # ---- requests -------------------------------------------------------------------------------

    def _noun(self, call: PlannedCall, param: str) -> str:
        """What an id input names, in words: the spec's word for the record (a compiled tool), else the
        parameter's own words (`hotel_id` → hotel)."""
        rule = self.spec_tools.get(call.call.server, {}).get(call.call.name)
        label = rule.records.get(param) if rule is not None else None
        return spoken_name(label) if label else noun_of(param)

    def _names_record(self, call: PlannedCall, param: str) -> bool:
        """Whether an input names a record by its id (a compiled tool says which; else its name does)."""
        rule = self.spec_tools.get(call.call.server, {}).get(call.call.name)
        if rule is not None:
            return param in rule.records
        return param == "id" or param.endswith(("_id", "_ids"))

    def _goals(self, turn: Turn) -> list[int]:
        """Positions (in the turn) of the calls the user asked for: writes, and reads nothing later consumed."""
        consumed = {b.call for c in turn.calls for b in c.bindings if b.source == "output" and b.call is not None}
        goals = [i for i, c in enumerate(turn.calls) if c.kind == "write" or (turn.start + i) not in consumed]
        return goals or [len(turn.calls) - 1]

    def _criteria(
        self, call: PlannedCall, label: str, turn: Turn, all_results: list[ToolResult], depth: int = 0
    ) -> str:
        """A lookup's arguments as words: "in Lisbon", "on 2026-03-12", "of the customer "Ana Costa"" (a
        record an earlier lookup of the turn found: its name, or what found it); a value the label or
        the goal itself already says is not repeated."""
        parts = []
        for b in call.bindings:
            if b.source == "output" and b.call is not None and b.call >= turn.start:
                found = all_results[b.call].result
                record = _record_with(found, b.value) or {}
                labelled = label_of(record)
                if labelled is not None and labelled[1].lower() not in label.lower():
                    part = f'of the {self._noun(call, b.parameter)} "{labelled[1]}"'
                    # a name the lookup's other records share (three accounts of one owner) picks none of them
                    # out: what only this one has goes with it, or the request leaves the choice to a guess
                    others = (
                        [r for r in found if isinstance(r, dict) and r is not record] if isinstance(found, list) else []
                    )
                    if any(r.get(labelled[0]) == labelled[1] for r in others):
                        detail = self._distinguishing(record, [record, *others], self._goal_says, self._goal_asks)
                        if detail is not None:
                            part += " " + self._told_apart(detail)
                    parts.append(part)
                elif labelled is None and depth < 2:  # a booking has no name: say what found it
                    parts.append(self._criteria(turn.calls[b.call - turn.start], label, turn, all_results, depth + 1))
                continue
            said = say(b.value, self.style)
            if b.source == "output" or self._names_record(call, b.parameter) or said.lower() in label.lower():
                continue
            if said.lower() in self._goal_says:
                continue
            for pattern, form in self.wording.criteria.items():
                if pattern == "*" or re.search(pattern, b.parameter):
                    parts.append(form.format(name=spoken_name(b.parameter), value=said))
                    break
        return " ".join(_once([p for p in parts if p]))

    def _reference(
        self,
        param: str,
        value: Any,
        source_call: int | None,
        turn: Turn,
        all_results: list[ToolResult],
        noun: str | None = None,
    ) -> str:
        noun = noun or noun_of(param)
        if source_call is None or source_call < turn.start:  # a record the conversation met before
            form = self.rng.choice(self.wording.earlier_reference)
            unused = [f for f in self.wording.earlier_reference if f not in self._earlier_forms]
            if form in self._earlier_forms and unused:  # "in that history again for that execution again"
                form = self.rng.choice(unused)
            self._earlier_forms.add(form)
            return form.format(noun=noun)
        provider = turn.calls[source_call - turn.start]
        result = all_results[source_call].result
        found = source_call  # the call whose result the record is read from (and a clarification follows)
        record = _record_with(result, value) or {}
        if not record:  # named inside another result (a balance's account): an earlier lookup may list it
            for earlier in range(turn.start, source_call):
                direct = _record_with(all_results[earlier].result, value)
                if direct is not None:
                    provider, result, record = turn.calls[earlier - turn.start], all_results[earlier].result, direct
                    found = earlier
                    break
        labelled = label_of(record)
        label = f'"{labelled[1]}"' if labelled else ""
        criteria = self._criteria(provider, label, turn, all_results)
        if not record:  # the id is a field of another record (a reservation's restaurant): say whose
            holder = _holder_of(result, param, value) or {}
            held = label_of(holder)
            state = turn.before.get(provider.call.server) or {}
            phrase = self.rng.choice(self.wording.holder_reference).format(
                noun=noun,
                holder=_result_noun(provider.call.name, holder, state),
                label=f'"{held[1]}"' if held else "",
                criteria=criteria,
            )
            return re.sub(r"\s+", " ", phrase).strip()
        told: str | None = None  # the field an unnamed record is told by
        if not labelled:
            detail = self._distinguishing(
                record,
                [record, *(r for r in result if isinstance(r, dict))] if isinstance(result, list) else [record],
                self._goal_says,
                self._goal_asks,
            )
            if detail is not None:
                label, told = f"with {spoken_name(detail[0])} {say(detail[1], self.style)}", detail[0]
            # no name to put first: the noun says what it is ("the cluster with status ACTIVE")
            forms = self.wording.found_unnamed
        else:
            forms = self.wording.found_reference
        phrase = self.rng.choice(forms).format(noun=noun, label=label, criteria=criteria)
        candidates = [r for r in result if isinstance(r, dict)] if isinstance(result, list) else []
        if len(candidates) > 1 and record:
            same_label = [c for c in candidates if labelled and c.get(labelled[0]) == labelled[1]]
            unique = labelled is not None and len(same_label) == 1
            detail = (
                (labelled[0], labelled[1])
                if unique and labelled
                else self._distinguishing(record, candidates, self._goal_says, self._goal_asks)
            )
            if detail is not None and self.clarification is None and self.rng.random() < self.ambiguity:
                # ambiguity introduction: the request says only what several records share (the lookup's
                # criteria); the assistant asks which, and the user answers with what tells it apart
                # asked right after the lookup that listed them, before any call takes the one the user means (it
                # followed the call the id was read from, which can come later: an availability check of it)
                self.clarification = self._clarify(noun, criteria, detail, candidates, found - turn.start)
                vague = self.rng.choice(self.wording.vague_reference).format(
                    noun=noun, nouns=plural(noun), criteria=criteria
                )
                return re.sub(r"\s+", " ", vague).strip()
            if not unique and detail is not None and detail[0] != told:
                phrase += " " + self._told_apart(detail)
        return re.sub(r"\s+", " ", phrase).strip()

    def _clarify(
        self, noun: str, criteria: str, detail: tuple[str, Any], candidates: list[dict[str, Any]], after: int
    ) -> tuple[int, str, str]:
        field = detail[0]
        values = [say(c.get(field), self.style) for c in candidates if c.get(field) is not None]
        options = ", ".join(values[:-1]) + f" or {values[-1]}" if len(values) > 1 else "".join(values)
        question = self.rng.choice(self.wording.clarify_question).format(
            count=len(candidates),
            noun=noun,
            nouns=plural(noun),
            criteria=criteria,
            field=spoken_name(field),
            options=options,
        )
        reply = self.rng.choice(self.wording.clarify_reply).format(
            field=spoken_name(field), value=say(detail[1], self.style)
        )
        return after, re.sub(r"\s+", " ", question).strip(), reply

    def _told_apart(self, detail: tuple[str, Any]) -> str:
        """What tells a record apart from its look-alikes, in words: "(the one with check in 2026-01-14)"."""
        return self.rng.choice(self.wording.distinguish).format(
            field=spoken_name(detail[0]), value=say(detail[1], self.style)
        )

    @staticmethod
    def _distinguishing(
        record: dict[str, Any],
        candidates: list[dict[str, Any]],
        said: set[str] | frozenset[str] = frozenset(),
        asked: frozenset[str] = frozenset(),
    ) -> tuple[str, Any] | None:
        """A field of `record` whose value no other candidate shares (not an id, nor a value the request
        already says: a resource group the call names anyway, nor what no user says: a response's bookkeeping,
        an envelope's "status code 200", a uuid; free text last): what picks it out. A field the goal reads back
        (`asked`) only where no other field does."""
        # a field of free text only where nothing else tells the record apart: "the transaction with message Seem
        # reach glass own ten child..." is what no one says while a shorter value does it
        ordered = sorted(record, key=lambda k: (is_free_text(k), 0 if _SALIENT.search(k) else 1, k))
        for field in ordered:
            value = record[field]
            if (
                field in asked
                or not isinstance(value, str | int | float)
                or isinstance(value, bool)
                or not _sayable(field, value)
                or say(value).lower() in said
            ):
                continue
            if sum(1 for c in candidates if c.get(field) == value) == 1:
                return field, value
        if asked:  # what the goal reads back is all that tells them apart (a get returns the whole record): said
            return ConversationWriter._distinguishing(record, candidates, said)
        return None

    def _values(
        self, call: PlannedCall, turn: Turn, all_results: list[ToolResult], spoken: list[str]
    ) -> dict[str, str]:
        values: dict[str, str] = {}
        # what the goal says itself (its cabin, its date): a lookup's criteria do not repeat it
        self._goal_says = {say(b.value, self.style).lower() for b in call.bindings if b.source != "output"}
        # what a read goal reads back is what the user asks for: it picks out no record ("check the balance of the
        # account with balance 5089.75")
        at = next((i for i, c in enumerate(turn.calls) if c is call), None)
        read = turn.results[at].result if at is not None and call.kind == "read" else None
        self._goal_asks = frozenset(read) if isinstance(read, dict) else frozenset()
        for b in call.bindings:
            if b.source == "output":
                noun = self._noun(call, b.parameter)
                values[b.parameter] = self._reference(b.parameter, b.value, b.call, turn, all_results, noun)
            elif b.source == "state" and self._names_record(call, b.parameter) and not is_identity(b.parameter):
                # a record no tool finds: the user's own, which they name by its id
                values[b.parameter] = self.rng.choice(self.wording.own_reference).format(
                    noun=self._noun(call, b.parameter), value=say(b.value)
                )
            elif is_identity(b.parameter):
                key = f"{b.parameter}={b.value}"
                if key not in self.identities_said:
                    self.identities_said.add(key)
                    spoken.append(
                        self.rng.choice(self.wording.identity).format(noun=noun_of(b.parameter), value=say(b.value))
                    )
                values[b.parameter] = ""
            else:
                values[b.parameter] = say(_named(b.value, turn.before.get(call.call.server) or {}), self.style)
        return values

    def _goal_text(self, call: PlannedCall, values: dict[str, str]) -> str:
        env, tool = call.call.server, call.call.name
        options = list(self.phrasings.tools.get(env, {}).get(tool, []))
        self.rng.shuffle(options)
        for option in options:
            text = _fill(option, values)
            if text is not None:
                return text
        spec = self.metadata[env].tool(tool)
        rule = self.spec_tools.get(env, {}).get(tool)
        if rule is not None:
            return self._spec_text(call, values, rule, spec.description)
        details = ", ".join(f"{spoken_name(k)} {v}" if not k.endswith("_id") else v for k, v in values.items() if v)
        forms = self.wording.fallback_question if call.kind == "read" else self.wording.fallback_request
        return self.rng.choice(forms).format(action=_action(spec.description), details=details).strip()

    def request(self, turn: Turn) -> str:
        """The user's words for a turn (call it in order: earlier turns' results become "that booking")."""
        all_results = [*self.results, *turn.results]
        self.clarification = None
        self._earlier_forms = set()  # how this request has referred to earlier records: each way once
        spoken: list[str] = []
        goals = self._goals(turn)
        texts = []
        mentioned: set[str] = set()
        for call in turn.calls:  # the user's own id is said once, whichever call of the turn needs it
            for b in call.bindings:
                key = f"{b.parameter}={b.value}"
                if b.source != "output" and is_identity(b.parameter) and key not in self.identities_said:
                    self.identities_said.add(key)
                    form = self.rng.choice(self.wording.identity)
                    spoken.append(form.format(noun=noun_of(b.parameter), value=say(b.value)))
        for i in goals:
            call = turn.calls[i]
            values = self._values(call, turn, all_results, spoken)
            texts.append(self._goal_text(call, values))
            mentioned |= {v for v in values.values() if v}
        text = texts[0]
        for more in texts[1:]:
            if not re.match(r"I\b|I'", more):  # "..., then could you", not "..., then Could you"
                more = more[:1].lower() + more[1:]
            text = self.rng.choice(self.wording.joins).format(first=text, second=more)
        text = text[:1].upper() + text[1:]
        # every external value of the turn's calls must be in the request: the ground truth follows from it
        missing = []
        scopes = {
            f"{b.parameter}={say(b.value, self.style)}"
            for call in turn.calls
            if (rule := self.spec_tools.get(call.call.server, {}).get(call.call.name)) is not None
            for b in call.bindings
            if b.parameter in rule.scopes
        }
        for call in turn.calls:
            for b in call.bindings:
                if f"{b.parameter}={say(b.value, self.style)}" in self.scopes_said:
                    continue  # a namespace said in an earlier turn: the conversation's context
                if b.source in ("state", "generated", "repeated") and not is_identity(b.parameter):
                    said = say(_named(b.value, turn.before.get(call.call.server) or {}), self.style)
                    if said and not mentions(text, said):
                        missing.append(f"{spoken_name(b.parameter)} {said}")
        if missing:
            text = text.rstrip(".?!") + " (" + "; ".join(dict.fromkeys(missing)) + ")"
        self.scopes_said |= scopes
        if not text.endswith((".", "?", "!", ")")):
            text += "."
        text = re.sub(r"([?!])[.,;]", r"\1", text)  # a question a join follows: "...?. Also" → "...? Also"
        prefix = " ".join(spoken)
        # a user greets once, at the start; later turns just go on, and thanks come now and then
        opening = self.rng.choice(self.wording.openings if not self.results else self.wording.followups)
        closing = self.rng.choice(self.wording.closings) if self.rng.random() < self.wording.closing_p else ""
        continues = opening.strip() and not opening.rstrip().endswith((".", "!", "?"))  # "Hey, ", "And "
        if continues and not prefix and not re.match(r"I\b|I'", text):
            text = text[:1].lower() + text[1:]
        return re.sub(r"\s+", " ", f"{opening}{prefix + ' ' if prefix else ''}{text}{closing}").strip()

    def _spec_text(self, call: PlannedCall, values: dict[str, str], rule: SpecTool, description: str) -> str:
        """A request for a compiled tool, by rule: the spec's own summary as an imperative or what the
        semantics do to the resource, the record acted on as the user knows it, where it is filed, then the
        values it sets (a write) or filters by (a read), each named after its parameter."""
        w = self.wording
        ref = values.get(rule.id_param, "") if rule.id_param else ""
        label = spoken_name(rule.label)
        forms = _noun_forms([f for f in w.spec_forms.get(rule.semantics, []) if "{ref}" not in f or ref], label)
        own = imperative(description, "")
        if own:  # "list Steps for a given Execution" → "list steps for a given execution"
            own = resource_words(own, self._resource_nouns(call.call.server))
        summary = bool(own and (not forms or self.rng.random() < 0.4))
        end = 0  # where the summary's own words end in the clause (`_in_place` looks there only)
        if own and summary:  # the spec's own summary, the record named after it
            named = _naming(own, label) if ref else None  # "retrieve transaction": the summary names the record
            qualified = _qualified_naming(own, label, ref) if ref and named is None else None
            if named is not None:
                clause, end = named + ref, len(named)
            elif qualified is not None:  # "retrieve a single screenshot cluster by its ID" + the cluster from before
                clause, end = qualified, len(qualified) - len(ref)
            else:
                clause, end = own + (self.rng.choice(w.spec_scope).format(ref=ref) if ref else ""), len(own)
        elif forms:
            target = say(rule.target) if rule.target is not None else ""
            clause = self.rng.choice(forms).format(label=label, labels=plural(label), ref=ref, target=target)
        else:
            clause = spoken_name(call.call.name) + (f" {ref}" if ref else "")

        def where(noun: str, phrase: str) -> None:
            """Say where the record is filed: in the summary's place for it ("list steps for a given execution" +
            my execution → "list steps for my execution"), else after the clause ("... under my execution")."""
            nonlocal clause, end
            placed = _in_place(clause, noun, phrase, end) if summary else None
            if placed is not None:
                clause, end = placed
            else:
                clause += self.rng.choice(w.spec_scope).format(ref=phrase)

        for ref_ in _once([values[p] for p in rule.parents if values.get(p)], said=clause):
            where(self._noun(call, next(p for p in rule.parents if values.get(p) == ref_)), ref_)
        for scope in rule.scopes:  # a namespace by its name: "in resource group rg-ops"; once said, context
            if values.get(scope):
                noun = re.sub(r" (id|name)$", "", spoken_name(scope))
                said = f"{scope}={values[scope]}" in self.scopes_said
                ref = self.rng.choice(w.spec_scope_again if said else ["{noun} {value}"])
                if ref:
                    where(noun, ref.format(noun=noun, value=values[scope]))
        skip = {rule.id_param, *rule.parents, *rule.scopes}
        details = [
            v if k in rule.records else self._detail(k, v, rule.phrases.get(k))
            for k, v in values.items()
            if v and k not in skip
        ]
        if details:
            joined = ", ".join(details[:-1]) + f" and {details[-1]}" if len(details) > 1 else details[0]
            forms = w.spec_details.get("read" if call.kind == "read" else "write") or [" with {details}"]
            clause += self.rng.choice(forms).format(details=joined)
        frame = self.rng.choice(w.spec_frames)
        text = re.sub(r"\s+", " ", frame.format(clause=clause)).strip()
        return re.sub(r"\b([Aa]) (?=[aeioAEIO]\w)", r"\1n ", text)  # "a app" → "an app"

    def _resource_nouns(self, server: str) -> frozenset[str]:
        """What a compiled environment's records are called (`SpecTool.label`, spoken, singular)."""
        nouns = self._nouns.get(server)
        if nouns is None:
            rules = self.spec_tools.get(server, {}).values()
            nouns = self._nouns[server] = frozenset(singular(spoken_name(r.label)) for r in rules)
        return nouns

    def _detail(self, parameter: str, value: str, phrase: str | None) -> str:
        """One value a request sets or filters by, named after its parameter or, where the spec describes it
        in a few words, as the spec calls it ("the email address of the user ...")."""
        forms = self.wording.spec_value_described if phrase else self.wording.spec_value
        return self.rng.choice(forms).format(name=spoken_name(parameter), phrase=phrase or "", value=value)

    # ---- answers --------------------------------------------------------------------------------

    def answer(self, turn: Turn, after: dict[str, Any], fact: tuple[str, Any] | None = None) -> str:
        """What the assistant reports after the turn, from its goals' results (`after`: the states then).
        `fact`: what a read-only turn was asked for; the answer states it."""
        parts = []
        for i in self._goals(turn):
            call, result = turn.calls[i], turn.results[i]
            field = fact[0] if fact is not None and i == len(turn.calls) - 1 else None
            parts.append(self._report(call, result, after, field))
        self.results.extend(turn.results)
        text = " ".join(p for p in parts if p)
        if fact is not None and not answer_states(text, fact[1]):  # (the verifier's test: a substring test let
            # "15" say 5, and the task was dropped as unsolved)
            text = text.rstrip(".") + f" ({spoken_name(fact[0])}: {say(fact[1])})."
        return text

    def _report(self, call: PlannedCall, result: ToolResult, after: dict[str, Any], fact_field: str | None) -> str:
        text = self._report_text(call, result, after, fact_field)
        # a record with nothing worth telling beside its id (a compiled API's record of nested objects)
        return re.sub(r"\s*(\(\)|[:;,-]\s*(?=\.$)|now shows\s*(?=\.$)|has\s*(?=\.$))", "", text)

    def _report_text(self, call: PlannedCall, result: ToolResult, after: dict[str, Any], fact_field: str | None) -> str:
        w, value = self.wording, result.result
        rule = self.spec_tools.get(call.call.server, {}).get(call.call.name)
        # a compiled tool's record: what the spec calls one; else the collection's (or the tool's) word for it
        state = after.get(call.call.server) or {}
        noun = rule.label if rule is not None else _result_noun(call.call.name, value, state)
        if isinstance(value, list):
            if not value:
                return self.rng.choice(w.found_none).format(nouns=plural(noun))
            items = [_short(v) for v in value[:3]]
            more = f", and {len(value) - 3} more" if len(value) > 3 else ""
            text = self.rng.choice(w.found_list).format(
                count=len(value), nouns=plural(noun) if len(value) > 1 else noun, items=", ".join(items) + more
            )
            return re.sub(r"\b([Tt]here) are 1 ", r"\1 is 1 ", text) if len(value) == 1 else text
        if isinstance(value, dict):
            told = "; ".join(fact_text(k, v) for k, v in facts(value, 3, fact_field))
            labelled = label_of(value)
            if call.kind == "write":
                if not value.get("id"):  # a result that is no record (a scene applied): what it says
                    return self.rng.choice(w.done_plain).format(facts=told)
                return (
                    self.rng.choice(w.done_write)
                    .format(noun=noun, id=value.get("id", ""), facts=told)
                    .replace(" ()", "")
                )
            if not labelled and not value.get("id"):  # a cart: no name, no id
                return self.rng.choice(w.found_plain).format(noun=noun, facts=told)
            return self.rng.choice(w.found_record).format(
                noun=noun, label=f'"{labelled[1]}"' if labelled else str(value.get("id", "")), facts=told
            )
        return self.rng.choice(w.found_value).format(value=say(value))


def _short(item: Any) -> str:
    if isinstance(item, dict):
        labelled = label_of(item)
        if labelled is not None:
            return labelled[1]
        return ", ".join(fact_text(k, v) for k, v in facts(item, 2)) or str(item.get("id", ""))
    return say(item)


def _result_noun(tool: str, value: Any, state: dict[str, Any]) -> str:
    """What a result is about: the collection its record(s) belong to in the state (book_room returns a
    booking), else the last word of the tool's name."""
    first = value[0] if isinstance(value, list) and value else value
    if isinstance(first, dict) and "id" in first:
        for coll, records in state.items():
            if isinstance(records, dict) and first["id"] in records:
                return spoken_name(singular(coll))
    noun = tool.split("_")[-1] if "_" in tool else "result"
    return singular(noun)
