"""Ids and values for generated initial states (`envfactory.tasks.state_values`): `IdMaker`'s ids follow the
exemplar's pattern and never repeat, whatever templates come in whatever order; `slug` keeps what an e-mail
or a handle may hold. The values of whole states are checked on the bundled environments in
tests/tasks/test_initial_state.py."""

from __future__ import annotations

import random
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from envfactory.env.pool import EnvPool
from envfactory.tasks import initial_state, state_values
from envfactory.tasks.initial_state import generate_initial_state
from envfactory.tasks.state_values import FieldGenerationError, IdMaker, slug

TEMPLATES = st.one_of(
    st.none(),
    st.sampled_from(["BK-0001", "BK-01", "HT-LIS-01", "7", "RM-QXT", "QXT", "ord_12", "A-9-b", "u-ab9"]),
    st.from_regex(r"[A-Z]{1,3}-?[0-9]{1,5}", fullmatch=True),
    st.from_regex(r"[A-Za-z]{1,3}-[A-Za-z]{1,4}", fullmatch=True),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(TEMPLATES, max_size=60), st.integers(0, 2**32))
def test_ids_never_repeat_and_keep_the_template_pattern(templates: list[str | None], seed: int) -> None:
    maker = IdMaker(random.Random(seed))
    widths: dict[str, int] = {}
    made = []
    for template in templates:
        new = maker.make(template, "REC")
        made.append(new)
        m = re.fullmatch(r"(.*?)(\d+)", template) if template else None
        if template is None or m:  # the stem, then a number of the stem's first width
            stem = m.group(1) if m else "REC-"
            width = widths.setdefault(stem, len(m.group(2)) if m else 4)
            assert new.startswith(stem) and re.fullmatch(rf"\d{{{width},}}", new[len(stem) :]), (template, new)
        elif "-" in template:  # the prefix before the first dash is kept
            assert new.startswith(template.split("-")[0] + "-"), (template, new)
    assert len(set(made)) == len(made)


def test_numbered_ids_count_up_per_stem() -> None:
    maker = IdMaker(random.Random(0))
    made = [maker.make(t, "X") for t in ("BK-0007", "BK-0001", "HT-3", "BK-1", None, None)]
    assert made == ["BK-0001", "BK-0002", "HT-1", "BK-0003", "X-0001", "X-0002"]


def test_ids_without_digits_get_fresh_letters_of_the_same_shape() -> None:
    maker = IdMaker(random.Random(1))
    made = [maker.make("RM-QXT", "X") for _ in range(40)]
    assert all(re.fullmatch(r"RM-[A-Z]{3}", m) for m in made) and len(set(made)) == 40


@given(st.text(max_size=40))
def test_slug_holds_only_lowercase_ascii_letters_digits_and_dots(text: str) -> None:
    out = slug(text)
    assert re.fullmatch(r"[a-z0-9.]*", out)
    assert slug(out) == out


def test_slug_folds_accents_and_drops_the_rest() -> None:
    assert slug("Zoë O'Brien-Smith") == "zoeobriensmith"
    assert slug("J. Müller 2") == "j.muller2"


def test_a_field_error_names_its_path() -> None:
    err = FieldGenerationError("bookings.BK-1.room_id", "no rooms to refer to")
    assert str(err) == "bookings.BK-1.room_id: no rooms to refer to" and isinstance(err, ValueError)


def test_what_is_kept_per_environment_changes_no_state(pool: EnvPool) -> None:
    """The kinds of strings, the shapes of numbers, the exemplars' values kept per environment: every native
    environment's states are the same made with all of it worked out afresh, and in another order with it
    kept from earlier states."""
    names = sorted(pool.native_names())
    jobs = [(name, seed) for name in names for seed in (1, 22, 333)]

    def made(order: list[tuple[str, int]], fresh: bool) -> dict[tuple[str, int], str]:
        out = {}
        for name, seed in order:
            if fresh:
                initial_state._EXEMPLARS.clear()
                state_values._STRING_KINDS.clear()
                state_values._NUMBER_SHAPES.clear()
            out[(name, seed)] = generate_initial_state(pool.get(name), seed=seed, depth=2).model_dump_json()
        return out

    assert made(jobs, fresh=True) == made(jobs[::-1], fresh=False)
