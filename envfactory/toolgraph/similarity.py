"""Parameter similarity, vectorized: every output × input pair of the pool scored in blocks of one matrix product.

    similarity(o, i) = w · (s · name(o, i) + (1 − s) · type(o, i)) + (1 − w) · cos(emb(o), emb(i))

with w = `name_type_weight` (0.6) and s = `name_share` (0.75):

- **name** is the Dice coefficient of the two names' token sets (`names.tokens`: split at `_` and case
  changes, singular), maximized over every name each side goes by: an output's record-id names
  (`booking_id`, `id`), an input's name without leading role qualifiers (`from_account_id` → `account_id`);
- **type** is a fixed table over JSON types (`TYPE_SIMILARITY`): equal 1, unknown 0.75, integer/number 0.75,
  string/integer 0.5 (ids are both), string/number 0.25, a list feeding one element of its own item type 0.5,
  otherwise 0;
- **cos** is the cosine of the sentence embeddings of `name (type): description`.

An output → input pair is an edge candidate where the similarity exceeds `build_edge_threshold`; pairs
of one tool with itself are never candidates.

How it stays fast: a score depends only on (names, type, text), so parameters are grouped into unique
keys of those three and the score is computed once per key pair — a parameter text shared by a hundred
tools is embedded and compared once. Since a cosine is at most 1, a key pair whose name/type part is
too low, w · name_type + (1 − w) ≤ threshold, can never be an edge: `SimilarityPlan` finds the pairs
that can — name similarities as a sparse token-count product (only names sharing a token meet), then
types per (name, type) group — before anything is embedded. Texts of keys in no such pair are never
embedded (`SimilarityPlan.needed`), and only the pairs that can pass get a cosine, a row-wise dot
product, in chunks of `block_cells` key pairs; the survivors are expanded back to parameter pairs with
array arithmetic: no Python loop over pairs of tools or parameters. The pairs are those of scoring every
pair. `naive_pairs` is the same score as a plain double loop, kept as the baseline of
`benchmarks/toolgraph.py` and as the oracle of the tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from envfactory.config import ToolGraphSettings
from envfactory.toolgraph.params import ParamSpec
from envfactory.words import tokens

_SCALARS = ("string", "integer", "number", "boolean", "object", "any")
TYPES: tuple[str, ...] = (*_SCALARS, *(f"array<{t}>" for t in _SCALARS))
_TYPE_INDEX = {t: i for i, t in enumerate(TYPES)}
_BASE: dict[frozenset[str], float] = {
    frozenset({"integer", "number"}): 0.75,
    frozenset({"string", "integer"}): 0.5,
    frozenset({"string", "number"}): 0.25,
}


def _scalar_similarity(a: str, b: str) -> float:
    if a == b:
        return 1.0
    if "any" in (a, b):
        return 0.75
    return _BASE.get(frozenset({a, b}), 0.0)


def type_similarity(a: str, b: str) -> float:
    """Similarity of two JSON types as `params.schema_type` writes them (`array<string>`...)."""
    a, b = canonical_type(a), canonical_type(b)
    if a == b:
        return 1.0
    if "any" in (a, b):
        return 0.75
    arr_a, arr_b = a.startswith("array<"), b.startswith("array<")
    ea, eb = (a[6:-1] if arr_a else a), (b[6:-1] if arr_b else b)
    sim = _scalar_similarity(ea, eb)
    return sim if arr_a == arr_b else 0.5 * sim


def canonical_type(t: str) -> str:
    return t if t in _TYPE_INDEX else ("array<any>" if t.startswith("array") else "any")


TYPE_SIMILARITY = np.array([[type_similarity(a, b) for b in TYPES] for a in TYPES], dtype=np.float32)


def dice(a: frozenset[str], b: frozenset[str]) -> float:
    if not a or not b:
        return 0.0
    return 2.0 * len(a & b) / (len(a) + len(b))


def name_variants(p: ParamSpec) -> tuple[frozenset[str], ...]:
    """The token sets of every name `p` goes by, without duplicates, in a canonical order."""
    sets = {frozenset(tokens(n)) for n in p.names}
    return tuple(sorted(sets, key=lambda s: sorted(s)))


def name_similarity(o: ParamSpec, i: ParamSpec) -> float:
    return max(dice(a, b) for a in name_variants(o) for b in name_variants(i))


def score(o: ParamSpec, i: ParamSpec, eo: np.ndarray, ei: np.ndarray, settings: ToolGraphSettings) -> float:
    """The similarity of one output and one input, given their text embeddings (unit vectors)."""
    w, s = settings.name_type_weight, settings.name_share
    name_type = s * name_similarity(o, i) + (1 - s) * type_similarity(o.json_type, i.json_type)
    return w * name_type + (1 - w) * float(np.dot(eo, ei))


@dataclass
class Pairs:
    """Output → input parameter pairs above the threshold (indices into the lists given to `similar_pairs`)."""

    out_idx: np.ndarray
    in_idx: np.ndarray
    score: np.ndarray
    name_type: np.ndarray
    desc: np.ndarray
    key_pairs_scored: int = 0  # cells of the key-level matrix: the work done

    def __len__(self) -> int:
        return len(self.out_idx)

    def select(self, mask: np.ndarray) -> Pairs:
        return Pairs(
            self.out_idx[mask], self.in_idx[mask], self.score[mask], self.name_type[mask], self.desc[mask],
            self.key_pairs_scored,
        )  # fmt: skip


def codes(*columns: Sequence[str]) -> tuple[np.ndarray, ...]:
    """Each column of strings as integer codes shared across the columns (equal strings, equal codes):
    comparing millions of pairs by tool or environment is then an integer comparison."""
    index: dict[str, int] = {}
    return tuple(
        np.fromiter((index.setdefault(v, len(index)) for v in col), dtype=np.int64, count=len(col)) for col in columns
    )


def _empty() -> Pairs:
    i, f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    return Pairs(i, i.copy(), f, f.copy(), f.copy())


class _Side:
    """One side (outputs or inputs) grouped into unique keys (name key, type, text)."""

    def __init__(self, params: Sequence[ParamSpec], text_index: dict[str, int], name_keys: dict[tuple, int]) -> None:
        self.n = len(params)
        name_key = np.empty(self.n, dtype=np.int64)
        for j, p in enumerate(params):
            name_key[j] = name_keys.setdefault(name_variants(p), len(name_keys))
        type_code = np.fromiter((_TYPE_INDEX[canonical_type(p.json_type)] for p in params), np.int64, self.n)
        text = np.fromiter((text_index[p.text] for p in params), np.int64, self.n)
        # unique (name, type, text), sorted by name key first so a block's name keys are one range
        full = np.stack([name_key, type_code, text], axis=1) if self.n else np.zeros((0, 3), dtype=np.int64)
        self.keys, inverse = np.unique(full, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        # members of each key, grouped: members[start[k]:start[k] + count[k]] are the params of key k
        self.members = np.argsort(inverse, kind="stable")
        self.count = np.bincount(inverse, minlength=len(self.keys))
        self.start = np.concatenate([[0], np.cumsum(self.count)[:-1]]).astype(np.int64)


# a float32 cosine of unit vectors can come out a few ulps above 1, and the score is summed in float32:
# the bound that rules a pair out leaves this much room
_SLACK = 1e-5


def _cross(
    a_start: np.ndarray, a_count: np.ndarray, b_start: np.ndarray, b_count: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (a, b) of each range pair: range pair k stands for [a_start[k], +a_count[k]) × [b_start[k], +b_count[k]).
    Returns (k, a, b) per element, k ascending."""
    sizes = a_count * b_count
    total = int(sizes.sum())
    k = np.repeat(np.arange(len(sizes)), sizes)
    local = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return k, a_start[k] + local // b_count[k], b_start[k] + local % b_count[k]


_ROWS = 1024  # output keys per product: few enough that they meet a fraction of the input keys


def _key_dots(out_emb: np.ndarray, in_emb: np.ndarray, ko: np.ndarray, ki: np.ndarray, cells: int) -> np.ndarray:
    """out_emb[ko[k]] · in_emb[ki[k]] for every k: per run of output keys, one matrix product with the input
    keys that run meets (BLAS on a dense block beats gathering two rows per pair), at most `cells` cells."""
    out = np.empty(len(ko), dtype=np.float32)
    if len(ko) == 0:
        return out
    order = np.argsort(ko, kind="stable")
    rows = ko[order]
    span = max(1, min(_ROWS, cells // max(len(in_emb), 1)))
    a = 0
    while a < len(order):
        b = int(np.searchsorted(rows, rows[a] + span, side="left"))
        sel = order[a:b]
        cols, local = np.unique(ki[sel], return_inverse=True)
        block = out_emb[rows[a] : rows[b - 1] + 1] @ in_emb[cols].T
        out[sel] = block[rows[a:b] - rows[a], local.reshape(-1)]
        a = b
    return out


def _chunks(sizes: np.ndarray, cap: int) -> Iterator[slice]:
    """Consecutive slices of `sizes` adding up to at most `cap` each (one item alone where it is larger)."""
    ends = np.cumsum(sizes)
    start, done = 0, 0
    while start < len(sizes):
        stop = max(start + 1, int(np.searchsorted(ends, done + cap, side="right")))
        yield slice(start, stop)
        done, start = int(ends[stop - 1]), stop


def _runs(values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """For sorted `values` over 0..n-1: where each value's run starts and how long it is."""
    start = np.searchsorted(values, np.arange(n), side="left")
    end = np.searchsorted(values, np.arange(n), side="right")
    return start.astype(np.int64), (end - start).astype(np.int64)


class _Groups:
    """A side's keys (sorted by name key, type, text) grouped by (name key, type): contiguous runs of keys,
    and each name key's groups contiguous too."""

    def __init__(self, keys: np.ndarray, n_names: int) -> None:
        pairs, first, count = np.unique(keys[:, :2], axis=0, return_index=True, return_counts=True)
        self.name = pairs[:, 0].astype(np.int64) if len(pairs) else np.zeros(0, dtype=np.int64)
        self.type = pairs[:, 1].astype(np.int64) if len(pairs) else np.zeros(0, dtype=np.int64)
        self.key_start = first.astype(np.int64)
        self.key_count = count.astype(np.int64)
        self.by_name_start, self.by_name_count = _runs(self.name, n_names)


class _NameIndex:
    """Dice similarity between name keys (max over each key's name variants) from a sparse token-count
    product: only name keys that share a token meet, so a pool of tens of thousands of names stays cheap."""

    def __init__(self, out_keys: list[tuple], in_keys: list[tuple]) -> None:
        out_tokens = {t for key in out_keys for v in key for t in v}
        shared = sorted(out_tokens & {t for key in in_keys for v in key for t in v})
        vocab = {t: j for j, t in enumerate(shared)}
        self.out_rows, self.out_size, self.out_key = self._matrix(out_keys, vocab)
        in_rows, self.in_size, self.in_key = self._matrix(in_keys, vocab)
        self.in_cols = in_rows.T.tocsr()
        self.n_in = len(in_keys)
        self.out_offsets = np.concatenate([[0], np.cumsum([len(key) for key in out_keys])]).astype(np.int64)

    @staticmethod
    def _matrix(keys: list[tuple], vocab: dict[str, int]) -> tuple[sparse.csr_matrix, np.ndarray, np.ndarray]:
        variants = [v for key in keys for v in key]
        cols = [[vocab[t] for t in v if t in vocab] for v in variants]
        indptr = np.concatenate([[0], np.cumsum([len(c) for c in cols])]).astype(np.int64)
        indices = np.fromiter((j for c in cols for j in c), dtype=np.int64, count=int(indptr[-1]))
        data = np.ones(len(indices), dtype=np.float32)
        rows = sparse.csr_matrix((data, indices, indptr), shape=(len(variants), max(len(vocab), 1)))
        size = np.fromiter((len(v) for v in variants), np.float32, len(variants))
        key_of = np.repeat(np.arange(len(keys)), [len(key) for key in keys]).astype(np.int64)
        return rows, size, key_of

    def block(self, lo: int, hi: int, floor: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Name key pairs (out key in lo..hi-1, any in key) whose similarity is at least `floor`:
        (out keys, in keys, similarity), each pair once. With `floor` ≤ 0, every pair of the block."""
        r0, r1 = int(self.out_offsets[lo]), int(self.out_offsets[hi])
        inter = (self.out_rows[r0:r1] @ self.in_cols).tocoo()
        r, c = inter.row.astype(np.int64), inter.col.astype(np.int64)
        sim = (2.0 * inter.data.astype(np.float32)) / (self.out_size[r0 + r] + self.in_size[c])
        ko, ki = self.out_key[r0 + r], self.in_key[c]
        if floor <= 0:  # pairs sharing no token count too: every pair of the block, at 0 where none meet
            n_out = hi - lo
            dense = np.zeros((n_out, self.n_in), dtype=np.float32)
            np.maximum.at(dense, (ko - lo, ki), sim)
            grid_o, grid_i = np.divmod(np.arange(n_out * self.n_in, dtype=np.int64), self.n_in)
            return grid_o + lo, grid_i, dense.reshape(-1)
        keep = sim >= floor
        ko, ki, sim = ko[keep], ki[keep], sim[keep]
        if len(ko) == 0:
            return ko, ki, sim
        code = ko * self.n_in + ki
        order = np.argsort(code, kind="stable")
        code, sim = code[order], sim[order]
        starts = np.concatenate([[0], np.nonzero(np.diff(code))[0] + 1])
        best = np.maximum.reduceat(sim, starts)
        first = code[starts]
        return first // self.n_in, first % self.n_in, best


class SimilarityPlan:
    """The name/type half of the score for every output × input key pair, before any embedding: which
    pairs can still pass the threshold, and so which texts need an embedding at all (`needed`).
    `pairs(embeddings)` then scores those pairs with the cosine."""

    def __init__(
        self,
        outputs: Sequence[ParamSpec],
        inputs: Sequence[ParamSpec],
        settings: ToolGraphSettings,
        texts: Sequence[str] | None = None,
    ) -> None:
        self.outputs, self.inputs, self.settings = outputs, inputs, settings
        self.texts: list[str] = list(texts) if texts is not None else sorted({p.text for p in (*outputs, *inputs)})
        self.needed = np.zeros(len(self.texts), dtype=bool)
        self.key_pairs_scored = 0
        if not outputs or not inputs:
            return
        text_index = {t: k for k, t in enumerate(self.texts)}
        out_names: dict[tuple, int] = {}
        in_names: dict[tuple, int] = {}
        self.out, self.inp = _Side(outputs, text_index, out_names), _Side(inputs, text_index, in_names)
        self.names = _NameIndex(list(out_names), list(in_names))
        self.out_groups = _Groups(self.out.keys, len(out_names))
        self.in_groups = _Groups(self.inp.keys, len(in_names))
        w, s = settings.name_type_weight, settings.name_share
        # the least name/type part that a cosine of 1 lifts over the threshold, and the least name
        # similarity that reaches it with the best type similarity (1)
        self.floor = (settings.build_edge_threshold - _SLACK - (1 - w)) / w if w > 0 else -np.inf
        self.name_floor = (self.floor - (1 - s)) / s if s > 0 else (-np.inf if self.floor <= 1 - s else np.inf)
        out_used = np.zeros(len(self.out_groups.name), dtype=bool)
        in_used = np.zeros(len(self.in_groups.name), dtype=bool)
        for go, gi, _ in self._group_pairs():
            out_used[go] = True
            in_used[gi] = True
        # groups partition the keys in order: a group's flag covers its run of keys
        self.needed[self.out.keys[np.repeat(out_used, self.out_groups.key_count), 2]] = True
        self.needed[self.inp.keys[np.repeat(in_used, self.in_groups.key_count), 2]] = True

    def _group_pairs(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(out groups, in groups, name_type) of every group pair whose name/type part is at least the floor,
        in blocks of output name keys."""
        if self.floor > 1 or len(self.out.keys) == 0 or len(self.inp.keys) == 0:
            return
        s = self.settings.name_share
        n_out_names = len(self.names.out_offsets) - 1
        step = max(1, self.settings.block_cells // max(self.names.n_in, 1)) if self.name_floor <= 0 else 4096
        og, ig = self.out_groups, self.in_groups
        for lo in range(0, n_out_names, step):
            no, ni, name = self.names.block(lo, min(lo + step, n_out_names), self.name_floor)
            if len(no) == 0:
                continue
            k, go, gi = _cross(og.by_name_start[no], og.by_name_count[no], ig.by_name_start[ni], ig.by_name_count[ni])
            name_type = s * name[k] + (1 - s) * TYPE_SIMILARITY[og.type[go], ig.type[gi]]
            keep = name_type >= self.floor
            yield go[keep], gi[keep], name_type[keep]

    def pairs(self, embeddings: np.ndarray) -> Pairs:
        """All output → input pairs of different tools scoring above the threshold. `embeddings[k]` is the unit
        embedding of `texts[k]`; rows of texts that are not `needed` are never read."""
        if not self.outputs or not self.inputs:
            return _empty()
        w, threshold = self.settings.name_type_weight, self.settings.build_edge_threshold
        emb = np.ascontiguousarray(embeddings, dtype=np.float32)
        out_emb, in_emb = emb[self.out.keys[:, 2]], emb[self.inp.keys[:, 2]]  # rows in key order
        og, ig = self.out_groups, self.in_groups
        found: list[tuple[np.ndarray, ...]] = []
        scored = 0
        for go, gi, name_type in self._group_pairs():
            for sl in _chunks(og.key_count[go] * ig.key_count[gi], self.settings.block_cells):
                g_out, g_in = go[sl], gi[sl]
                k, ko, ki = _cross(og.key_start[g_out], og.key_count[g_out], ig.key_start[g_in], ig.key_count[g_in])
                desc = _key_dots(out_emb, in_emb, ko, ki, self.settings.block_cells)
                nt = name_type[sl][k]
                total = w * nt + (1 - w) * desc
                hit = np.nonzero(total > threshold)[0]
                found.append((ko[hit], ki[hit], total[hit], nt[hit], desc[hit]))
                scored += len(ko)
        self.key_pairs_scored = scored
        if not found:
            return _empty()
        ko, ki, sc, nt, de = (np.concatenate(parts) for parts in zip(*found, strict=True))
        pairs = _expand(self.out, self.inp, ko, ki, sc, nt, de)
        pairs.key_pairs_scored = scored
        tool_of_out, tool_of_in = codes([p.tool for p in self.outputs], [p.tool for p in self.inputs])
        return pairs.select(tool_of_out[pairs.out_idx] != tool_of_in[pairs.in_idx])


def similar_pairs(
    outputs: Sequence[ParamSpec],
    inputs: Sequence[ParamSpec],
    texts: Sequence[str],
    embeddings: np.ndarray,
    settings: ToolGraphSettings,
) -> Pairs:
    """All output → input pairs of different tools scoring above `settings.build_edge_threshold`.

    `embeddings[k]` is the unit embedding of `texts[k]`; every parameter's `text` must be among `texts`.
    """
    return SimilarityPlan(outputs, inputs, settings, texts).pairs(embeddings)


def _expand(
    out: _Side, inp: _Side, ko: np.ndarray, ki: np.ndarray, sc: np.ndarray, nt: np.ndarray, de: np.ndarray
) -> Pairs:
    """Key pairs → parameter pairs: each key pair stands for (members of ko) × (members of ki)."""
    co, ci = out.count[ko], inp.count[ki]
    sizes = co * ci
    total = int(sizes.sum())
    if total == 0:
        return _empty()
    pair = np.repeat(np.arange(len(ko)), sizes)
    local = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    a, b = local // ci[pair], local % ci[pair]
    return Pairs(
        out_idx=out.members[out.start[ko[pair]] + a],
        in_idx=inp.members[inp.start[ki[pair]] + b],
        score=sc[pair].astype(np.float32),
        name_type=nt[pair].astype(np.float32),
        desc=de[pair].astype(np.float32),
    )


def naive_pairs(
    outputs: Sequence[ParamSpec],
    inputs: Sequence[ParamSpec],
    texts: Sequence[str],
    embeddings: np.ndarray,
    settings: ToolGraphSettings,
) -> list[tuple[int, int, float]]:
    """The baseline: the same score for every (output, input) pair of different tools, one pair at a time."""
    text_index = {t: k for k, t in enumerate(texts)}
    found: list[tuple[int, int, float]] = []
    for oi, o in enumerate(outputs):
        eo = embeddings[text_index[o.text]]
        for ii, i in enumerate(inputs):
            if o.tool == i.tool:
                continue
            sim = score(o, i, eo, embeddings[text_index[i.text]], settings)
            if sim > settings.build_edge_threshold:
                found.append((oi, ii, sim))
    return found
