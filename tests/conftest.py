"""Shared fixtures: the real bundled pool, loaded once per test run."""

from __future__ import annotations

from pathlib import Path

import pytest

from envfactory.config import Settings
from envfactory.env.pool import EnvPool

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def pool() -> EnvPool:
    return EnvPool(Settings(root=ROOT))
