"""Checks of command-line arguments that name things: one-line errors (exit 1) before a name reaches a path."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import typer

from envfactory.env.metadata import ENV_NAME, ENV_NAME_MAX
from envfactory.errors import EnvFactoryError
from envfactory.inputs import missing_folders
from envfactory.records.run_folder import RUN_FILES
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
    """Each of `names` checked by `env_name`, once each in the order given (none: an empty list)."""
    return list(dict.fromkeys(env_name(n) for n in names or []))


def _create_probe(folder: Path, shown: Path, option: str) -> None:
    """Create and remove a file in `folder`: the one test of writability that also holds for root, for read-only
    mounts and for /proc (where `os.access` says yes and every create fails)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".envfactory-probe-", dir=folder)
    except OSError as e:
        raise EnvFactoryError(f"{option} {shorten(str(shown))}: cannot write there: {e.strerror}") from None
    os.close(fd)
    os.unlink(probe)


def output_dir(path: Path, option: str = "--out") -> Path:
    """`path` if the command can write a folder there: an existing folder it can write into, or one it can
    create. Checked by doing it (the folders made for the check are removed again), so an output that is a
    file, a place under a file, or an unwritable place is one line before any work, and nothing is left."""
    path = path.expanduser()
    if path.exists() and not path.is_dir():
        raise EnvFactoryError(f"{option} {shorten(str(path))} is a file: {option} names a folder to write into")
    anchor, missing = missing_folders(path)
    if not anchor.is_dir():
        raise EnvFactoryError(f"{option} {shorten(str(path))}: {shorten(str(anchor))} is not a folder")
    made: list[Path] = []
    try:
        for folder in missing:
            try:
                folder.mkdir()
            except OSError as e:
                raise EnvFactoryError(
                    f"{option} {shorten(str(path))}: cannot create {shorten(str(folder))}: {e.strerror}"
                ) from None
            made.append(folder)
        _create_probe(path, path, option)
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
    return path


def output_file(path: Path, option: str = "--out") -> Path:
    """`path` if the command can write a file there (its folder is created when missing): a folder, or a place
    the file cannot be created, is one line before any work."""
    path = path.expanduser()
    if path.is_dir():
        raise EnvFactoryError(f"{option} {shorten(str(path))} is a folder: {option} names a file to write")
    if path.exists() and not path.is_file():
        raise EnvFactoryError(f"{option} {shorten(str(path))} is not a regular file")
    if path.parent.exists() and not path.parent.is_dir():
        raise EnvFactoryError(f"{option} {shorten(str(path))}: {shorten(str(path.parent))} is a file, not a folder")
    output_dir(path.parent, option=f"{option} {shorten(str(path))}: its folder")
    return path


def path_to_write(value: str) -> Path:
    """A typer parser for an option naming a place to write: an empty value is refused (as a path it would be
    the working folder, which nobody means by it), anything else is a `Path` for the callbacks below."""
    if not str(value).strip():
        raise typer.BadParameter("an empty path names no place to write; give a folder or file")
    return Path(value)


def _option_name(param: typer.CallbackParam) -> str:
    return param.opts[-1] if param.opts else f"<{param.name}>"


def out_dir_option(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    """A typer callback: `output_dir` for an option naming a folder to write (None passes)."""
    return None if value is None else output_dir(value, option=_option_name(param))


def out_file_option(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    """A typer callback: `output_file` for an option naming a file to write (None passes). '-' is refused: such an
    option writes a file, and a file named '-' is not what anyone means (`./-` names one)."""
    if value is not None and str(value) == "-":
        raise typer.BadParameter("'-' (standard output) is not a file this option writes; give a file name")
    return None if value is None else output_file(value, option=_option_name(param))


def out_file_or_stdout_option(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    """A typer callback: as `out_file_option`, but '-' passes: the command prints to standard output then."""
    if value is None or str(value) == "-":
        return value
    return output_file(value, option=_option_name(param))


def _resolved(path: Path) -> Path:
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError):  # a symlink loop: compared as written
        return path.expanduser().absolute()


def refuse_overwriting_input(out: Path | None, option: str, *inputs: Path | None) -> None:
    """An output that would replace what the command reads: the same file as an input, an existing file
    inside an input folder (a run's conversations, a table's own file), or, where an input is a run's file
    (`RUN_FILES`: its conversations...), another file of that run beside it (its summary, its held-out split), is
    one line before any work. A new file beside the inputs, or '-' (stdout), passes."""
    if out is None or str(out) == "-":
        return
    target = _resolved(out)
    for given in inputs:
        if given is None:
            continue
        source = _resolved(given)
        if (  # a run's own file (its summary, its held-out split) beside the run's file this command reads
            source.is_file()
            and source.name in RUN_FILES
            and target.is_file()
            and target.parent == source.parent
            and target.name in RUN_FILES
        ):
            raise EnvFactoryError(
                f"{option} {shorten(str(out))} would overwrite {target.name} of the run {shorten(str(source.parent))}, "
                f"whose {source.name} this command reads: write elsewhere"
            )
        if target == source or (source.is_dir() and target.is_file() and source in target.parents):
            raise EnvFactoryError(
                f"{option} {shorten(str(out))} would overwrite {shorten(str(given))}, "
                "which this command reads or writes: write elsewhere"
            )
