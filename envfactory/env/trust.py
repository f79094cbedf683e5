"""Which environments a person has reviewed and trusts to run in-process: `configs/trusted.json`.

An environment folder whose code is not pinned here is untrusted: its code runs only inside the
OS sandbox (`envfactory.env.sandboxed`), for validation and for every later use alike. Trusting
records a SHA-256 over the folder's files (code, metadata and anything else the code could import or
read; scenarios are data the parent reads and checks against the state model, and the EnvGen report
is a record, so neither is hashed); any changed, added or removed file loses the trust.

What was trusted is byte for byte what runs: `snapshot()` reads the folder once (`envfactory.env.folder`:
no link is followed — a folder holding one cannot be trusted or loaded — and `__pycache__` is never
read), hashes those bytes, and the loader compiles `env.py` from the same bytes, with no bytecode cache
read or written. The bundled environments are pinned in the committed file, so editing one without
re-trusting it makes it run sandboxed, and a test says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from envfactory.env.folder import FolderError, read_bytes, walk
from envfactory.errors import EnvError, EnvFactoryError
from envfactory.inputs import MAX_CODE_BYTES, MAX_FILE_BYTES, read_json_model, write_atomic

MAX_SNAPSHOT_BYTES = 2 * MAX_FILE_BYTES  # every hashed file of a folder together (the largest compiled: ~35 MB)
_NOT_HASHED_DIRS = frozenset({"scenarios"})
_NOT_HASHED_FILES = frozenset({"envgen.json"})
CODE_FILE = "env.py"
METADATA_FILE = "metadata.json"

log = logging.getLogger(__name__)


class TrustError(EnvError):
    """The trust file is malformed, or an environment cannot be trusted as asked."""


class TrustedEnv(BaseModel):
    sha256: str
    trusted_at: str = ""
    note: str = ""


class TrustFile(BaseModel):
    environments: dict[str, TrustedEnv] = Field(default_factory=dict)


def is_hashed(rel: str) -> bool:
    """True for the files of a folder that trust covers (`rel` as `folder.walk` lists it)."""
    parts = rel.split("/")
    return parts[0] not in _NOT_HASHED_DIRS and rel not in _NOT_HASHED_FILES


@dataclass(frozen=True)
class CodeSnapshot:
    """The hashed files of an environment folder, read once: what is hashed is what is loaded."""

    folder: Path
    files: dict[str, bytes]  # relative path -> bytes, every hashed file
    sha256: str

    @property
    def code(self) -> bytes | None:
        return self.files.get(CODE_FILE)

    @property
    def metadata(self) -> bytes | None:
        return self.files.get(METADATA_FILE)


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + hashlib.sha256(files[rel]).digest())
    return h.hexdigest()


def snapshot(folder: Path) -> CodeSnapshot:
    """Read `folder`'s hashed files once and hash them (`FolderError` for a link, a special file, a deep tree,
    more than `MAX_SNAPSHOT_BYTES` in all).

    The whole folder is walked, scenarios included, so a link anywhere refuses it. The total is bounded: a
    folder of thousands of sparse 64 MB files (kilobytes on disk) would otherwise be held in memory whole."""
    rels = [rel for rel in walk(folder) if is_hashed(rel)]
    limit = {CODE_FILE: MAX_CODE_BYTES}
    files: dict[str, bytes] = {}
    total = 0
    for rel in rels:
        files[rel] = read_bytes(folder, rel, max_bytes=limit.get(rel, MAX_FILE_BYTES), what="environment file")
        total += len(files[rel])
        if total > MAX_SNAPSHOT_BYTES:
            raise FolderError(f"{folder}: its files (scenarios aside) hold over {MAX_SNAPSHOT_BYTES} bytes in all")
    return CodeSnapshot(folder=folder, files=files, sha256=_digest(files))


def code_hash(folder: Path) -> str:
    """SHA-256 over every hashed file of the folder: relative path and bytes, in sorted order."""
    return snapshot(folder).sha256


def load_trust(path: Path) -> TrustFile:
    if not path.exists():
        return TrustFile()
    return read_json_model(path, TrustFile, what="trust file", error=lambda m: TrustError(f"{m}; fix or delete it"))


def is_trusted(path: Path, name: str, folder: Path) -> bool:
    """True if `name`'s folder hashes to what was trusted (a missing or broken trust file trusts nothing)."""
    expected = pinned(path, name)
    if expected is None:
        return False
    try:
        return code_hash(folder) == expected
    except EnvFactoryError:
        return False


def trusted_entry(path: Path, name: str) -> TrustedEnv | None:
    """`name`'s trust entry (None: not trusted, or the trust file does not read)."""
    try:
        return load_trust(path).environments.get(name)
    except TrustError as e:
        _warn_unreadable(path, e)
        return None


def pinned(path: Path, name: str) -> str | None:
    """The hash `name` was trusted with (None: not trusted, or the trust file does not read)."""
    entry = trusted_entry(path, name)
    return entry.sha256 if entry is not None else None


_warned: set[Path] = set()


def _warn_unreadable(path: Path, error: TrustError) -> None:
    """Once per file and process: a broken trust file trusts nothing (safe), but the person who wrote it should
    hear why their reviewed environments now run sandboxed."""
    if path not in _warned:
        _warned.add(path)
        log.warning("%s; every environment runs sandboxed until it reads", error)


MIN_EXPECT = 12  # hex digits of a reviewed hash given to `trust(expect=...)`


def trust(
    path: Path, name: str, folder: Path, note: str = "", expect: str | None = None, at: str | None = None
) -> TrustedEnv:
    """Pin `folder`'s current code as trusted under `name` (`at`: when a person trusted it, if not now: an export
    carries the pool's own trust over, and with it the same bytes on every export).

    `expect`: the hash (at least its first `MIN_EXPECT` hex digits) of the files the person reviewed, as
    `envs trust NAME --show` printed it: a folder changed between the review and this call (an EnvGen run
    rewriting it, someone editing it) is then refused instead of trusted as it is now."""
    if expect is not None and (len(expect) < MIN_EXPECT or any(c not in "0123456789abcdef" for c in expect.lower())):
        raise TrustError(f"--expect takes the reviewed sha256 (at least {MIN_EXPECT} hex digits)")
    try:
        snap = snapshot(folder)
    except EnvFactoryError as e:
        raise TrustError(f"cannot trust '{name}': {e}") from None
    if snap.code is None:
        raise TrustError(f"{folder}: no env.py to trust")
    if expect is not None and not snap.sha256.startswith(expect.lower()):
        raise TrustError(
            f"cannot trust '{name}': its files now hash to {snap.sha256[:16]}…, not the {expect[:16]}… reviewed; "
            "something changed them since: review them again (envs trust NAME --show)"
        )
    data = load_trust(path)
    when = at if at is not None else datetime.now(UTC).isoformat(timespec="seconds")
    entry = TrustedEnv(sha256=snap.sha256, trusted_at=when, note=note)
    data.environments[name] = entry
    _save(path, data)
    return entry


def revoke(path: Path, name: str) -> bool:
    """Forget `name`; True if it was trusted."""
    data = load_trust(path)
    if data.environments.pop(name, None) is None:
        return False
    _save(path, data)
    return True


def _save(path: Path, data: TrustFile) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = TrustFile(environments=dict(sorted(data.environments.items())))
    write_atomic(path, json.dumps(ordered.model_dump(mode="json"), indent=2) + "\n")
