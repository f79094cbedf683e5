"""Which environments a person has reviewed and trusts to run in-process: `configs/trusted.json`.

An environment folder whose code is not pinned here is untrusted: its code runs only inside the
OS sandbox (`envfactory.env.sandboxed`), for validation and for every later use alike. Trusting
records a SHA-256 over the folder's files (code and metadata; scenarios are data and the EnvGen
report is a record, so neither is hashed); any changed, added or removed file loses the trust.
The bundled environments are pinned in the committed file, so editing one without re-trusting
it makes it run sandboxed, and a test says so.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from envfactory.errors import EnvFactoryError
from envfactory.inputs import MAX_FILE_BYTES, InputError, read_file_bytes, read_json_model, write_atomic

_NOT_HASHED_DIRS = frozenset({"scenarios", "__pycache__"})
_NOT_HASHED_FILES = frozenset({"envgen.json"})


class TrustError(EnvFactoryError):
    """The trust file is malformed, or an environment cannot be trusted as asked."""


class TrustedEnv(BaseModel):
    sha256: str
    trusted_at: str = ""
    note: str = ""


class TrustFile(BaseModel):
    environments: dict[str, TrustedEnv] = Field(default_factory=dict)


def code_hash(folder: Path) -> str:
    """SHA-256 over every hashed file of the folder: relative path and bytes, in sorted order."""
    h = hashlib.sha256()
    files = sorted(
        p
        for p in folder.rglob("*")
        if not (set(p.relative_to(folder).parts[:-1]) & _NOT_HASHED_DIRS)
        and p.relative_to(folder).parts[0] not in _NOT_HASHED_DIRS
        and p.name not in _NOT_HASHED_FILES
        and not p.name.endswith(".pyc")
        and (p.is_file() or p.is_symlink())
    )
    for p in files:
        rel = p.relative_to(folder).as_posix()
        if p.is_symlink():  # hashed as what it points to: a link swapped to another target loses the trust
            content = b"symlink:" + str(p.readlink()).encode("utf-8", "surrogateescape")
        else:
            content = read_file_bytes(p, max_bytes=MAX_FILE_BYTES, what="environment file")
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + hashlib.sha256(content).digest())
    return h.hexdigest()


def load_trust(path: Path) -> TrustFile:
    if not path.exists():
        return TrustFile()
    try:
        return read_json_model(path, TrustFile, what="trust file")
    except InputError as e:
        raise TrustError(f"{e}; fix or delete it") from None


def is_trusted(path: Path, name: str, folder: Path) -> bool:
    """True if `name`'s folder hashes to what was trusted (a missing or broken trust file trusts nothing)."""
    try:
        entry = load_trust(path).environments.get(name)
    except TrustError:
        return False
    if entry is None:
        return False
    try:
        return code_hash(folder) == entry.sha256
    except InputError:
        return False


def trust(path: Path, name: str, folder: Path, note: str = "") -> TrustedEnv:
    """Pin `folder`'s current code as trusted under `name`."""
    if not (folder / "env.py").is_file():
        raise TrustError(f"{folder}: no env.py to trust")
    data = load_trust(path)
    entry = TrustedEnv(sha256=code_hash(folder), trusted_at=datetime.now(UTC).isoformat(timespec="seconds"), note=note)
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
