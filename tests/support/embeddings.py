"""The real embedder, counting how often (and on how many texts) the model runs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envfactory.llm.embeddings import PACKAGED_MODEL, Embedder


class CountingEmbedder(Embedder):
    def __init__(self) -> None:
        super().__init__(PACKAGED_MODEL)
        self.calls = 0
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        self.texts += len(texts)
        return super().embed(texts)
