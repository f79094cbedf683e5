"""TRL's fused LM head, made to score only the completion positions on CPU.

GRPO and SFT score the trained tokens (a rollout's completion; the assistant's tokens) through TRL's fused
LM head (`trl.trainer.utils.add_fused_lm_head`): the backbone's hidden states times the vocabulary matrix, in
tiles, never the whole logits tensor. On a device
with Triton (CUDA, XPU) it projects only the positions whose label is not -100 — the completion. Elsewhere it
projects *every* position and masks the result afterwards (TRL 1.16: so that tile shapes stay fixed on
compiling devices such as Neuron). On CPU that is the prompt too: a GRPO prompt is mostly its tool list (1–3k
tokens) against a completion of a few hundred, so the CPU run projected ~8× the positions it needed through
a 262k-token vocabulary, forward and backward — 16 of the 35 s of the suite's one-step GRPO run. SFT rows
are the same shape: a tool list, then the assistant's few labelled tokens.

`score_only_completions()` makes that choice "compact" on CPU as well: the same log-probabilities and
gradients (tests/training/test_fused_head.py checks both against the unpatched head), fewer positions.
It changes TRL's module-level `_use_triton` name in `trl.trainer.utils` only, the one place that reads it
for this choice (the kernels keep their own reference, so the CPU tiles stay CPU tiles). A TRL without that
name is left alone, with a log line: the run is as correct, only slower.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_COMPACT_DEVICES = frozenset({"cpu"})


def score_only_completions() -> bool:
    """Make TRL's fused LM head project only the labelled positions on CPU. True when it now does."""
    import trl.trainer.utils as trl_utils

    original: Callable[[Any], bool] | None = getattr(trl_utils, "_use_triton", None)
    if original is None or not callable(original):
        log.info("TRL %s has no trl.trainer.utils._use_triton: CPU GRPO scores every position", _trl_version())
        return False
    if getattr(original, "envfactory_compact", False):
        return True

    def compact(device: Any) -> bool:
        return getattr(device, "type", None) in _COMPACT_DEVICES or bool(original(device))

    compact.envfactory_compact = True  # type: ignore[attr-defined]
    compact.envfactory_original = original  # type: ignore[attr-defined]
    trl_utils._use_triton = compact
    return True


def _trl_version() -> str:
    import trl

    return str(getattr(trl, "__version__", "?"))
