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
tools is embedded and compared once. Blocks of output keys × all input keys are scored with one
embedding matrix product each (the name part is a token-count matrix product, the type part a table
lookup), thresholded, and expanded back to parameter pairs with array arithmetic: no Python loop over
pairs of tools or parameters. `naive_pairs` is the same score as a plain double loop, kept as the
baseline of `benchmarks/toolgraph.py` and as the oracle of the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from envfactory.toolgraph.names import tokens
from envfactory.toolgraph.params import ParamSpec
from envfactory.toolgraph.settings import ToolGraphSettings

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


class _NameMatrix:
    """Dice similarity between name keys as token-count matrix products (max over each key's variants)."""

    def __init__(self, out_keys: list[tuple], in_keys: list[tuple]) -> None:
        out_tokens = {t for key in out_keys for v in key for t in v}
        shared = sorted(out_tokens & {t for key in in_keys for v in key for t in v})
        vocab = {t: j for j, t in enumerate(shared)}
        self.out_rows, self.out_size, self.out_offsets = self._matrix(out_keys, vocab)
        self.in_rows, self.in_size, self.in_offsets = self._matrix(in_keys, vocab)

    @staticmethod
    def _matrix(keys: list[tuple], vocab: dict[str, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        variants = [v for key in keys for v in key]
        rows = np.zeros((len(variants), max(len(vocab), 1)), dtype=np.float32)
        for r, v in enumerate(variants):
            cols = [vocab[t] for t in v if t in vocab]
            rows[r, cols] = 1.0
        size = np.fromiter((len(v) for v in variants), np.float32, len(variants))
        offsets = np.concatenate([[0], np.cumsum([len(key) for key in keys])[:-1]]).astype(np.int64)
        return rows, size, offsets

    def block(self, lo: int, hi: int) -> np.ndarray:
        """Similarity of output name keys lo..hi-1 to every input name key: (hi - lo, n_in_keys)."""
        r0 = self.out_offsets[lo]
        r1 = self.out_offsets[hi] if hi < len(self.out_offsets) else len(self.out_rows)
        inter = self.out_rows[r0:r1] @ self.in_rows.T
        total = self.out_size[r0:r1, None] + self.in_size[None, :]
        sim = np.divide(2.0 * inter, total, out=np.zeros_like(inter), where=total > 0)
        sim = np.maximum.reduceat(sim, self.out_offsets[lo:hi] - r0, axis=0)
        return np.maximum.reduceat(sim, self.in_offsets, axis=1)


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
    if not outputs or not inputs:
        return _empty()
    text_index = {t: k for k, t in enumerate(texts)}
    out_names: dict[tuple, int] = {}
    in_names: dict[tuple, int] = {}
    out, inp = _Side(outputs, text_index, out_names), _Side(inputs, text_index, in_names)
    names = _NameMatrix(list(out_names), list(in_names))
    w, s, threshold = settings.name_type_weight, settings.name_share, settings.build_edge_threshold

    emb = np.ascontiguousarray(embeddings, dtype=np.float32)
    in_emb = emb[inp.keys[:, 2]]
    in_name, in_type = inp.keys[:, 0], inp.keys[:, 1]
    n_in = len(inp.keys)
    rows = max(1, min(settings.block_rows, settings.block_cells // max(n_in, 1)))
    found: list[tuple[np.ndarray, ...]] = []
    for a in range(0, len(out.keys), rows):
        block = out.keys[a : a + rows]
        lo, hi = int(block[0, 0]), int(block[-1, 0]) + 1
        name = names.block(lo, hi)[block[:, 0] - lo][:, in_name]
        name_type = s * name + (1 - s) * TYPE_SIMILARITY[block[:, 1]][:, in_type]
        desc = emb[block[:, 2]] @ in_emb.T  # the one matrix product per block
        total = w * name_type + (1 - w) * desc
        r, c = np.nonzero(total > threshold)
        found.append((r + a, c, total[r, c], name_type[r, c], desc[r, c]))
    if not found:
        return _empty()
    ko, ki, sc, nt, de = (np.concatenate(parts) for parts in zip(*found, strict=True))
    pairs = _expand(out, inp, ko, ki, sc, nt, de)
    pairs.key_pairs_scored = len(out.keys) * n_in
    tool_of_out = np.array([p.tool for p in outputs], dtype=object)
    tool_of_in = np.array([p.tool for p in inputs], dtype=object)
    return pairs.select(tool_of_out[pairs.out_idx] != tool_of_in[pairs.in_idx])


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
