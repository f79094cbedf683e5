"""A spec's string field the schema says nothing of (no enum, format or pattern) takes the shape its name asks for:
a review of data made from compiled environments found "runtime version interview", "location chair", "type also"
and "airflow version create" (dictionary words). With `by_name` (compiled environments' states and arguments) a
version is a version, a location a region, an ARN an ARN; without it (hand-written tools, which may check their own
vocabulary) nothing changes."""

from __future__ import annotations

import base64
import random
import re
from datetime import datetime

from faker.providers.lorem.en_US import Provider as Lorem
from hypothesis import given, settings
from hypothesis import strategies as st

from envfactory.tasks.values import _VOCABULARY, ValueMaker

CLOCK = datetime(2026, 5, 1, 9, 0)
WORDS = set(Lorem.word_list)
PREFIX = st.sampled_from(["", "runtime_", "airflow_", "sku_", "dag_s3_", "source_", "default_", "x_"])
SHAPES = {
    "version": re.compile(r"\d+\.\d+\.\d+"),
    "arn": re.compile(r"arn:aws:iam::\d{12}:role/[A-Za-z]+-[A-Za-z]+"),
    "region": re.compile("|".join(map(re.escape, _VOCABULARY["region"]))),
    "path": re.compile(r"[A-Za-z]+/[A-Za-z]+/[A-Za-z]+\.[a-z]+"),
    "file_name": re.compile(r"[A-Za-z]+-[A-Za-z]+\.[a-z]+"),
    "content_type": re.compile(r"[a-z]+/[a-z]+"),
    "ip_address": re.compile(r"\d+\.\d+\.\d+\.\d+"),
    "cidr_block": re.compile(r"\d+\.\d+\.\d+\.\d+/24"),
    "type": re.compile("|".join(_VOCABULARY["kind"])),
    "sku": re.compile(r"[A-Z]{3}-\d{4,5}"),  # a product's own code
    "time_zone": re.compile(r"[A-Z][a-z]+/[A-Za-z_]+|UTC"),  # an area and a city: one capitalized word is not a zone
    "self_link": re.compile(r"https://example\.com/[a-z0-9-]+"),  # an address ("self link hotel" before)
    "creation_timestamp": re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}"),  # ("creation timestamp like")
    "logo": re.compile(r"https://example\.com/[a-z0-9-]+\.(png|jpg|svg)"),  # an image's address ("logo around")
    "checksum": re.compile(r"[0-9a-f]{64}"),  # a digest ("hash while")
    "hash": re.compile(r"[0-9a-f]{64}"),
}


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**31), prefix=PREFIX, field=st.sampled_from(sorted(SHAPES)))
def test_a_named_field_takes_its_shape_and_no_dictionary_word(seed: int, prefix: str, field: str) -> None:
    value = ValueMaker(random.Random(seed), CLOCK).make(prefix + field, {"type": "string"}, by_name=True)
    assert isinstance(value, str) and SHAPES[field].fullmatch(value), (prefix + field, value)
    assert value not in WORDS
    camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), prefix + field)  # a spec's `runtimeVersion`
    nested = ValueMaker(random.Random(seed), CLOCK).make(
        "properties", {"type": "object", "properties": {camel: {"type": "string"}}, "required": [camel]}, by_name=True
    )
    assert SHAPES[field].fullmatch(nested[camel]), (camel, nested)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31), field=st.sampled_from(sorted(SHAPES)))
def test_the_schema_comes_first_and_hand_written_tools_keep_their_values(seed: int, field: str) -> None:
    enum = {"type": "string", "enum": ["ALPHA", "BETA"]}
    assert ValueMaker(random.Random(seed), CLOCK).make(field, enum, by_name=True) in ("ALPHA", "BETA")
    dated = ValueMaker(random.Random(seed), CLOCK).make(field, {"type": "string", "format": "date"}, by_name=True)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", dated)
    # without by_name: the value the maker gave before, draw for draw
    plain = ValueMaker(random.Random(seed), CLOCK).make(field, {"type": "string"})
    again = ValueMaker(random.Random(seed), CLOCK).make(field, {"type": "string"}, by_name=False)
    assert plain == again
    assert not SHAPES[field].fullmatch(plain) or field in ("ip_address",)  # (the generic rules: an address)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_a_location_is_a_region_where_its_description_says_so_and_a_place_elsewhere(seed: int) -> None:
    """An Azure resource's `location` is a region; a meeting's or a user's is a place. A repository's `language` is
    a programming language; a user's a locale."""
    regions = set(_VOCABULARY["region"])

    def make(name: str, description: str) -> str:
        schema = {"type": "string", "description": description}
        return str(ValueMaker(random.Random(seed), CLOCK).make(name, schema, by_name=True))

    assert make("location", "The geo-location where the resource lives") in regions
    assert make("location", "Resource location.") in regions
    for place in (make("location", "Where the meeting takes place."), make("location", "")):
        assert place not in regions and place not in WORDS
    assert make("language", "The repository's main programming language") in (
        "Python",
        "Go",
        "TypeScript",
        "Java",
        "Rust",
    )
    assert make("language", "The user's preferred language") in _VOCABULARY["language"]


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_a_resource_is_named_as_one_and_a_person_where_the_description_says_so(seed: int) -> None:
    """A deployment's or a type provider's `name` is a resource's ("orchid-gateway-7"), not "Julian Wilson" (a review
    of data from Google's Deployment Manager spec); a contact's or a user's is a person's."""

    def make(description: str) -> str:
        schema = {"type": "string", "description": description}
        return str(ValueMaker(random.Random(seed), CLOCK).make("name", schema, by_name=True))

    for description in ("Name of the resource; provided by the client when the resource is created.", ""):
        assert re.fullmatch(r"[a-z]+-[a-z]+-\d{1,2}", make(description))
    for description in ("The user's full name.", "Name of the contact", "The patient's name"):
        person = make(description)
        assert re.fullmatch(r"[A-Z][A-Za-z.']*( [A-Z][A-Za-z.']*)+", person), (description, person)
    plain = ValueMaker(random.Random(seed), CLOCK).make("name", {"type": "string"})  # hand-written tools: a person
    assert " " in plain


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31), by_name=st.booleans(), field=st.sampled_from(["manifest_size_bytes", "fingerprint"]))
def test_a_string_holds_what_its_format_says(seed: int, by_name: bool, field: str) -> None:
    """Google writes int64 fields as strings with format int64 ("manifest size bytes human" before) and bytes as
    base64 (format byte: "fingerprint area"); a URI format is an address."""

    def make(fmt: str) -> str:
        return str(
            ValueMaker(random.Random(seed), CLOCK).make(field, {"type": "string", "format": fmt}, by_name=by_name)
        )

    assert make("int64").isdigit() and make("uint32").isdigit()
    assert re.fullmatch(r"\d+\.\d{2}", make("double"))
    assert len(base64.b64decode(make("byte"), validate=True)) == 9
    for fmt in ("uri", "url", "uri-reference"):  # ETSI's `callbackUri` ("callback uri growth" before)
        assert re.fullmatch(r"https://example\.com/[a-z0-9-]+", make(fmt))


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31), by_name=st.booleans())
def test_a_persons_name_parts_are_name_parts(seed: int, by_name: bool) -> None:
    """`firstName` read "Despite its level" and `username` "Policy human" (the "...name" rule made a title of them)."""

    def make(field: str) -> str:
        return str(ValueMaker(random.Random(seed), CLOCK).make(field, {"type": "string"}, by_name=by_name))

    for field in ("first_name", "firstname", "given_name", "last_name", "lastName", "surname", "family_name"):
        assert re.fullmatch(r"[A-Z][a-zA-Z'-]+", make(field)), (field, make(field))
    for field in ("username", "user_name", "userName"):
        assert re.fullmatch(r"[a-z0-9._-]+", make(field)), (field, make(field))
