"""The similarity plan against the naive double loop, over random parameters, embeddings and settings.

PROPERTIES: `SimilarityPlan.pairs` finds exactly the output → input pairs of different tools that the
naive loop scores above the threshold (up to float32 rounding at the threshold itself); the texts
it leaves unembedded (`needed` false) are in no such pair, and their vectors are never read (NaN
there changes nothing); chunked scoring (`block_cells`) gives the same pairs as one step.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envfactory.toolgraph import ParamSpec, ToolGraphSettings, naive_pairs
from envfactory.toolgraph.similarity import SimilarityPlan, _chunks, _key_dots

NAMES = ["city", "city_name", "hotel_id", "id", "booking_id", "from_account_id", "account_id", "amount", "date"]
NAMES += ["start_date", "user", "user_id", "ids", "name", "status", "price_per_night", "price", "query"]
TYPES = ["string", "integer", "number", "boolean", "any", "array<string>", "array<integer>", "object"]
DESCRIPTIONS = ["", "the city", "an id", "how much", "the date of it", "a name"]


@st.composite
def params(draw: st.DrawFn, direction: str) -> list[ParamSpec]:
    out: list[ParamSpec] = []
    for k in range(draw(st.integers(0, 14))):
        env = f"e{draw(st.integers(0, 2))}"
        name = draw(st.sampled_from(NAMES))
        aliases = draw(st.lists(st.sampled_from(NAMES), max_size=2, unique=True))
        out.append(
            ParamSpec(
                tool=f"{env}.t{draw(st.integers(0, 3))}",
                env=env,
                direction=direction,  # type: ignore[arg-type]
                name=name,
                aliases=[a for a in aliases if a != name],
                json_type=draw(st.sampled_from(TYPES)),
                description=draw(st.sampled_from(DESCRIPTIONS)),
                path=str(k),
            )
        )
    return out


@st.composite
def tool_graph_settings(draw: st.DrawFn) -> ToolGraphSettings:
    return ToolGraphSettings(
        build_edge_threshold=draw(st.floats(0.2, 0.98)),
        name_type_weight=draw(st.sampled_from([0.0, 0.2, 0.6, 0.9, 1.0])),
        name_share=draw(st.sampled_from([0.0, 0.5, 0.75, 1.0])),
    )


def unit_rows(seed: int, n: int, dim: int = 6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # few directions, so many cosines are high and pairs near the threshold are common
    base = rng.normal(size=(3, dim))
    rows = base[rng.integers(0, 3, n)] + 0.4 * rng.normal(size=(n, dim))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows.astype(np.float32)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    outputs=params("output"),
    inputs=params("input"),
    tg=tool_graph_settings(),
    seed=st.integers(0, 2**16),
)
def test_plan_pairs_equal_the_naive_loop(
    outputs: list[ParamSpec], inputs: list[ParamSpec], tg: ToolGraphSettings, seed: int
) -> None:
    plan = SimilarityPlan(outputs, inputs, tg)
    texts = plan.texts
    emb = unit_rows(seed, len(texts))
    got = plan.pairs(emb)
    slow = naive_pairs(outputs, inputs, texts, emb, tg)
    near = {(o, i) for o, i, s in slow if abs(s - tg.build_edge_threshold) < 1e-5}
    found = {(int(o), int(i)): float(s) for o, i, s in zip(got.out_idx, got.in_idx, got.score, strict=True)}
    pairs, want = set(found), {(o, i) for o, i, _ in slow}
    # the naive loop's float64 and the plan's float32 may disagree only at the threshold itself
    assert all(abs(found[p] - tg.build_edge_threshold) < 1e-5 for p in pairs - want)
    assert want - pairs <= near
    for o, i, s in slow:
        if (o, i) in found:
            assert abs(found[(o, i)] - s) < 1e-4

    # every text of a pair was needed; the others are never read
    needed = {texts[k] for k in np.nonzero(plan.needed)[0]}
    for o, i in want - near:
        assert outputs[o].text in needed and inputs[i].text in needed
    poisoned = emb.copy()
    poisoned[~plan.needed] = np.nan
    again = SimilarityPlan(outputs, inputs, tg).pairs(poisoned)
    assert {(int(o), int(i)) for o, i in zip(again.out_idx, again.in_idx, strict=True)} == pairs


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), max_size=30), cap=st.integers(1, 120))
def test_chunks_cover_everything_in_order_within_the_cap(sizes: list[int], cap: int) -> None:
    arr = np.array(sizes, dtype=np.int64)
    slices = list(_chunks(arr, cap))
    covered = [k for sl in slices for k in range(len(arr))[sl]]
    assert covered == list(range(len(arr)))
    for sl in slices:
        part = arr[sl]
        assert part.sum() <= cap or len(part) == 1  # one item larger than the cap goes alone


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(0, 300), cells=st.integers(1, 400))
def test_key_dots_equal_row_dot_products_at_any_block_size(seed: int, n: int, cells: int) -> None:
    rng = np.random.default_rng(seed)
    out_emb, in_emb = unit_rows(seed, 40), unit_rows(seed + 1, 25)
    ko, ki = rng.integers(0, 40, n), rng.integers(0, 25, n)
    want = np.einsum("ij,ij->i", out_emb[ko], in_emb[ki])
    np.testing.assert_allclose(_key_dots(out_emb, in_emb, ko, ki, cells), want, atol=1e-6)
