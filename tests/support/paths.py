"""Where things are, for every test folder: the repository root, the checked-in test data (tests/data) and the
models the suite derives once per machine (the ONNX export of the embedding model)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/support/paths.py → the repository
TEST_DATA = ROOT / "tests" / "data"


def model_cache() -> Path:
    """Derived models kept between runs (`ENVFACTORY_TEST_CACHE`, else the user's cache folder): the suite exports
    the packaged embedder to ONNX once per machine, not once per run or per worker. Like the training cache
    (`training.loading.cache_root`), it holds only what the project derives from files it ships."""
    env = os.environ.get("ENVFACTORY_TEST_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "envfactory" / "tests"
