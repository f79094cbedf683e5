"""Schema-derived dependency edges: what the tools' JSON schemas already say, beside the embeddings.

The similarity edges miss pairs whose descriptions differ although the schemas leave no doubt: a
stock's `price` placed in an order, the `zipcode` that `estimate_distance(cityA)` documents as "the
zipcode of the first city", a shop's `shopLocation` as a navigation `destination`. These rules read
names, types and descriptions of the tools' inputs and outputs (`params.ParamSpec`, as the graph
stores them) and relate an output of one tool to an input of *another tool of the same environment*
(an id or a value means something in its own environment's state; what travels between environments
stays the similarity's business):

1. `record_id` — an id-shaped input `X_id` (or a plain `id` of a tool about X) takes the id of an X:
   an output named `X_id` (the record-id names of `params`: `HotelSummary.id` → `hotel_id`; a list of
   them, `paper_ids`, feeds one `paper_id`), or the X record itself (an output named X of unknown
   shape, as a tool without an output schema returns its noun);
2. `same_name` — the same name on both sides (each side's qualifier-free alias counts: `account_id`
   feeds `from_account_id`), unless the name says nothing of what the value is (`status`, `message`,
   `name`, `type`...: `GENERIC`);
3. `list_item` — a list output feeds an input taking one of its items: named after them
   (`stock_list` → `stock`, `paper_ids` → `paper_id`), or documented as "a list of X" (`stock_list`,
   "List of stock symbols" → `symbol`);
4. `mention` — the input's description says what its value is, and that is an output: `cityA`, "The
   zipcode of the first city." ← `zipcode`; `travel_from`, "The 3 letter code of the departing
   airport" ← `nearest_airport`. The description's head phrase counts, and for a head that only
   refers to something (code, name, amount of...) the phrase after "of";
5. `kind` — both are values of one kind (`KINDS`): money (a `price`, a `budget_limit`, an
   `exchanged_value` "after the exchange"), a place (`shopLocation` → `destination`), a file-system
   entry (the listed `current_directory_content` → `cat(file_name)`, `cd(folder)`), or a measure in
   one unit (a `fuelLevel` "in gallons" → `gallon_to_liter(gallon)`). A name's head word decides; a
   head that only measures or refers (`limit`, `level`, `name`) passes to the words before it; a
   name with nothing of a kind in it (`value`, `fuelLevel`) takes it from its description, then —
   for an input as vague as `value` — from its tool's description.

Always: types must fit (`flows_into`: a string id never feeds an integer one, a list feeds one of its
items), booleans are flags, not values passed on, and a tool never feeds itself. Rules 3–5 leave out
id-shaped inputs (ids are rules 1–2's), choices among fixed options (enums), inputs for something new
("the name of the new file"), search bounds (`max_price`, a numeric `year_from`: the user's
constraints), id-shaped outputs and echoes (an output named like one of its own tool's inputs is that
input handed back). A pair the similarity already relates is left as it is.

The edges are ordinary Parameter_Relate pairs (so `validate_parameter` and the sampler use them)
with `found_by="schema"`, `rule` and a `reason`; a Tool_Depend edge only they create has
`found_by="schema"` too. `add_schema_edges` works on a built graph's nodes alone, so a graph saved
before these rules gains exactly the edges a fresh build adds (`io.load_graph` does that).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from envfactory.toolgraph.graph import PARAMETER, PARAMETER_RELATE, TOOL, TOOL_DEPEND, ToolGraph
from envfactory.toolgraph.params import ParamSpec
from envfactory.words import singular, split_words, tokens, tool_noun, unqualified

# Bump when the rules change: a graph saved with another version gets its schema edges redone on load.
SCHEMA_RULES_VERSION = 1

Rule = Literal["record_id", "same_name", "list_item", "mention", "kind"]

# Names made only of these say nothing of what the value is: `status` of a navigation is no `status`
# of an order. Heads among them do not identify a subject either.
GENERIC = frozenset(
    {"id", "status", "type", "kind", "name", "value", "result", "list", "content", "data", "info", "detail"}
    | {"message", "count", "number", "amount", "level", "code", "text", "description", "mode", "option"}
    | {"output", "input", "response", "success", "error", "metadata", "item", "entry", "total", "state"}
    | {"format", "flag", "field", "key", "object", "string", "time", "date", "limit", "setting"}
)
# Heads that refer to a thing (`file_name` names a file) or measure one (`budget_limit`, `fuel_level`):
# the value is of the kind of the words before them, and in a description, of the phrase after "of".
REFERENCE = frozenset({"id", "identifier", "name", "code", "number", "key", "handle", "path", "symbol"})
MEASURE = frozenset({"amount", "limit", "level", "value", "quantity", "total", "sum"})
# A list's items, when its head says only that it holds things: `current_directory_content` lists a
# directory's entries.
MEMBERS = frozenset({"content", "entry", "item", "member", "element", "list", "result", "all"})
CONTAINERS = frozenset({"list", "array", "set", "collection", "all"})

# Kinds of values that flow between tools under different names, by the words that name them.
KINDS: dict[str, frozenset[str]] = {
    "money": frozenset(
        {"price", "cost", "budget", "fee", "fare", "balance", "payment", "salary", "wage", "refund", "money"}
        | {"exchange", "usd", "eur", "gbp", "jpy", "cny", "rmb", "dollar", "euro", "yen", "cash", "deposit"}
    ),
    "place": frozenset({"location", "destination", "address", "place", "venue", "street"}),
    "file": frozenset({"file", "filename"}),
    "folder": frozenset({"folder", "directory", "dir"}),
}
# What a container of a kind holds: a listing of a directory's contents is files and folders.
KIND_MEMBERS: dict[str, frozenset[str]] = {"folder": frozenset({"file", "folder"})}
# Units: a measure in one unit is a kind of its own ("in gallons" never feeds "in liters").
UNITS: dict[str, str] = {
    **dict.fromkeys(("gallon", "gal"), "gallon"),
    **dict.fromkeys(("liter", "litre"), "liter"),
    **dict.fromkeys(("km", "kilometer", "kilometre"), "km"),
    **dict.fromkeys(("mile", "mi"), "mile"),
    **dict.fromkeys(("meter", "metre"), "meter"),
    **dict.fromkeys(("celsius",), "celsius"),
    **dict.fromkeys(("fahrenheit",), "fahrenheit"),
    **dict.fromkeys(("kg", "kilogram"), "kg"),
    **dict.fromkeys(("volt",), "volt"),
    **dict.fromkeys(("psi",), "psi"),
}
_MEASURE_KINDS = frozenset({"money"})  # with the units: what a number's description may state anywhere
_WORD_KIND: dict[str, str] = {w: k for k, words in KINDS.items() for w in words} | {
    u: f"unit:{k}" for u, k in UNITS.items()
}

# Words a name or a description phrase stops at: what follows qualifies what came before.
_PREPOSITIONS = frozenset(
    {"of", "to", "for", "from", "in", "at", "on", "by", "with", "per", "that", "which", "who", "whose", "as"}
    | {"into", "after", "before", "between", "under", "over", "if", "when", "where", "and", "or", "is", "are"}
)
_BOUND_WORDS = frozenset({"max", "min", "maximum", "minimum", "lower", "upper", "least", "most"})
_RANGE_ENDS = frozenset({"from", "to", "since", "until", "after", "before"})
_DETERMINERS = frozenset({"the", "a", "an", "this", "that", "its", "their", "one", "each", "any", "some", "all"})
_NOT_ADDED = frozenset({"optional", "required", "enum", "default"})  # BFCL's "[Optional] ..." markers
_SENTENCE = re.compile(r"[.;:(\n]|\s-\s")

_REASONS: dict[Rule, str] = {
    "record_id": "schema: the input is the id of the record the output is (or identifies)",
    "same_name": "schema: the same name and a fitting type",
    "list_item": "schema: the output lists what the input takes one of",
    "mention": "schema: the input's description says its value is the output",
    "kind": "schema: both are values of one kind",
}


# ---- types --------------------------------------------------------------------------------------------


def _base(t: str) -> tuple[bool, str]:
    if t.startswith("array"):
        inner = t[6:-1] if t.startswith("array<") and t.endswith(">") else "any"
        return True, inner or "any"
    return False, t


def _scalar_fits(out: str, into: str) -> bool:
    if "any" in (out, into) or out == into:
        return True
    return out == "integer" and into == "number"  # a count is a number; a number is no integer


def flows_into(out_type: str, in_type: str) -> bool:
    """Whether a value of JSON type `out_type` (as `params.schema_type` writes it) can be passed as
    `in_type`: the same type, unknown on either side, an integer as a number, a list as one of its
    items (`array<string>` → `string`), one item as a list of them; never a boolean, never an object
    for a scalar, never a string id for an integer one."""
    arr_o, o = _base(out_type)
    arr_i, i = _base(in_type)
    if "boolean" in (o, i):
        return False
    if not arr_o and o == "any":
        return True
    if arr_o and not arr_i and i == "any":
        return True
    return _scalar_fits(o, i)


# ---- what a parameter is about ---------------------------------------------------------------------------


Words = tuple[str, ...]
_CACHE = 1 << 16  # names and descriptions repeat across a pool's tools: each is read once


def _clean(words: Iterable[str]) -> Words:
    """Singular words without ordinal marks (`cityA` → city, `file_name1` → file name)."""
    return tuple(singular(w) for w in words if (not w.isdigit() and len(w) > 1) or w in ("x", "y", "z"))


@lru_cache(maxsize=_CACHE)
def _tokens(name: str) -> Words:
    return tuple(tokens(name))


@lru_cache(maxsize=_CACHE)
def _plain(name: str) -> Words:
    """The name's words without leading qualifiers and ordinal marks."""
    return _clean(unqualified(name))


@lru_cache(maxsize=_CACHE)
def _name_variants(name: str) -> frozenset[Words]:
    return frozenset(v for v in (_tokens(name), tuple(unqualified(name)), _plain(name)) if v)


def _lists_contents(name: str) -> bool:
    """`current_directory_content`, `folder_entries`: a list of what something holds, not of those things."""
    words = [w for w in _plain(name) if w not in CONTAINERS]
    return len(words) > 1 and words[-1] in MEMBERS


@lru_cache(maxsize=_CACHE)
def name_core(name: str, is_list: bool = False) -> Words:
    """The words that say what a value is: qualifiers off (`from_account_id` → account id), ordinal
    marks off (`cityA`), cut at a preposition (`price_per_night` → price); for a list, container words
    off (`stock_list` → stock) and a head that only holds things passes to the words before it
    (`current_directory_content` → current directory)."""
    words = _plain(name)
    for k, w in enumerate(words):
        if w in _PREPOSITIONS and k > 0:
            words = words[:k]
            break
    if is_list:
        while len(words) > 1 and words[-1] in CONTAINERS:
            words = words[:-1]
        while len(words) > 1 and words[0] in CONTAINERS:
            words = words[1:]
        while len(words) > 1 and words[-1] in MEMBERS:
            words = words[:-1]
    return words


def _is_id(p: ParamSpec) -> bool:
    toks = _tokens(p.name)
    return bool(toks) and toks[-1] in ("id", "uuid", "guid", "token", "key", "handle")


@lru_cache(maxsize=_CACHE)
def _sentence_words(text: str) -> Words:
    first = _SENTENCE.split(text.strip(), maxsplit=1)[0] if text.strip() else ""
    return tuple(w for w in _clean(split_words(first)) if w not in _NOT_ADDED)


@lru_cache(maxsize=_CACHE)
def _phrases(text: str) -> tuple[Words, ...]:
    """What a description says the value is: its head phrase (`The zipcode of the first city` →
    zipcode), and when that head only refers or measures (`The 3 letter code of the departing airport`,
    `The amount of gallon`), the phrase after "of" too."""
    words = _sentence_words(text)
    phrases: list[Words] = []
    k = 0
    while k < len(words) and words[k] in _DETERMINERS:
        k += 1
    for _ in range(2):
        start = k
        while k < len(words) and words[k] not in _PREPOSITIONS:
            k += 1
        phrase = tuple(w for w in words[start:k] if w not in _DETERMINERS)
        if phrase:
            phrases.append(phrase)
        if not phrase or phrase[-1] not in REFERENCE | MEASURE or k >= len(words) or words[k] != "of":
            break
        k += 1
        while k < len(words) and words[k] in _DETERMINERS:
            k += 1
    return tuple(phrases)


def _kinds_of_words(words: Words, measures_only: bool = False) -> set[str]:
    return set(_word_kinds(words, measures_only))


@lru_cache(maxsize=_CACHE)
def _word_kinds(words: Words, measures_only: bool) -> frozenset[str]:
    """The kinds the words name; a tool's description is read for each of its vague inputs: once is enough."""
    kinds = {_WORD_KIND[w] for w in words if w in _WORD_KIND}
    return (
        frozenset(k for k in kinds if k in _MEASURE_KINDS or k.startswith("unit:"))
        if measures_only
        else frozenset(kinds)
    )


def _kinds_of_name(core: Sequence[str]) -> set[str]:
    """Kinds of a name (or a description's head phrase) by its head: the head's kind, or for a head that
    refers or measures, the kinds of the words before it (`budget_limit` → money, `file_name` → file)."""
    if not core:
        return set()
    head = core[-1]
    if head in _WORD_KIND:
        return {_WORD_KIND[head]}
    if head in REFERENCE | MEASURE:
        return _kinds_of_words(tuple(core[:-1]))
    return set()


def _numeric(p: ParamSpec) -> bool:
    return _base(p.json_type)[1] in ("number", "integer", "any")


def _kinds(p: ParamSpec, core: Words, tool_description: str) -> set[str]:
    """What kinds of value `p` is: by its name; for a name that does not say (`value`, `fuel_level`), by
    its description's head phrases and — for a number — by a currency or unit its description states
    anywhere ("in gallons", "after the exchange"); for an input named as vaguely as `value`, a number,
    by what its tool's description says of money or units."""
    kinds = _kinds_of_name(core)
    if kinds and p.json_type.startswith("array") and _lists_contents(p.name):
        return {m for k in kinds for m in KIND_MEMBERS.get(k, {k})}
    if kinds or _is_id(p) or (core and core[-1] not in GENERIC | MEASURE):
        return kinds
    for phrase in _phrases(p.description):
        kinds |= _kinds_of_name(phrase)
    if _numeric(p):
        kinds |= _kinds_of_words(_sentence_words(p.description), measures_only=True)
        if not kinds and p.direction == "input" and all(w in GENERIC | MEASURE for w in core):
            kinds = _kinds_of_words(_sentence_words(tool_description), measures_only=True)
    return kinds


@dataclass
class _Side:
    """One parameter as the rules see it."""

    index: int
    p: ParamSpec
    is_list: bool
    core: Words
    names: frozenset[Words]  # token tuples of every name it goes by (qualifier-free ones included)
    kinds: set[str]
    is_id: bool = False
    record: Words = ()  # an `X_id` input (or a plain `id` of a tool about X): X
    phrases: tuple[Words, ...] = ()  # inputs: what the description says it is
    items: list[Words] = field(default_factory=list)  # list outputs: what the list holds


def _names(p: ParamSpec) -> frozenset[Words]:
    if not p.aliases:
        return _name_variants(p.name)
    return frozenset().union(*(_name_variants(n) for n in p.names))


def _side(index: int, p: ParamSpec, tool_description: str, tool_name: str) -> _Side:
    is_list = p.json_type.startswith("array")
    core = name_core(p.name, is_list)
    kinds = _kinds(p, core, tool_description)
    side = _Side(index=index, p=p, is_list=is_list, core=core, names=_names(p), kinds=kinds, is_id=_is_id(p))
    if p.direction == "input":
        side.phrases = _phrases(p.description)
        if side.is_id and _tokens(p.name)[-1] == "id":
            side.record = _plain(p.name)[:-1] or tuple(tool_noun(tool_name))
    elif is_list:
        if core and core[-1] not in GENERIC:
            side.items.append(core)
        words = _sentence_words(p.description)
        for k in range(len(words) - 1):
            if words[k] == "list" and words[k + 1] == "of":
                phrase = _phrases(" ".join(words[k + 2 :]))
                side.items.extend(ph for ph in phrase[:1] if ph[-1] not in GENERIC)
                break
    return side


# ---- the rules ------------------------------------------------------------------------------------------


def _specific(words: Sequence[str]) -> bool:
    return bool(words) and not all(w in GENERIC for w in words)


def _record_id(o: _Side, i: _Side) -> bool:
    if not i.record:
        return False
    if (*i.record, "id") in o.names:
        return True
    # the record itself: a value of unknown shape (or an object) named after it carries its id
    return _base(o.p.json_type)[1] in ("object", "any") and o.core == i.record


def _same_name(o: _Side, i: _Side) -> bool:
    shared = o.names & i.names
    return any(_specific(n) for n in shared)


def _list_item(o: _Side, i: _Side) -> bool:
    if not o.is_list or i.is_list or not o.items:
        return False
    return any(i.core == item or (len(i.core) == 1 and i.core[-1] == item[-1]) or item in i.names for item in o.items)


def _mention(o: _Side, i: _Side) -> bool:
    if not o.core or o.core[-1] in GENERIC:
        return False
    return any(phrase[-1] == o.core[-1] for phrase in i.phrases)


def _kind(o: _Side, i: _Side) -> bool:
    return bool(o.kinds & i.kinds)


def _echo(o: _Side, own_inputs: set[Words]) -> bool:
    return bool(o.names & own_inputs)


def _fresh(i: _Side) -> bool:
    """An input for a new thing (`new_name`, "The name of the new file") takes no earlier value."""
    return "new" in _tokens(i.p.name) or any("new" in phrase for phrase in i.phrases)


def _bound(i: _Side) -> bool:
    """A search bound (`max_price`, `min_rating`, a number `year_from`) is the user's constraint, not a
    value an earlier call hands on."""
    toks = _tokens(i.p.name)
    if set(toks) & _BOUND_WORDS:
        return True
    return _base(i.p.json_type)[1] in ("number", "integer") and bool(toks) and toks[-1] in _RANGE_ENDS


@dataclass
class SchemaPair:
    out_idx: int
    in_idx: int
    rule: Rule


class _Index:
    """One environment's outputs by what the rules look them up by: an input meets only the outputs
    that share a name, an item, a head word or a kind with it, not every output of its environment."""

    def __init__(self) -> None:
        self.names: dict[tuple[str, ...], list[int]] = defaultdict(list)
        self.cores: dict[tuple[str, ...], list[int]] = defaultdict(list)
        self.items: dict[tuple[str, ...], list[int]] = defaultdict(list)
        self.item_heads: dict[str, list[int]] = defaultdict(list)
        self.heads: dict[str, list[int]] = defaultdict(list)
        self.kinds: dict[str, list[int]] = defaultdict(list)

    def add(self, o: _Side) -> None:
        for n in o.names:
            self.names[n].append(o.index)
        self.cores[o.core].append(o.index)
        for item in o.items:
            self.items[item].append(o.index)
            self.item_heads[item[-1]].append(o.index)
        if o.core:
            self.heads[o.core[-1]].append(o.index)
        for k in o.kinds:
            self.kinds[k].append(o.index)

    def candidates(self, i: _Side, value_rules: bool) -> set[int]:
        found: set[int] = set()
        if i.record:
            found.update(self.names.get((*i.record, "id"), ()))
            found.update(self.cores.get(i.record, ()))
        for n in i.names:
            found.update(self.names.get(n, ()))
        if value_rules:
            for n in (*i.names, i.core):
                found.update(self.items.get(n, ()))
            if len(i.core) == 1:
                found.update(self.item_heads.get(i.core[0], ()))
            for phrase in i.phrases:
                found.update(self.heads.get(phrase[-1], ()))
            for k in i.kinds:
                found.update(self.kinds.get(k, ()))
        return found


def schema_pairs(
    outputs: Sequence[ParamSpec],
    inputs: Sequence[ParamSpec],
    tool_names: dict[str, str],
    tool_descriptions: dict[str, str] | None = None,
) -> list[SchemaPair]:
    """Output → input pairs the rules find (indices into `outputs`/`inputs`), the first rule that holds
    for each, in input order then output order. `tool_names` maps "env.tool" to the tool's name."""
    descriptions = tool_descriptions or {}
    outs = [_side(k, p, descriptions.get(p.tool, ""), tool_names.get(p.tool, "")) for k, p in enumerate(outputs)]
    ins = [_side(k, p, descriptions.get(p.tool, ""), tool_names.get(p.tool, "")) for k, p in enumerate(inputs)]
    index: dict[str, _Index] = defaultdict(_Index)
    for o in outs:
        index[o.p.env].add(o)
    own_inputs: dict[str, set[Words]] = defaultdict(set)
    for i in ins:
        own_inputs[i.p.tool] |= i.names
    found: list[SchemaPair] = []
    for i in ins:
        if _base(i.p.json_type)[1] == "boolean" or i.p.env not in index:
            continue
        value_rules = not (i.is_id or i.p.enum or _fresh(i) or _bound(i))
        for k in sorted(index[i.p.env].candidates(i, value_rules)):
            o = outs[k]
            if o.p.tool == i.p.tool or not flows_into(o.p.json_type, i.p.json_type):
                continue
            rule: Rule | None = None
            if _record_id(o, i):
                rule = "record_id"
            elif _same_name(o, i):
                rule = "same_name"
            elif value_rules and not o.is_id and not _echo(o, own_inputs[o.p.tool]):
                if _list_item(o, i):
                    rule = "list_item"
                elif _mention(o, i):
                    rule = "mention"
                elif _kind(o, i):
                    rule = "kind"
            if rule is not None:
                found.append(SchemaPair(o.index, i.index, rule))
    return found


# ---- on a graph -----------------------------------------------------------------------------------------


def _params(graph: ToolGraph) -> tuple[list[ParamSpec], list[ParamSpec]]:
    keys = set(ParamSpec.model_fields)
    outputs: list[ParamSpec] = []
    inputs: list[ParamSpec] = []
    for _, d in graph.g.nodes(data=True):
        if d.get("type") != PARAMETER:
            continue
        p = ParamSpec.model_validate({k: v for k, v in d.items() if k in keys})
        (inputs if p.direction == "input" else outputs).append(p)
    return outputs, inputs


def remove_schema_edges(graph: ToolGraph) -> int:
    """Remove every schema relation, and the Tool_Depend edges only they made (their `via` entries from
    the others); the number of parameter relations removed."""
    g = graph.g
    relate = [
        (a, b)
        for a, b, d in g.edges(data=True)
        if d["type"] == PARAMETER_RELATE and d.get("found_by") == "schema" and d.get("flow")
    ]
    touched: set[tuple[str, str]] = set()
    for a, b in relate:
        tool_a, tool_b = g.nodes[a]["tool"], g.nodes[b]["tool"]
        g.remove_edge(a, b)
        g.remove_edge(b, a)
        data = g.get_edge_data(tool_a, tool_b)
        if data is not None and data["type"] == TOOL_DEPEND:
            # the pair had no other relation (a schema relation is only added where there is none)
            pair = [g.nodes[a]["name"], g.nodes[b]["name"]]
            data["via"] = [v for v in data["via"] if list(v[:2]) != pair]
            touched.add((tool_a, tool_b))
    for tool_a, tool_b in sorted(touched):
        data = g.edges[tool_a, tool_b]
        if data["found_by"] == "schema":
            if data["via"]:  # what is left came later than the rules: the LLM's refinement
                data["found_by"] = "llm"
            else:
                g.remove_edge(tool_a, tool_b)
    graph.changed()
    g.graph.pop("schema_rules", None)
    return len(relate)


def add_schema_edges(
    graph: ToolGraph,
    params: tuple[Sequence[ParamSpec], Sequence[ParamSpec]] | None = None,
    pairs: Sequence[SchemaPair] | None = None,
) -> int:
    """Relate the pairs the rules find (replacing schema edges of an earlier run); the number added.
    `params`: the graph's (outputs, inputs) when the caller has them (the build), else read from its
    nodes; `pairs`: `schema_pairs` of those, when the caller found them already (the build, for its
    classification). Records the rules' version in the graph (`schema_rules`)."""
    remove_schema_edges(graph)
    outputs, inputs = params if params is not None else _params(graph)
    if pairs is None:
        tools = {n: d for n, d in graph.g.nodes(data=True) if d.get("type") == TOOL}
        pairs = schema_pairs(
            outputs,
            inputs,
            {t: str(d.get("name", "")) for t, d in tools.items()},
            {t: str(d.get("description", "")) for t, d in tools.items()},
        )
    added = 0
    for pair in pairs:
        o, i = outputs[pair.out_idx].node_id, inputs[pair.in_idx].node_id
        if graph.g.has_edge(o, i):  # the similarity (or the LLM) relates them already
            continue
        graph.relate(o, i, score=0.0, found_by="schema", reason=_REASONS[pair.rule], rule=pair.rule)
        added += 1
    graph.g.graph["schema_rules"] = SCHEMA_RULES_VERSION
    return added


def schema_edges_stale(graph: ToolGraph) -> bool:
    """Whether `graph` wants its schema edges (re)made: saved before the rules (or with another version
    of them) while its settings have them on."""
    if not graph.settings.schema_edges:
        return False
    return graph.g.graph.get("schema_rules") != SCHEMA_RULES_VERSION
