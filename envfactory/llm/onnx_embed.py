"""The ONNX Runtime backend of `Embedder`: the same sentence-transformers model, exported once, run without torch.

The export is local and offline: the model the torch backend loads (the packaged MiniLM by default) is
traced whole — transformer, pooling, normalization — with `torch.onnx.export` into
`<cache dir>/<model>-<hash>/model.onnx`, beside the fast tokenizer's `tokenizer.json` and a `meta.json`
(input names, `max_seq_length`, lower-casing, dimension). The folder is keyed by a hash of the model
folder's files, the export recipe's version and onnxruntime's version: changed weights or a new runtime
export again; an unchanged model is exported once and reused by every later process, which then needs
neither torch nor sentence-transformers. The `onnx-int8` variant is that file after onnxruntime's
dynamic int8 quantization (per-channel weights), `model-int8.onnx` in the same folder.

Running it: texts are tokenized in one `tokenizers` batch call (stripped and, where the model says so,
lower-cased, as sentence-transformers does), sorted by token count, cut into batches of about
`token_budget` tokens (a handful of short texts, or one long one) padded to their longest, and the
batches run on a thread pool, one intra-op thread each (onnxruntime releases the GIL; small batches on
separate cores beat one batch split across them). Rows come back in the input order, L2-normalized.

fp32 output equals the torch backend's to float rounding (cosine ≥ 0.99999 on the pool's 17,100
parameter texts; the same tool graph edge for edge). int8 is about twice as fast again but moves each
vector by a cosine of ~0.007 — and with it about one edge in eight of a 10k-tool graph, whose scores
crowd the threshold (measured in `benchmarks/toolgraph.py`); its vectors also depend slightly on the
batch they run in (activations are quantized per batch).

Export needs torch, sentence-transformers and the `onnx` package (`pip install 'envfactory[onnx]'`);
running a cached export needs only onnxruntime and tokenizers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel

from envfactory.errors import ConfigError

EXPORT_VERSION = 1  # bump when the export recipe changes: cached exports are keyed by it
MODEL_FILE = "model.onnx"
INT8_FILE = "model-int8.onnx"
ONNX_HINT = "pip install 'envfactory[onnx]'"
_EXPORT_PACKAGES = ("onnx", "torch", "sentence_transformers")
_RUN_PACKAGES = ("onnxruntime", "tokenizers")

Precision = Literal["fp32", "int8"]


class OnnxError(ConfigError):
    """The ONNX backend cannot export, load or run the model."""


class ExportMeta(BaseModel):
    """What the runner needs to feed the exported model as sentence-transformers would."""

    model: str
    files_hash: str
    inputs: list[str]
    max_seq_length: int
    do_lower_case: bool = False
    dim: int


def _missing(names: Sequence[str]) -> list[str]:
    """Those of `names` that cannot be imported (not installed, or blocked: None in sys.modules)."""
    missing = []
    for name in names:
        if name in sys.modules:
            if sys.modules[name] is None:
                missing.append(name)
        elif importlib.util.find_spec(name) is None:
            missing.append(name)
    return missing


def missing_packages(export: bool) -> list[str]:
    """The packages the backend lacks: to run a cached export, or (`export`) to make one."""
    return _missing(_RUN_PACKAGES + (_EXPORT_PACKAGES if export else ()))


@cache
def _hash_files(folder: str, stamp: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    root = Path(folder)
    for rel, _, _ in stamp:
        digest.update(rel.encode())
        with (root / rel).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def model_files_hash(folder: Path) -> str:
    """sha256 over the model folder's files (names and contents); read once per process while unchanged."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and ".git" not in p.parts)
    stamp = tuple((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _hash_files(str(folder), stamp)


def export_key(folder: Path) -> str:
    """The cache key of an export: the model files, the recipe version and the runtime that optimizes it."""
    import onnxruntime

    raw = f"{model_files_hash(folder)}:{EXPORT_VERSION}:{onnxruntime.__version__}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def export_dir(cache_dir: Path, model_name: str, folder: Path) -> Path:
    """`<cache dir>/<model name>-<key>`: the export of the model files in `folder`."""
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(model_name).name)[:40] or "model"
    return cache_dir / f"{slug}-{export_key(folder)}"


def _export(model_name: str, folder: Path, target: Path) -> None:
    """Trace the sentence-transformers model into `target` (a fresh folder)."""
    missing = _missing(_EXPORT_PACKAGES)
    if missing:
        raise OnnxError(f"exporting '{model_name}' to ONNX needs {', '.join(missing)}: {ONNX_HINT}")
    import torch

    from envfactory.llm.embeddings import load_model

    st = load_model(model_name)
    tokenizer = st.tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise OnnxError(f"'{model_name}' has no fast tokenizer (tokenizer.json): the ONNX backend cannot tokenize")
    names = [n for n in tokenizer.model_input_names if n in ("input_ids", "token_type_ids", "attention_mask")]
    if "input_ids" not in names or "attention_mask" not in names:
        raise OnnxError(f"'{model_name}' takes {tokenizer.model_input_names}: not a model the ONNX backend can feed")

    class Whole(torch.nn.Module):
        """The sentence-transformers pipeline (transformer, pooling, normalization) on positional inputs."""

        def __init__(self) -> None:
            super().__init__()
            self.st = st

        def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
            return self.st(dict(zip(names, tensors, strict=True)))["sentence_embedding"]

    sample = tokenizer(["an example text", "and a second, longer example text"], padding=True, return_tensors="pt")
    args = tuple(sample[n] for n in names)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python branches it fixes for these shapes
        dim = int(Whole()(*args).shape[1])
        torch.onnx.export(
            Whole().eval(),
            args,
            str(target / MODEL_FILE),
            dynamo=False,
            input_names=names,
            output_names=["embedding"],
            dynamic_axes={**{n: {0: "batch", 1: "tokens"} for n in names}, "embedding": {0: "batch"}},
            opset_version=17,
        )
    backend.save(str(target / "tokenizer.json"))
    first = st[0]
    meta = ExportMeta(
        model=model_name,
        files_hash=model_files_hash(folder),
        inputs=names,
        max_seq_length=int(st.max_seq_length or getattr(tokenizer, "model_max_length", 512)),
        do_lower_case=bool(getattr(first, "do_lower_case", False)),
        dim=dim,
    )
    (target / "meta.json").write_text(meta.model_dump_json(indent=2))


def _quantize(folder: Path) -> None:
    if _missing(("onnx",)):
        raise OnnxError(f"int8 quantization needs the onnx package: {ONNX_HINT}")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = folder / f".{INT8_FILE}.{os.getpid()}.tmp"
    quantize_dynamic(folder / MODEL_FILE, tmp, weight_type=QuantType.QInt8, per_channel=True)
    os.replace(tmp, folder / INT8_FILE)


_export_lock = threading.Lock()


def ensure_export(model_name: str, folder: Path, cache_dir: Path, precision: Precision) -> Path:
    """The cached export folder of the model in `folder`, exported (and quantized) first where missing.

    Written to a temporary folder and renamed into place: a process that finds the folder finds it whole;
    two processes exporting at once both finish, and one of the identical results stays."""
    with _export_lock:
        target = export_dir(cache_dir, model_name, folder)
        if not (target / "meta.json").is_file():
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache_dir))
            try:
                _export(model_name, folder, tmp)
                try:
                    tmp.rename(target)
                except OSError:  # another process put it there meanwhile
                    if not (target / "meta.json").is_file():
                        raise
            except OnnxError:
                raise
            except Exception as e:
                raise OnnxError(
                    f"exporting '{model_name}' to ONNX failed: {type(e).__name__}: {e}. "
                    "Use the torch backend (ENVFACTORY_TOOLGRAPH__EMBED_BACKEND=torch)."
                ) from e
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        if precision == "int8" and not (target / INT8_FILE).is_file():
            _quantize(target)
        return target


class OnnxModel:
    """An exported model loaded in onnxruntime, with its tokenizer: `embed(texts)` as sentence-transformers'
    `encode(..., normalize_embeddings=True)` would, on `threads` cores."""

    def __init__(self, folder: Path, precision: Precision = "fp32", *, threads: int = 0, token_budget: int = 256):
        missing = _missing(_RUN_PACKAGES)
        if missing:
            raise OnnxError(f"the ONNX backend needs {', '.join(missing)}: {ONNX_HINT}")
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.meta = ExportMeta.model_validate_json((folder / "meta.json").read_text())
        self.path = folder / (INT8_FILE if precision == "int8" else MODEL_FILE)
        self.threads = threads or len(os.sched_getaffinity(0))
        self.token_budget = token_budget
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # parallel over batches instead (see the module docstring)
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no busy-waiting on a shared CPU
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.meta.max_seq_length)
        self._pool: ThreadPoolExecutor | None = None

    @property
    def dim(self) -> int:
        return self.meta.dim

    def _batches(self, lengths: np.ndarray) -> list[tuple[int, int]]:
        """[start, end) ranges over rows sorted by length, each about `token_budget` padded tokens."""
        out: list[tuple[int, int]] = []
        start, n = 0, len(lengths)
        while start < n:
            end = start + 1
            while end < n and (end - start + 1) * int(lengths[end]) <= self.token_budget:
                end += 1
            out.append((start, end))
            start = end
        return out

    def _run(self, ids: list[list[int]], masks: list[list[int]], types: list[list[int]]) -> np.ndarray:
        width = max(len(row) for row in ids)
        feed: dict[str, np.ndarray] = {}
        for name, rows in (("input_ids", ids), ("attention_mask", masks), ("token_type_ids", types)):
            if name in self.meta.inputs:
                arr = np.zeros((len(rows), width), dtype=np.int64)
                for r, row in enumerate(rows):
                    arr[r, : len(row)] = row
                feed[name] = arr
        out: Any = self.session.run(None, feed)[0]
        return np.asarray(out, dtype=np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        clean = [t.strip() for t in texts]
        if self.meta.do_lower_case:
            clean = [t.lower() for t in clean]
        encodings = self.tokenizer.encode_batch(clean)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        order = np.argsort(lengths, kind="stable")
        ranges = self._batches(lengths[order])

        def run(span: tuple[int, int]) -> np.ndarray:
            rows = [encodings[k] for k in order[span[0] : span[1]]]
            return self._run([e.ids for e in rows], [e.attention_mask for e in rows], [e.type_ids for e in rows])

        if self.threads > 1 and len(ranges) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="onnx-embed")
            parts = list(self._pool.map(run, ranges))
        else:
            parts = [run(span) for span in ranges]
        vectors = np.empty((len(texts), self.dim), dtype=np.float32)
        vectors[order] = np.concatenate(parts)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


_loaded: dict[tuple[str, Precision, int, int], OnnxModel] = {}
_loaded_lock = threading.Lock()


def load_onnx(
    model_name: str, folder: Path, cache_dir: Path, precision: Precision, *, threads: int = 0, token_budget: int = 256
) -> OnnxModel:
    """The ONNX model of `model_name` (exported into `cache_dir` first if needed), loaded once per process."""
    target = ensure_export(model_name, folder, cache_dir, precision)
    key = (str(target), precision, threads, token_budget)
    with _loaded_lock:
        if key not in _loaded:
            _loaded[key] = OnnxModel(target, precision, threads=threads, token_budget=token_budget)
        return _loaded[key]
