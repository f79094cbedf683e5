"""Reading the package tarball safely: nothing in it is extracted by name.

The tarball is read as a stream, member by member. Only regular files under `package/api/` with a
`.json`, `.yaml` or `.yml` suffix are taken; links, devices and folders are never followed or created,
a name that is absolute, holds `..`, a backslash or a control character is skipped, and so is a member
over `max_spec_bytes`. The package may hold at most `max_members` entries and `max_total_bytes`
unpacked, or it is refused. What is taken comes back as bytes with a spec id checked against
`SPEC_ID`; the caller writes files under its own folder from that id, never from the member's name.
"""

from __future__ import annotations

import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, NamedTuple

from envfactory.corpus.models import SPEC_ID, CorpusError, Skipped
from envfactory.corpus.settings import CorpusSettings

API_PREFIX = "package/api/"
SPEC_SUFFIXES = (".json", ".yaml", ".yml")
Progress = Callable[[str, int, int], None]


class SpecMember(NamedTuple):
    """A spec read from the package: its id, its suffix and its bytes."""

    spec_id: str
    suffix: str
    data: bytes


def _unsafe_name(name: str) -> str | None:
    """Why a member name is unsafe, or None."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "the name holds a control character"
    if "\\" in name:
        return "the name holds a backslash"
    if name.startswith("/"):
        return "an absolute path"
    if ".." in PurePosixPath(name).parts:
        return "the path leaves the package (..)"
    return None


def read_specs(
    tarball: Path, cs: CorpusSettings, skipped: list[Skipped], progress: Progress | None = None
) -> Iterator[SpecMember]:
    """The specs of the package at `tarball`, in the tarball's order; `skipped` collects what was not taken.

    `progress("extract (MiB)", done, total)` follows the compressed bytes read.
    """
    size = tarball.stat().st_size
    total_mib = max(1, -(-size // (1 << 20)))
    members = unpacked = 0
    try:
        with tarball.open("rb") as raw, tarfile.open(fileobj=raw, mode="r|*") as tar:
            for member in tar:
                members += 1
                if members > cs.max_members:
                    raise CorpusError(f"{tarball}: more than {cs.max_members} entries (max_members); refused")
                if progress is not None and members % 64 == 0:
                    progress("extract (MiB)", min(total_mib, raw.tell() >> 20), total_mib)
                name = member.name
                problem = _unsafe_name(name)
                if problem is not None:
                    skipped.append(Skipped(member=name.encode("unicode_escape").decode("ascii")[:300], reason=problem))
                    continue
                name = name.removeprefix("./")
                if not name.startswith(API_PREFIX) or member.isdir():
                    continue
                rel = name[len(API_PREFIX) :]
                suffix = PurePosixPath(rel).suffix.lower()
                if suffix not in SPEC_SUFFIXES:
                    continue
                if not member.isreg():
                    kind = "a link" if member.issym() or member.islnk() else "not a regular file"
                    skipped.append(Skipped(member=name, reason=kind))
                    continue
                unpacked += member.size
                if unpacked > cs.max_total_bytes:
                    raise CorpusError(
                        f"{tarball}: more than {cs.max_total_bytes} bytes unpacked (max_total_bytes); refused"
                    )
                if member.size > cs.max_spec_bytes:
                    skipped.append(Skipped(member=name, reason=f"{member.size} bytes, over max_spec_bytes"))
                    continue
                spec_id = rel[: -len(suffix)]
                if not SPEC_ID.fullmatch(spec_id):
                    skipped.append(Skipped(member=name, reason="a name the corpus does not accept as an id"))
                    continue
                data = _read_member(tar, member, cs.max_spec_bytes)
                if data is None:
                    skipped.append(Skipped(member=name, reason="its data is shorter or longer than its header says"))
                    continue
                yield SpecMember(spec_id, suffix, data)
            if progress is not None:
                progress("extract (MiB)", total_mib, total_mib)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise CorpusError(f"{tarball}: not a readable tarball: {type(e).__name__}: {e}") from None


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, limit: int) -> bytes | None:
    f: IO[bytes] | None = tar.extractfile(member)
    if f is None:
        return None
    data = f.read(limit + 1)
    return data if len(data) == member.size else None
