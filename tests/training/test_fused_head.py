"""training.fused_head: on CPU, TRL's fused LM head scores only the labelled positions — with the same
log-probabilities, entropies and gradients as the head that scores every position."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
trl_utils = pytest.importorskip("trl.trainer.utils")

from training.fused_head import score_only_completions  # noqa: E402


@pytest.fixture
def restore() -> Iterator[None]:
    """TRL's own choice for the test (another test in this process may have patched it), then as it was."""
    before = trl_utils._use_triton
    trl_utils._use_triton = getattr(before, "envfactory_original", before)
    yield
    trl_utils._use_triton = before


def _run(compact: bool, restore: None) -> tuple[Any, ...]:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=16,
    )
    model = Gemma3ForCausalLM(config)
    trl_utils.add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy", "is_top1"))
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :30] = -100  # a long prompt, a short completion: what GRPO scores
    labels[1, 36:] = -100  # padding
    if compact:
        assert score_only_completions()
    assert trl_utils._use_triton(torch.device("cpu")) is compact  # TRL's own head scores every position on CPU
    called: list[bool] = []
    current = trl_utils._use_triton

    def spy(device: Any) -> bool:
        called.append(True)
        return bool(current(device))

    trl_utils._use_triton = spy
    out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    out.loss.backward()
    assert called, "TRL's fused forward no longer reads trl.trainer.utils._use_triton: the patch does nothing"
    grad = model.model.embed_tokens.weight.grad.clone()
    return out.log_probs.detach(), out.entropy.detach(), out.is_top1, out.loss.detach(), grad


def test_compact_scoring_gives_the_same_log_probs_and_gradients(restore: None) -> None:
    full = _run(False, restore)
    compact = _run(True, restore)
    for a, b in zip(full, compact, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert full[0][0, :29].abs().sum() == 0  # unlabelled positions come back as 0 either way


def test_the_patch_is_idempotent_and_keeps_triton_devices(restore: None) -> None:
    assert score_only_completions() and score_only_completions()
    patched = trl_utils._use_triton
    assert getattr(patched, "envfactory_compact", False)
    assert patched(torch.device("cpu")) is True
    assert patched(torch.device("meta")) is False  # neither CPU nor a Triton device: TRL's own answer
