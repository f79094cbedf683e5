"""An environment's folder, read without ever leaving it.

Every read of an environment folder's files — its code, metadata, scenarios, an export's copy — goes
through here. Paths are opened one component at a time relative to the folder (`openat` with
`O_NOFOLLOW`), so a symbolic link anywhere inside — `env.py`, a scenario, `scenarios/` itself, the
folder itself — is refused, never followed: nothing in an environment's folder can make the parent read
a file outside it. A hard link (a file with another name, anywhere on the file system: a root-only file
linked in) and a mount inside the folder (a host file or folder bound over one of its paths) are refused
the same way: a file is read only if the folder is its one name and it lies on the folder's own mount.
Only regular files are read (a FIFO or a device is refused at once), each bounded in size; walks are
bounded in depth, in entries and in name length, and iterative, so a 1,000-deep tree or a 300-character
name is a one-line `FolderError`, not a traceback.

`walk()` lists a folder's files once, refusing what it must; `read_files()` takes their bytes. Trust
(`envfactory.env.trust`) hashes those bytes and the loader compiles the very same bytes.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from envfactory.errors import EnvLoadError
from envfactory.inputs import MAX_FILE_BYTES, parse_json, read_bounded, write_new_file

MAX_DEPTH = 8  # scenarios/tests/<name>.json is 3 levels; anything far deeper is not an environment
MAX_ENTRIES = 5_000  # files and folders in one environment folder
MAX_NAME_BYTES = 255  # one path component (the usual filesystem limit)
SKIPPED_DIRS = frozenset({"__pycache__"})  # never read: environment code is compiled from its source bytes

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | _CLOEXEC


_NO_LINKS = "links in an environment folder are refused (copy the file in)"
_NO_MOUNTS = "a mount inside an environment folder is refused (copy the files in)"


class FolderError(EnvLoadError):
    """A file of an environment folder cannot be read safely: a link, not a regular file, too large, too deep."""


def _shown(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parts(rel: str) -> list[str]:
    """`rel` as path components; absolute paths, `..`, empty and over-long components are refused."""
    parts = [p for p in PurePosixPath(rel).parts if p != "."]
    if not parts or PurePosixPath(rel).is_absolute() or any(p in ("", "..") for p in parts):
        raise FolderError(f"{_shown(rel)!r} is not a path inside an environment folder")
    for p in parts:
        if len(p.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
            raise FolderError(f"a name in {_shown(rel)!r} is longer than {MAX_NAME_BYTES} bytes")
    return parts


def _why(e: OSError, where: str, what: str) -> FolderError:
    if e.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW (| O_DIRECTORY) on a link: ELOOP or ENOTDIR
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.lstat(where).st_mode):  # only for the message: nothing is read through it
                return FolderError(f"{where} is a symbolic link: {_NO_LINKS}")
    if e.errno == errno.ELOOP:
        return FolderError(f"{where} is a symbolic link: {_NO_LINKS}")
    if e.errno == errno.ENOTDIR:
        return FolderError(f"{where}: a part of the path is not a folder")
    if e.errno == errno.ENOENT:
        return FolderError(f"{where}: no such {what}")
    if e.errno == errno.ENAMETOOLONG:
        return FolderError(f"{_shown(where)}: a name is too long")
    return FolderError(f"{where}: cannot open the {what}: {e.strerror or e}")


def mount_id(fd: int) -> int | None:
    """The id of the mount `fd` lies on (`/proc/self/fdinfo`), or None where the kernel does not say.

    `st_dev` would not do: a bind mount from the same file system keeps it, and overlayfs reports the
    layer's device for files."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
            for line in f.read(4096).splitlines():
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _same_mount(root: int | None, fd: int, where: str) -> None:
    """Refuse `fd` (just opened below the folder) if it lies on another mount than the folder (`root`)."""
    if root is not None and mount_id(fd) not in (root, None):
        raise FolderError(f"{where} is a mount point: {_NO_MOUNTS}")


@contextlib.contextmanager
def _open_root(folder: Path) -> Iterator[int]:
    """The folder itself, opened without following a link in its last component."""
    try:
        fd = os.open(folder, _DIR_FLAGS)
    except OSError as e:
        raise _why(e, str(folder), "environment folder") from None
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _open_dir(folder: Path, parts: list[str]) -> Iterator[int]:
    """The folder `parts` below `folder`, each component opened relative to the last, never through a link."""
    fds: list[int] = []
    try:
        with _open_root(folder) as root:
            current = root
            mount = mount_id(root) if parts else None
            for i, part in enumerate(parts):
                where = str(folder.joinpath(*parts[: i + 1]))
                try:
                    current = os.open(part, _DIR_FLAGS, dir_fd=current)
                except OSError as e:
                    raise _why(e, where, "folder") from None
                fds.append(current)
                _same_mount(mount, current, where)
            yield current
    finally:
        for fd in fds:
            os.close(fd)


def _read_fd(fd: int, where: str, max_bytes: int, what: str) -> bytes:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise FolderError(f"{where}: the {what} is not a regular file")
    if st.st_nlink != 1:  # another name of the same file: possibly outside the folder, possibly root's
        raise FolderError(f"{where} is a hard link ({st.st_nlink} names for one file): {_NO_LINKS}")
    if st.st_size > max_bytes:
        raise FolderError(f"{where}: the {what} is {st.st_size} bytes, over the {max_bytes}-byte limit")
    data = read_bounded(fd, max_bytes)
    if len(data) > max_bytes:
        raise FolderError(f"{where}: the {what} is over the {max_bytes}-byte limit")
    return data


def _read_at(dir_fd: int, name: str, where: str, max_bytes: int, what: str) -> bytes:
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        raise _why(e, where, what) from None
    try:
        _same_mount(mount_id(dir_fd), fd, where)
        return _read_fd(fd, where, max_bytes, what)
    except OSError as e:
        raise FolderError(f"{where}: cannot read the {what}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def read_bytes(folder: Path, rel: str, *, max_bytes: int = MAX_FILE_BYTES, what: str = "file") -> bytes:
    """The bytes of the regular file `rel` inside `folder`, never through a link; bounded in size."""
    parts = _parts(rel)
    where = str(folder.joinpath(*parts))
    with _open_dir(folder, parts[:-1]) as fd:
        return _read_at(fd, parts[-1], where, max_bytes, what)


def read_text(folder: Path, rel: str, *, max_bytes: int = MAX_FILE_BYTES, what: str = "file") -> str:
    data = read_bytes(folder, rel, max_bytes=max_bytes, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FolderError(f"{folder / rel}: the {what} is not valid UTF-8 (byte {e.start})") from None


def parse_json_object(data: bytes, where: str, what: str) -> dict[str, Any]:
    """Bytes read from a folder as a JSON object, bounded in depth; one-line `FolderError`s."""
    value = parse_json(data, where, error=FolderError)
    if not isinstance(value, dict):
        raise FolderError(f"{where}: the {what} must be a JSON object")
    return value


def read_json_object(folder: Path, rel: str, *, what: str = "file") -> dict[str, Any]:
    """A JSON object from the regular file `rel` inside `folder` (never through a link)."""
    return parse_json_object(read_bytes(folder, rel, what=what), str(folder / rel), what)


def exists(folder: Path, rel: str) -> bool:
    """True if `rel` names an entry inside `folder` reached without a link (the entry itself may be one)."""
    parts = _parts(rel)
    try:
        with _open_dir(folder, parts[:-1]) as fd:
            os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    except (FolderError, OSError):
        return False
    return True


def list_names(folder: Path, rel_dir: str, suffix: str) -> list[str]:
    """Names (without `suffix`) of the entries of `folder/rel_dir` ending in `suffix` that are not folders.

    A link is listed (reading it is refused, loudly); a missing folder lists nothing."""
    try:
        with _open_dir(folder, _parts(rel_dir)) as fd, os.scandir(fd) as it:
            return sorted(
                e.name[: -len(suffix)]
                for e in it
                if e.name.endswith(suffix) and len(e.name) > len(suffix) and not e.is_dir(follow_symlinks=False)
            )
    except FolderError:
        return []


def _names(entry: os.DirEntry[str]) -> int:
    """How many names the regular file `entry` has (its hard links); 0 for anything else."""
    return entry.stat(follow_symlinks=False).st_nlink if entry.is_file(follow_symlinks=False) else 0


def walk(
    folder: Path,
    *,
    max_depth: int = MAX_DEPTH,
    max_entries: int = MAX_ENTRIES,
    skip_dirs: frozenset[str] = SKIPPED_DIRS,
) -> list[str]:
    """Every regular file below `folder` as a sorted relative POSIX path; `skip_dirs` are not entered.

    Refuses (`FolderError`, one line naming the path) a link anywhere (symbolic or hard), a mount, anything
    that is neither a regular file nor a folder, a tree deeper than `max_depth` or with more than
    `max_entries` entries.
    Iterative: no recursion on a hostile tree."""
    files: list[str] = []
    entries = 0
    with _open_root(folder) as root:
        mount = mount_id(root)
        stack: list[tuple[int, tuple[str, ...]]] = [(os.dup(root), ())]
        try:
            while stack:
                fd, prefix = stack.pop()
                try:
                    with os.scandir(fd) as it:  # no more entries than could still be allowed are listed
                        listed = list(itertools.islice(it, max_entries - entries + 1))
                except OSError as e:
                    os.close(fd)
                    raise _why(e, str(folder.joinpath(*prefix)), "folder") from None
                try:
                    for entry in listed:
                        name = entry.name
                        entries += 1
                        rel = (*prefix, name)
                        where = str(folder.joinpath(*rel))
                        if entries > max_entries:
                            raise FolderError(f"{folder}: more than {max_entries} files and folders")
                        if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
                            raise FolderError(f"{_shown(where)}: a name is longer than {MAX_NAME_BYTES} bytes")
                        if entry.is_symlink():
                            raise FolderError(f"{where} is a symbolic link: {_NO_LINKS}")
                        if entry.is_dir(follow_symlinks=False):
                            if name in skip_dirs:
                                continue
                            if len(rel) >= max_depth:
                                raise FolderError(f"{_shown(where)}: folders nested deeper than {max_depth} levels")
                            try:
                                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                            except OSError as e:
                                raise _why(e, where, "folder") from None
                            stack.append((sub, rel))
                            _same_mount(mount, sub, where)
                            continue
                        try:
                            names = _names(entry)
                        except OSError as e:
                            raise _why(e, where, "file") from None
                        if names == 1:
                            files.append("/".join(rel))
                        elif names > 1:
                            raise FolderError(f"{where} is a hard link ({names} names for one file): {_NO_LINKS}")
                        else:
                            raise FolderError(f"{where}: not a regular file or a folder (a FIFO, socket or device)")
                finally:
                    os.close(fd)
        except BaseException:
            for fd, _ in stack:
                os.close(fd)
            raise
    return sorted(files)


def write_files(target: Path, files: dict[str, bytes]) -> None:
    """Write `files` (relative path -> bytes) under `target` as new regular files (an export's copy).

    `target` must not exist yet: nothing already there (a planted link) is written through."""
    try:
        target.mkdir(parents=True, exist_ok=False)
    except FileExistsError:
        raise FolderError(f"{target} already exists") from None
    for rel, data in files.items():
        parts = _parts(rel)
        path = target.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_new_file(path, data)
