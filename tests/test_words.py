"""The one words module (`envfactory.words`) over every name in the pool: what each caller's old rule gave.

The names: every tool, parameter (input and output schemas, nested properties, record titles and `$defs`),
state key and field of the pool's environments (the native ones under envs/ and the BFCL suite), and of the
environments compiled from the test corpus (tests/data/corpus) and examples/openapi.

Before the words module, `singular` existed three times with different rules, the name-to-words splitter
twice and the free-text field lists twice. Their old rules are kept below, word for word, as the references:
each caller's old answer on the names it applied its rule to is asserted, and where the old rules disagreed on
a name of the pool the answer kept is listed with why (`KEPT`).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from envfactory.compiler.compile import compile_spec
from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.envgen.openapi import identifier, load_openapi
from envfactory.words import (
    _SINGULAR_S,
    is_bookkeeping,
    is_free_text,
    is_long_text,
    plural,
    singular,
    snake_case,
    split_words,
    spoken_name,
    tokens,
)
from tests.support.paths import ROOT, TEST_DATA

SPECS = [
    *sorted(p for p in (TEST_DATA / "corpus" / "api").rglob("*") if p.suffix in (".json", ".yaml")),
    ROOT / "examples" / "openapi" / "google_tasks.json",
]


# ---- the old rules, as they were ----------------------------------------------------------------------------
def old_pi_star_singular(word: str) -> str:
    """tasks/pi_star.py: collection names (π*'s id binding, quality's identity records, the wording's nouns)."""
    if word.endswith("ies"):
        return word[:-3] + "y"
    if word.endswith(("ses", "xes", "ches", "shes")):
        return word[:-2]
    return word[:-1] if word.endswith("s") else word


def old_exemplars_singular(name: str) -> str:
    """tasks/exemplars.py: collection names (the exemplars' id references, id prefixes of generated records)."""
    if name.endswith("ies"):
        return name[:-3] + "y"
    if name.endswith(("ses", "xes")):
        return name[:-2]
    return name[:-1] if name.endswith("s") else name


def old_names_singular(token: str) -> str:
    """toolgraph/names.py: tokens of names, record words, and the compiler's resource and `<x>_id` names."""
    if len(token) <= 3 or token.endswith(("ss", "us", "is", "ous", "ics")):
        return token
    if token.endswith("ies"):
        return token[:-3] + "y"
    if token.endswith(("sses", "xes", "ches", "shes", "uses")):
        return token[:-2]
    if token.endswith("s"):
        return token[:-1]
    return token


_OLD_SPLIT = re.compile(r"[^A-Za-z0-9]+")
_OLD_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])|(?<=[A-Za-z])(?=[0-9])|(?<=[0-9])(?=[A-Za-z])")


def old_split_words(name: str) -> list[str]:
    name = name.replace("IDs", "Ids")
    return [w.lower() for part in _OLD_SPLIT.split(name) for w in _OLD_CAMEL.split(part) if w]


def old_tokens(name: str) -> list[str]:
    return [old_names_singular(w) if w != "ids" else "id" for w in old_split_words(name)]


def old_spoken_words(name: str) -> str:
    """tasks/spoken.py `words` and tasks/template.py `_words` (the same code twice)."""
    return " ".join(re.sub(r"([a-z])([A-Z])", r"\1 \2", name).replace("_", " ").split()).lower()


_OLD_MASKED = re.compile(r"(description|message|body|note|notes|comment|content|text|reason|review|summary|bio)$")
_OLD_LONG = re.compile(
    r"(description|abstract|text|comment|subject|reason|message|note|notes|request|requests|bio|summary|body)$"
)

# Names of the pool where the old rules disagreed: the answer kept (the toolgraph's rule, the one the compiler
# names `<singular>_id` parameters with, so that π* finds the collection the compiler named) and the old ones.
KEPT: dict[str, tuple[str, str]] = {
    # name: (kept, what pi_star's and exemplars' rule gave)
    "article_phrases": ("article_phrase", "article_phras"),  # a compiled collection (vestorly): `article_phrase_id`
    "aws": ("aws", "aw"),  # a compiled collection (twilio accounts, `credential_aws`): its parameter is `aws_id`
    "status": ("status", "statu"),  # a tool's last word (`get_device_status`): the wording's noun for its result
    "address": ("address", "addres"),  # a tool's last word (`add_address`)
    "phrases": ("phrase", "phras"),  # a tool's last word (`find_article_phrases`)
}


# ---- the names of the pool -------------------------------------------------------------------------------------
class Names:
    def __init__(self) -> None:
        self.all: set[str] = set()
        self.collections: set[str] = set()  # state keys holding records, compiled resources
        self.tools: set[str] = set()

    def schema(self, node: Any) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                self.all.update(k for k in props if isinstance(k, str))
            defs = node.get("$defs")
            if isinstance(defs, dict):
                self.all.update(defs)
            if isinstance(node.get("title"), str):
                self.all.add(node["title"])
            for v in node.values():
                self.schema(v)
        elif isinstance(node, list):
            for v in node:
                self.schema(v)

    def state(self, dump: dict[str, Any]) -> None:
        for key, value in dump.items():
            if isinstance(value, dict) and value and all(isinstance(r, dict) for r in value.values()):
                self.collections.add(key)
                for record in value.values():
                    self.fields(record)
            else:
                self.all.add(key)
                self.fields(value)
        self.all.update(self.collections)

    def fields(self, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and not re.fullmatch(r"[A-Z]+-[\w-]+", k):  # a record id (BK-0001): no name
                    self.all.add(k)
                self.fields(v)
        elif isinstance(value, list):
            for v in value:
                self.fields(v)


@pytest.fixture(scope="module")
def names() -> Names:
    out = Names()
    pool = EnvPool(Settings(root=ROOT))
    for name in pool.names():
        env = pool.get(name)
        for tool in env.metadata.tools:
            out.tools.add(tool.name)
            out.schema(tool.input_schema)
            out.schema(tool.output_schema)
        for scenario in env.scenario_names():
            out.state(env.dump_state(env.new_state(env.scenario(scenario))))
    compiled = 0
    for path in SPECS:
        try:
            plan, _ = compile_spec(load_openapi(path), name=identifier(path.stem), domain="office", source="test")
        except Exception:  # a spec with no environment (only reads): it has no names to give
            continue
        compiled += 1
        for r in plan.resources:
            out.collections.add(r.name)
            out.all.update(n for n in (r.name, r.id_field, r.parent_field) if n)
            out.schema(r.record_schema)
        for op in plan.operations:
            out.tools.add(op.spec.name)
            out.schema(op.spec.input_schema)
            out.schema(op.spec.output_schema)
    out.all |= out.tools | out.collections
    assert compiled >= 10 and len(pool.names()) >= 9  # the table covers the pool, not an empty one
    return out


def _each_word(names: set[str]) -> set[str]:
    """Every name, its snake case and each of its words: all a `singular` was given."""
    return names | {snake_case(n) for n in names} | {w for n in names for w in old_split_words(n)}


def test_the_pool_gives_a_table_worth_checking(names: Names) -> None:
    assert len(names.all) > 1000 and len(names.collections) > 50 and len(names.tools) > 300
    assert {"hotels", "bookings", "article_phrases", "aws"} <= names.collections


def test_singular_is_the_toolgraph_s_rule_on_every_name_and_word(names: Names) -> None:
    words = _each_word(names.all)
    assert [w for w in sorted(words) if singular(w) != old_names_singular(w)] == []


def test_singular_gives_each_caller_s_old_answer_on_the_names_it_was_given(names: Names) -> None:
    """π*, quality and the wording gave collection names and tools' last words to pi_star's rule; the
    exemplars and the state generators gave collection names to theirs. Where they disagreed, `KEPT`."""
    tails = {t.split("_")[-1] if "_" in t else "result" for t in names.tools}
    given = [(old_pi_star_singular, names.collections | tails), (old_exemplars_singular, names.collections)]
    disagree: dict[str, str] = {}
    for old, domain in given:
        for name in sorted(domain):
            if singular(name) != old(name):
                disagree[name] = old(name)
    assert set(disagree) <= set(KEPT), sorted(set(disagree) - set(KEPT))
    for name, gave in disagree.items():
        assert (singular(name), gave) == KEPT[name]


def test_the_old_rules_disagree_only_where_the_table_says() -> None:
    """The disagreements listed are real ones (each old rule gave its answer), not a list that cannot fail."""
    for name, (kept, old) in KEPT.items():
        assert old_names_singular(name) == kept != old == old_pi_star_singular(name)


def test_tokens_and_split_words_are_the_old_ones_on_every_name(names: Names) -> None:
    assert [n for n in sorted(names.all) if split_words(n) != old_split_words(n)] == []
    assert [n for n in sorted(names.all) if tokens(n) != old_tokens(n)] == []
    assert tokens("BookingIDs") == ["booking", "id"] and tokens("paper_ids") == tokens("paper_id")


def test_spoken_name_is_the_old_splitter_on_every_name(names: Names) -> None:
    assert [n for n in sorted(names.all) if spoken_name(n) != old_spoken_words(n)] == []
    assert spoken_name("checkIn_date") == "check in date"


def test_the_free_text_lists_are_the_old_two_on_every_name(names: Names) -> None:
    assert [n for n in sorted(names.all) if is_free_text(n) != bool(_OLD_MASKED.search(n.lower()))] == []
    assert [n for n in sorted(names.all) if is_long_text(n) != bool(_OLD_LONG.search(n.lower()))] == []
    # the two lists differ on purpose, and on names of the pool
    assert is_free_text("content") and not is_long_text("content")
    assert is_long_text("abstract") and not is_free_text("abstract")


def _old_snake_case(text: str) -> str:
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", text)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_").lower()


@settings(max_examples=500, deadline=None)
@given(st.text("ABCabc01-_ .É", max_size=30))
def test_snake_case_gives_the_old_answers_in_linear_time(text: str) -> None:
    """The old first rule, `([A-Z]+)([A-Z][a-z])`, took 15 s on a spec's 20,000-capital name (quadratic in the
    run of capitals); the rule that replaced it gives the same names."""
    assert snake_case(text) == _old_snake_case(text)


def test_a_long_run_of_capitals_is_snake_cased_at_once() -> None:
    assert snake_case("A" * 200_000 + "Bc") == "a" * 200_000 + "_bc"


def test_plural_undoes_singular_on_every_plural_collection_name(names: Names) -> None:
    """The wording says "2 bookings", "the statistics", "3 addresses" with `plural`; on every collection name of the
    pool that `singular` changes (a plural one), `plural` gives the name back."""
    plurals = {c for c in names.collections if singular(c) != c}
    assert len(plurals) >= 40
    assert [c for c in sorted(plurals) if plural(singular(c)) != c] == []


@pytest.mark.parametrize(
    ("noun", "wanted"),
    [
        ("booking", "bookings"), ("city", "cities"), ("day", "days"), ("box", "boxes"), ("match", "matches"),
        ("status", "statuses"), ("address", "addresses"), ("analysis", "analyses"), ("alias", "aliases"),
        ("statistics", "statistics"), ("settings", "settings"), ("photos", "photos"), ("dns", "dns"),
        ("metadata", "metadata"), ("information", "information"), ("child", "children"), ("person", "people"),
        ("schema", "schemas"), ("schemas", "schemas"), ("api", "apis"), ("apis", "apis"), ("sku", "skus"),
        ("skus", "skus"), ("bus", "buses"), ("class", "classes"), ("order_status", "order_statuses"), ("axis", "axes"),
        ("reservation order", "reservation orders"), ("error event", "error events"), ("", ""),
    ],
)  # fmt: skip
def test_plural(noun: str, wanted: str) -> None:
    assert plural(noun) == wanted


@given(st.from_regex(r"[a-z]{1,12}( [a-z]{1,12}){0,2}", fullmatch=True))
@settings(max_examples=500, deadline=None)
def test_a_plural_stays_plural(noun: str) -> None:
    """ "statisticses": the plural of a word already plural is itself, and only the last word changes (but for the
    plural of a word in -si, read as one of -sis: `analyses`, and of a word whose plural is a singular word in -s:
    `ga`, `gas`)."""
    assume(not noun.endswith("si"))
    made = plural(noun)
    assume(made.rsplit(" ", 1)[-1] not in _SINGULAR_S)
    assert plural(made) == made
    assert made.rsplit(" ", 1)[0] == noun.rsplit(" ", 1)[0] or " " not in noun


def test_bookkeeping_is_a_responses_paging_and_caching_fields_and_no_name_of_the_pool_besides(names: Names) -> None:
    """What an answer leaves out (`is_bookkeeping`): on the whole pool (native environments, BFCL's, the compiled
    test corpus) only the compiled APIs' etags and self links; and the paging fields real APIs name."""
    assert sorted(n for n in names.all if is_bookkeeping(n)) == ["etag", "selfLink", "self_link"]
    paging = ["nextPageToken", "page_token", "NextToken", "NextMarker", "Marker", "@odata.nextLink", "cursor"]
    s3 = ["KeyMarker", "NextKeyMarker", "VersionIdMarker", "LastEvaluatedKey", "IsTruncated"]
    assert all(is_bookkeeping(n) for n in [*paging, *s3, "continuationToken", "ETag", "syncToken", "resourceVersion"])
    assert all(is_bookkeeping(n) for n in ["status_code", "statusCode", "httpStatus"])  # "status code 200"
    assert not any(is_bookkeeping(n) for n in ["status", "code", "error_code", "postal_code", "status_message"])
    assert not any(is_bookkeeping(n) for n in ["page", "token", "access_token", "page_size", "next_step", "tag"])
    # facts a user asks about, though their last word is a bookkeeping word elsewhere (a reviewer found them hidden)
    facts_ = ["time_signature", "key_signature", "fingerprint", "sha256Fingerprint", "customSignature"]
    assert not any(is_bookkeeping(n) for n in [*facts_, "dateOfSignature", "@odata.count", "text_cursor"])


def test_a_series_is_one_series() -> None:
    assert singular("series") == "series" and singular("perf_sample_series") == "perf_sample_series"
    assert singular("species") == "species" and singular("stories") == "story"
