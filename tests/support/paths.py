"""Where things are, for every test folder: the repository root and the checked-in test data (tests/data)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/support/paths.py → the repository
TEST_DATA = ROOT / "tests" / "data"
