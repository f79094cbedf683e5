"""The ONNX backend of `Embedder`: the packaged MiniLM exported locally, cached by its files' hash, equal to torch.

Real texts: the parameter texts of the bundled pool (what the tool graph embeds). The export is made
once per test session into a temporary folder; tests that need to make one skip where the `onnx`
extra is not installed (`missing_packages`), as the backend then falls back to torch.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from envfactory.llm import onnx_embed
from envfactory.llm.embeddings import PACKAGED_MODEL, Embedder, EmbeddingCache, resolve_model
from envfactory.toolgraph import ToolGraph, ToolGraphSettings, ToolSource, build_tool_graph, input_params, output_params
from envfactory.toolgraph.graph import PARAMETER_RELATE
from tests.support.paths import ROOT

needs_export = pytest.mark.skipif(
    bool(onnx_embed.missing_packages(export=True)),
    reason=f"the ONNX backend needs {onnx_embed.missing_packages(export=True)} ({onnx_embed.ONNX_HINT})",
)

# Measured against torch on the pool's texts (and on the 17,100 texts of the 10,472-tool synthetic pool):
# fp32 min cosine 0.9999998; int8 min 0.980, mean 0.993.
FP32_MIN_COSINE = 0.9999
INT8_MIN_COSINE = 0.97
INT8_MEAN_COSINE = 0.99


@pytest.fixture(scope="session")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-models")


@pytest.fixture(scope="session")
def texts(sources: list[ToolSource]) -> list[str]:
    return sorted({p.text for s in sources for p in (*input_params(s), *output_params(s))})


@pytest.fixture(scope="session")
def torch_vectors(texts: list[str]) -> np.ndarray:
    return Embedder(PACKAGED_MODEL, batch_size=128).embed(texts)


@pytest.fixture(scope="session")
def onnx_embedder(onnx_dir: Path) -> Embedder:
    if onnx_embed.missing_packages(export=True):
        pytest.skip(f"the ONNX backend needs {onnx_embed.missing_packages(export=True)}")
    e = Embedder(PACKAGED_MODEL, backend="onnx", cache_dir=onnx_dir)
    assert e.backend == "onnx" and e.runtime == "onnx"
    return e


def _neighbours(vectors: np.ndarray, k: int) -> np.ndarray:
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


@needs_export
def test_onnx_equals_torch_on_real_texts(onnx_embedder: Embedder, texts: list[str], torch_vectors: np.ndarray) -> None:
    vectors = onnx_embedder.embed(texts)
    assert vectors.shape == torch_vectors.shape and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosine = (vectors * torch_vectors).sum(axis=1)
    assert cosine.min() >= FP32_MIN_COSINE, texts[int(cosine.argmin())]
    # the same neighbours: each text's 5 nearest, where they are not tied to within float rounding
    mine, theirs = _neighbours(vectors, 5), _neighbours(torch_vectors, 5)
    sims = torch_vectors @ torch_vectors.T
    for row in np.nonzero((mine != theirs).any(axis=1))[0]:
        gap = np.abs(sims[row, mine[row]] - sims[row, theirs[row]]).max()
        assert gap < 1e-5, (texts[row], [texts[j] for j in mine[row]], [texts[j] for j in theirs[row]])
    # one batch or many, any order: the same vectors (rows are sorted by length and batched internally)
    shuffled = list(reversed(texts[:50]))
    np.testing.assert_allclose(onnx_embedder.embed(shuffled), vectors[:50][::-1], atol=1e-5)
    assert onnx_embedder.embed([]).shape == (0, 384) and onnx_embedder.dim == 384
    with pytest.raises(TypeError):
        onnx_embedder.embed("one string")


@needs_export
def test_int8_is_close_and_kept_in_its_own_vector_space(
    onnx_dir: Path, texts: list[str], torch_vectors: np.ndarray
) -> None:
    int8 = Embedder(PACKAGED_MODEL, backend="onnx-int8", cache_dir=onnx_dir)
    assert int8.vector_space == f"{Embedder(PACKAGED_MODEL).vector_space}#int8" != Embedder(PACKAGED_MODEL).vector_space
    cosine = (int8.embed(texts) * torch_vectors).sum(axis=1)
    assert cosine.min() >= INT8_MIN_COSINE and cosine.mean() >= INT8_MEAN_COSINE
    assert cosine.mean() < 0.9999  # it does move the vectors: which is why it is not the graph's default
    folder = onnx_embed.export_dir(onnx_dir, PACKAGED_MODEL, Path(resolve_model(PACKAGED_MODEL)))
    assert (folder / onnx_embed.INT8_FILE).is_file()


@needs_export
def test_export_is_cached_by_the_model_files_hash_and_reused(
    onnx_embedder: Embedder, onnx_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    onnx_embedder.embed(["make sure it is exported"])
    model = Path(resolve_model(PACKAGED_MODEL))
    folder = onnx_embed.export_dir(onnx_dir, PACKAGED_MODEL, model)
    assert folder.parent == onnx_dir and folder.name.startswith(f"{PACKAGED_MODEL}-")
    assert {p.name for p in folder.iterdir()} >= {"model.onnx", "tokenizer.json", "meta.json"}
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["files_hash"] == onnx_embed.model_files_hash(model) and meta["dim"] == 384
    assert [p.name for p in onnx_dir.iterdir() if p.name.startswith(".")] == []  # no half-written export left

    # reused: a fresh load in this process does not export again
    monkeypatch.setattr(onnx_embed, "_loaded", {})

    def no_export(*args: object) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(onnx_embed, "_export", no_export)
    again = onnx_embed.load_onnx(PACKAGED_MODEL, model, onnx_dir, "fp32")
    assert again.path == folder / "model.onnx"

    # other model files, another key: a copy of the model with one file changed
    copy = tmp_path / "changed-model"
    copy.mkdir()
    for p in model.rglob("*"):
        if p.is_file():
            target = copy / p.relative_to(model)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(p)
    readme = copy / "README.md"
    readme.unlink()
    readme.write_text("changed")
    assert onnx_embed.export_key(copy) != onnx_embed.export_key(model)
    assert onnx_embed.export_key(model) == folder.name.rsplit("-", 1)[1]


@needs_export
def test_a_cached_export_runs_without_torch(onnx_embedder: Embedder, onnx_dir: Path, tmp_path: Path) -> None:
    """A later process needs neither torch, sentence-transformers nor onnx: only onnxruntime and tokenizers."""
    reference = onnx_embedder.embed(["book a hotel room", "the id of the booking"])
    script = textwrap.dedent(
        f"""
        import json, sys
        for name in ("torch", "sentence_transformers", "onnx", "transformers"):
            sys.modules[name] = None  # importing them now fails
        from pathlib import Path
        from envfactory.llm.embeddings import Embedder
        e = Embedder({PACKAGED_MODEL!r}, backend="onnx", cache_dir=Path({str(onnx_dir)!r}))
        v = e.embed(["book a hotel room", "the id of the booking"])
        print(json.dumps({{"backend": e.backend, "vectors": v.tolist()}}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["backend"] == "onnx"
    np.testing.assert_allclose(np.array(out["vectors"], dtype=np.float32), reference, atol=1e-5)


def test_falls_back_to_torch_where_onnx_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with caplog.at_level(logging.INFO, logger="envfactory.llm.embeddings"):
        chosen = Embedder(PACKAGED_MODEL, backend="onnx", cache_dir=tmp_path)
        quiet = Embedder(PACKAGED_MODEL, backend="onnx-int8", cache_dir=tmp_path, quiet_fallback=True)
    assert chosen.backend == quiet.backend == "torch" == chosen.runtime
    assert chosen.requested_backend == "onnx" and quiet.vector_space.startswith(f"{PACKAGED_MODEL}@")
    levels = [(r.levelno, "onnxruntime not installed" in r.getMessage()) for r in caplog.records]
    assert levels == [(logging.WARNING, True), (logging.INFO, True)]
    assert "envfactory[onnx]" in caplog.records[0].getMessage()
    # no folder to keep an export in, or a model that is not a local folder: torch too
    monkeypatch.delitem(sys.modules, "onnxruntime")
    assert Embedder(PACKAGED_MODEL, backend="onnx").backend == "torch"
    assert Embedder("no-such-org/no-such-model", backend="onnx", cache_dir=tmp_path).backend == "torch"
    with pytest.raises(Exception, match="unknown embedding backend"):
        Embedder(PACKAGED_MODEL, backend="tpu")  # type: ignore[arg-type]


@needs_export
def test_without_the_export_packages_only_a_cached_export_will_do(
    onnx_embedder: Embedder, onnx_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    onnx_embedder.embed(["make sure it is exported"])
    monkeypatch.setitem(sys.modules, "onnx", None)
    assert Embedder(PACKAGED_MODEL, backend="onnx", cache_dir=onnx_dir).backend == "onnx"  # exported earlier
    assert Embedder(PACKAGED_MODEL, backend="onnx", cache_dir=tmp_path).backend == "torch"  # nothing there


def test_a_small_job_does_not_pay_for_the_export(tmp_path: Path) -> None:
    e = Embedder(PACKAGED_MODEL, backend="onnx", cache_dir=tmp_path, export_min_texts=100)
    e.will_embed(["a text"] * 3)
    assert e.runtime == "torch"
    vectors = e.embed(["book a hotel room"])
    assert vectors.shape == (1, 384) and list(tmp_path.iterdir()) == []  # torch ran; nothing was exported
    e.will_embed(["a text"] * 100)
    assert e.runtime == ("onnx" if not onnx_embed.missing_packages(export=True) else "torch")


@needs_export
def test_the_pool_graph_has_the_same_edges_with_onnx(
    sources: list[ToolSource], graph: ToolGraph, onnx_embedder: Embedder, tmp_path: Path
) -> None:
    """The pool's graph built with the ONNX backend equals the torch-built one (`graph`), edge for edge."""
    onnx_graph, report = build_tool_graph(sources, EmbeddingCache(tmp_path, onnx_embedder), ToolGraphSettings())
    assert report.embedded == report.texts_needed > 0

    def relations(g: ToolGraph) -> dict[tuple[str, str], float]:
        return {
            (a, b): d["score"] for a, b, d in g.g.edges(data=True) if d["type"] == PARAMETER_RELATE and d.get("flow")
        }

    mine, theirs = relations(onnx_graph), relations(graph)
    assert mine.keys() == theirs.keys() and len(mine) > 500
    assert max(abs(mine[k] - theirs[k]) for k in mine) <= 1e-4  # scores are rounded to 4 places
    assert {(a, b) for a, b, _ in onnx_graph.depend_edges()} == {(a, b) for a, b, _ in graph.depend_edges()}


def test_the_data_dir_settings_name_the_export_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from envfactory.config import Settings
    from envfactory.toolgraph.settings import onnx_path

    settings = Settings(root=ROOT, data_dir=tmp_path)
    assert onnx_path(settings) == tmp_path / "models" / "onnx"
    assert settings.toolgraph.embed_backend == "onnx"  # the default: exact, and the fastest that is
    for name in [k for k in os.environ if k.upper().startswith("ENVFACTORY_TOOLGRAPH")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ENVFACTORY_TOOLGRAPH__EMBED_BACKEND", "torch")  # nested in the one settings root
    assert Settings(root=ROOT).toolgraph.embed_backend == "torch"
    monkeypatch.delenv("ENVFACTORY_TOOLGRAPH__EMBED_BACKEND")
    monkeypatch.setenv("ENVFACTORY_TOOLGRAPH_EMBED_BACKEND", "torch")  # the spelling of old: read, with a warning
    with pytest.warns(FutureWarning, match="ENVFACTORY_TOOLGRAPH__<NAME>"):
        assert Settings(root=ROOT).toolgraph.embed_backend == "torch"
    monkeypatch.setenv("ENVFACTORY_TOOLGRAPH__EMBED_BACKEND", "onnx-int8")  # the nested spelling wins, unwarned
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert Settings(root=ROOT).toolgraph.embed_backend == "onnx-int8"
