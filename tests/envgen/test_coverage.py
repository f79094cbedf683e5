"""PoolIndex over the real bundled pool: domain gaps, nearest environments, novelty of proposals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from envfactory.config import Settings
from envfactory.env.metadata import DOMAINS, load_metadata
from envfactory.env.pool import EnvPool
from envfactory.envgen.coverage import PoolIndex, entry_texts
from tests.support.embeddings import CountingEmbedder
from tests.support.paths import ROOT

HOTELS = "Hotel reservations: search hotels by city, check room availability, book, modify and cancel stays."


@pytest.fixture(scope="session")
def embedder() -> CountingEmbedder:
    return CountingEmbedder()


@pytest.fixture(scope="module")
def index(embedder: CountingEmbedder, tmp_path_factory: pytest.TempPathFactory) -> PoolIndex:
    return PoolIndex(EnvPool(Settings(root=ROOT, bfcl=False)), embedder, tmp_path_factory.mktemp("pool-index"))


def _small_pool(tmp_path: Path, names: list[str]) -> EnvPool:
    for name in names:
        shutil.copytree(ROOT / "envs" / name, tmp_path / "envs" / name)
    return EnvPool(Settings(root=tmp_path, bfcl=False))


def test_domain_gaps_cover_every_domain_least_covered_first(index: PoolIndex) -> None:
    gaps = index.domain_gaps()
    assert sorted(g.domain for g in gaps) == sorted(DOMAINS)
    keys = [(g.env_count, g.tool_count) for g in gaps]
    assert keys == sorted(keys)
    names = index.pool.native_names()
    assert sum(g.env_count for g in gaps) == len(names)
    for gap in gaps:
        for env in gap.envs:
            assert load_metadata(ROOT / "envs" / env / "metadata.json").domain == gap.domain
    travel = next(g for g in gaps if g.domain == "travel")
    assert {"hotels", "flights"} <= set(travel.envs)


def test_domain_gaps_list_empty_domains_first(tmp_path: Path, embedder: CountingEmbedder) -> None:
    gaps = PoolIndex(_small_pool(tmp_path, ["hotels"]), embedder, tmp_path / "index").domain_gaps()
    assert len(gaps) == len(DOMAINS)
    assert [g.domain for g in gaps][-1] == "travel"
    assert all(g.env_count == 0 and g.tool_count == 0 and g.envs == [] for g in gaps[:-1])
    hotels = load_metadata(tmp_path / "envs" / "hotels" / "metadata.json")
    assert gaps[-1].env_count == 1 and gaps[-1].tool_count == len(hotels.tools)


def test_nearest_finds_the_restaurant_environment(index: PoolIndex) -> None:
    near = index.nearest("reserve a table at an Italian place", k=3)
    # measured: restaurants 0.68 (its reserve_table tool), then hotels 0.36
    assert near[0].env == "restaurants" and near[0].domain == "lifestyle"
    assert near[0].similarity > 0.5 and near[0].matched == "reserve_table"
    assert len(near) == 3 and len({n.env for n in near}) == 3
    assert [n.similarity for n in near] == sorted((n.similarity for n in near), reverse=True)
    assert index.nearest("anything", k=0) == []


def test_novelty_flags_a_near_copy_and_passes_something_new(index: PoolIndex) -> None:
    paraphrase = (
        "Hotel booking: find hotels in a city, check which rooms are free, book, modify and cancel reservations."
    )
    dup = index.novelty(paraphrase)
    # measured: 0.895 for this paraphrase, 0.981 for the verbatim description
    assert dup.is_duplicate and dup.nearest is not None and dup.nearest.env == "hotels"
    assert dup.threshold == 0.85 and dup.similarity >= 0.85
    assert index.novelty(HOTELS).similarity > 0.95
    new = index.novelty("Veterinary clinic: register pets, book vet appointments, record vaccinations.")
    # measured: 0.31 (nearest: papers)
    assert not new.is_duplicate and new.similarity < 0.5
    # the threshold is the caller's to set
    assert not index.novelty(paraphrase, threshold=0.99).is_duplicate


def test_refresh_reembeds_only_what_changed(tmp_path: Path, embedder: CountingEmbedder) -> None:
    pool = _small_pool(tmp_path, ["hotels", "restaurants"])
    store = tmp_path / "index"
    idx = PoolIndex(pool, embedder, store)
    per_env = {
        n: len(entry_texts(load_metadata(tmp_path / "envs" / n / "metadata.json"))) for n in ("hotels", "restaurants")
    }
    before = embedder.texts
    sync = idx.refresh()
    assert (sync.added, sync.embedded) == (2, sum(per_env.values()))
    assert embedder.texts - before == sync.embedded

    # a second index on the same store: everything is already there
    before = embedder.texts
    again = PoolIndex(pool, embedder, store).refresh()
    assert (again.unchanged, again.embedded, embedder.texts - before) == (2, 0, 0)

    # change one description: one entry is re-embedded, the tool entries stay
    meta_file = tmp_path / "envs" / "hotels" / "metadata.json"
    data = json.loads(meta_file.read_text())
    data["description"] = "Boutique hotel stays: find rooms by city, book and cancel them."
    meta_file.write_text(json.dumps(data))
    changed = idx.refresh()
    assert (changed.updated, changed.unchanged, changed.removed, changed.embedded) == (1, 1, 0, 1)
    assert idx.collection.count() == sum(per_env.values())

    # an environment leaves the pool: its entries leave the index
    shutil.rmtree(tmp_path / "envs" / "restaurants")
    gone = idx.refresh()
    assert (gone.removed, gone.embedded) == (1, 0)
    assert idx.collection.count() == per_env["hotels"]
    assert [n.env for n in idx.nearest("reserve a table at an Italian place", k=5)] == ["hotels"]


def test_empty_pool_has_no_neighbors(tmp_path: Path, embedder: CountingEmbedder) -> None:
    (tmp_path / "envs").mkdir()
    idx = PoolIndex(EnvPool(Settings(root=tmp_path, bfcl=False)), embedder, tmp_path / "index")
    verdict = idx.novelty("anything at all")
    assert not verdict.is_duplicate and verdict.nearest is None and verdict.similarity == 0.0
