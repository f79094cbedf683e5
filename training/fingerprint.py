"""`datasets`' fingerprint of a tokenizer, without the Python copies of its vocabulary.

Every `Dataset.map` (TRL's SFT preparation runs three or four) names its result by hashing the transform and its
arguments with dill, the tokenizer included. `datasets` pickles a tokenizer's whole `__dict__`, and a
transformers 5 tokenizer keeps its vocabulary and merges there as Python objects beside the backend (`_vocab`: a
262k-entry dict for Gemma): ~3.2 s of pure-Python pickling per map here, ~10 s of every SFT start. The backend
tokenizer (`_tokenizer`, pickled as its JSON) holds the same vocabulary and merges, so the hash leaves the two
copies out and keeps everything else exactly as `datasets` does (its cache cleared, the backend's truncation and
padding set aside while hashing): ~0.3 s a map, and a changed vocabulary, template or setting still changes
the fingerprint.

`datasets` registers its reducer per tokenizer class on first use, unless one is registered already:
`lean_tokenizer_hashing(tokenizer)` registers this one first. If `datasets` moves its pickler, nothing is
registered and its own (slow, equally correct) reducer applies.
"""

from __future__ import annotations

from typing import Any

# the Python-side copies of what the backend tokenizer (`_tokenizer`) holds
_DERIVED = ("_vocab", "_merges")


def _save_lean(pickler: Any, obj: Any) -> None:
    state = {k: v for k, v in obj.__dict__.items() if k not in _DERIVED or "_tokenizer" not in obj.__dict__}
    for name in ("cache", "deprecation_warnings"):
        if isinstance(state.get(name), dict):
            state[name] = {}
    backend = obj.__dict__.get("_tokenizer")
    truncation = getattr(backend, "truncation", None)
    padding = getattr(backend, "padding", None)
    if truncation is not None:
        backend.no_truncation()
    if padding is not None:
        backend.no_padding()
    try:
        pickler.save_reduce(type(obj), (), state=state, obj=obj)
    finally:
        if truncation is not None:
            backend.enable_truncation(**truncation)
        if padding is not None:
            backend.enable_padding(**padding)


def lean_tokenizer_hashing(tokenizer: Any) -> bool:
    """Register the lean reducer for the tokenizer's class in `datasets`' hashing pickler; False where that
    pickler is not where this version of `datasets` had it."""
    try:
        from datasets.utils._dill import Pickler
    except ImportError:
        return False
    dispatch = getattr(Pickler, "dispatch", None)
    if not isinstance(dispatch, dict):
        return False
    dispatch[type(tokenizer)] = _save_lean
    return True
