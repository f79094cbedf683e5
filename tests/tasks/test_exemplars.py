"""`Exemplars.values` on every native environment: what it keeps after the first reading is
what it works out each time (for any path and any stratum of a record's own values), and a caller changing
what it got changes nothing for the next."""

from __future__ import annotations

import random

import pytest

from envfactory.env import Environment
from envfactory.env.pool import EnvPool
from envfactory.tasks.exemplars import Exemplars
from envfactory.tasks.initial_state import exemplars
from tests.support.paths import ROOT

NATIVE = sorted(p.parent.name for p in (ROOT / "envs").glob("*/env.py"))


def _strata(ex: Exemplars, rng: random.Random) -> list[tuple[tuple[str, object], ...]]:
    """Strata as the maker builds them (a record's field values), some matching no record, some unhashable."""
    out: list[tuple[tuple[str, object], ...]] = [()]
    for samples in ex.samples.values():
        for s in samples[:3]:
            fields = [(f, v) for f, v in s.inst.items() if not isinstance(v, dict)]
            if fields:
                out.append(tuple(rng.sample(fields, min(len(fields), rng.randint(1, 3)))))
    out.append((("no_such_field", "nothing"),))
    return out


@pytest.mark.parametrize("name", NATIVE)
def test_values_kept_are_the_values_worked_out(pool: EnvPool, name: str) -> None:
    env = pool.get(name)
    assert isinstance(env, Environment)
    ex = exemplars(env)
    fresh = Exemplars(env.state_model, ex.dumps)  # nothing kept yet
    rng = random.Random(name)
    strata = _strata(ex, rng)
    paths = [*ex.samples, "no.such.path"]
    for _ in range(300):
        path, stratum = rng.choice(paths), rng.choice(strata)
        first = fresh.values(path, stratum)
        assert first == fresh._values(path, stratum)
        first.append("changed by a caller")
        assert fresh.values(path, stratum) == fresh._values(path, stratum)
