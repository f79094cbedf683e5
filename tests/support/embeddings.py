"""The real embedder as the suite uses it: the packaged MiniLM through ONNX, exported once per machine; and the
same, counting how often (and on how many texts) the model runs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envfactory.llm.embeddings import PACKAGED_MODEL, Embedder
from tests.support.paths import model_cache


def packaged_embedder(batch_size: int = 128) -> Embedder:
    """The packaged model on the ONNX backend (what `envfactory graph build` uses), its export kept in
    `model_cache()`: a worker embeds without importing torch (~2.7 against ~12 CPU-s for the pool's texts).
    torch and fp32 ONNX give the same vectors to float rounding (tests/llm/test_onnx_embed.py)."""
    return Embedder(PACKAGED_MODEL, batch_size=batch_size, backend="onnx", cache_dir=model_cache() / "onnx")


class CountingEmbedder(Embedder):
    def __init__(self) -> None:
        super().__init__(PACKAGED_MODEL, backend="onnx", cache_dir=model_cache() / "onnx")
        self.calls = 0
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        self.texts += len(texts)
        return super().embed(texts)
