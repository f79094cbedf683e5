"""BFCL multi-turn environments through the envfactory contract (implemented in this issue)."""

from __future__ import annotations

from collections.abc import Callable

from envfactory.env.environment import BaseEnvironment


def available() -> bool:
    return False


def factories() -> dict[str, Callable[[], BaseEnvironment]]:
    return {}
