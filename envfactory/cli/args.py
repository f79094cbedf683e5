"""Checks of command-line arguments that name things: one-line errors (exit 1) before a name reaches a path."""

from __future__ import annotations

from collections.abc import Iterable

from envfactory.env.metadata import ENV_NAME, ENV_NAME_MAX
from envfactory.errors import EnvFactoryError
from envfactory.terminal import shorten


def env_name(name: str) -> str:
    """`name` if it can name an environment (the metadata's rule), else an `EnvFactoryError` saying why.

    Checked first: a name too long for the file system was an ENAMETOOLONG traceback, and one with a
    newline or a `/` a path elsewhere."""
    if not ENV_NAME.fullmatch(name):
        raise EnvFactoryError(
            f"{shorten(name)!r} is not an environment name (letters, digits, underscore, at most {ENV_NAME_MAX}"
            " characters; see `envfactory envs list`)"
        )
    return name


def env_names(names: Iterable[str] | None) -> list[str]:
    """Each of `names` checked by `env_name` (none: an empty list)."""
    return [env_name(n) for n in names or []]
