"""What was trusted is byte for byte what runs, and nothing in an environment's folder reaches outside it.

After `envs trust`, every mutation of the folder — an edit, an added, deleted or renamed file, a link
anywhere, a file or folder replaced by a link, a planted bytecode cache, a changed scenario or metadata —
either drops the trust (the code then runs only in the sandbox, or the folder is refused) or provably
does not change what runs in-process. Links are never followed by the parent: not for code, metadata,
scenarios or exports.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import py_compile
import random
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from envfactory.config import Settings
from envfactory.env.environment import Environment
from envfactory.env.folder import FolderError, list_names, read_json_object, walk
from envfactory.env.metadata import dump_metadata, parse_metadata
from envfactory.env.pool import EnvPool, load_env_folder
from envfactory.env.trust import TrustError, code_hash, is_trusted, snapshot, trust
from envfactory.errors import EnvLoadError, EnvNotFoundError, ScenarioError
from envfactory.inputs import MAX_FILE_BYTES
from tests.support.paths import ROOT

CODE = '''"""A tiny environment for trust tests."""

from __future__ import annotations

from envfactory.env import Environment, Record, State


class Note(Record):
    id: str
    text: str


class NotesDB(State):
    notes: dict[str, Note] = {}


env = Environment("notes", NotesDB, description="Notes.", domain="office")


@env.tool(kind="read")
def answer(db: NotesDB) -> str:
    """What this version of the code answers.

    Returns:
        A fixed word.
    """
    return "ANSWER"
'''
GOOD, EVIL = "trusted", "changed"


def code(word: str) -> str:
    return CODE.replace("ANSWER", word)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A project with one environment folder `notes`, trusted as it is written here."""
    root = tmp_path / "project"
    folder = root / "envs" / "notes"
    (folder / "scenarios" / "tests").mkdir(parents=True)
    (root / "configs").mkdir()
    (folder / "env.py").write_text(code(GOOD), encoding="utf-8")
    (folder / "scenarios" / "default.json").write_text(json.dumps({"notes": {}}), encoding="utf-8")
    (folder / "scenarios" / "tests" / "t.json").write_text("{}", encoding="utf-8")
    (folder / "envgen.json").write_text("{}", encoding="utf-8")
    try:
        dump_metadata(load_env_folder(folder, with_metadata=False).derived_metadata(), folder / "metadata.json")
        trust(root / "configs" / "trusted.json", "notes", folder)
        yield root
    finally:
        sys.modules.pop("envfactory_envs.notes", None)


def settings(root: Path) -> Settings:
    return Settings(root=root)


def outcome(root: Path) -> str:
    """How a fresh pool treats `notes` now: 'refused', 'sandboxed', or the in-process answer."""
    pool = EnvPool(settings(root))
    try:
        if not pool.trusted("notes"):
            return "untrusted"
        env = pool.get("notes")
    except (EnvLoadError, ScenarioError):
        return "refused"
    finally:
        sys.modules.pop("envfactory_envs.notes", None)
    if not isinstance(env, Environment):
        return "sandboxed"
    rec = env.session({}).call("answer", {})
    return f"ran:{rec.result}"


# ---- the mutations -----------------------------------------------------------------------------


def _outside(root: Path, name: str, text: str) -> Path:
    path = root.parent / "outside" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def edit_code(root: Path, rng: random.Random) -> None:
    (root / "envs" / "notes" / "env.py").write_text(code(EVIL), encoding="utf-8")


def touch_code(root: Path, rng: random.Random) -> None:
    path = root / "envs" / "notes" / "env.py"
    path.write_text(path.read_text(encoding="utf-8") + rng.choice(["\n", "# c\n", " "]), encoding="utf-8")


def add_file(root: Path, rng: random.Random) -> None:
    name = rng.choice(["helper.py", "data.csv", "sub/x.py", "tests/y.json"])
    path = root / "envs" / "notes" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x = 1\n", encoding="utf-8")


def delete_file(root: Path, rng: random.Random) -> None:
    (root / "envs" / "notes" / rng.choice(["metadata.json", "env.py"])).unlink()


def rename_file(root: Path, rng: random.Random) -> None:
    folder = root / "envs" / "notes"
    (folder / "metadata.json").rename(folder / "meta.json")


def edit_metadata(root: Path, rng: random.Random) -> None:
    path = root / "envs" / "notes" / "metadata.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["description"] = "Edited."
    path.write_text(json.dumps(data), encoding="utf-8")


def edit_scenario(root: Path, rng: random.Random) -> None:
    path = root / "envs" / "notes" / "scenarios" / "default.json"
    path.write_text(json.dumps({"notes": {"N-1": {"id": "N-1", "text": "x"}}}), encoding="utf-8")


def edit_report(root: Path, rng: random.Random) -> None:
    (root / "envs" / "notes" / "envgen.json").write_text('{"edited": true}', encoding="utf-8")


def add_link(root: Path, rng: random.Random) -> None:
    target = _outside(root, "secret.json", '{"secret": 1}')
    where = rng.choice(["link.json", "scenarios/extra.json", "scenarios/tests/l.json", "lib.py"])
    os.symlink(target, root / "envs" / "notes" / where)


def code_as_link(root: Path, rng: random.Random) -> None:
    """env.py replaced by a link to code kept elsewhere (inside the folder or out), edited afterwards."""
    folder = root / "envs" / "notes"
    inside = rng.random() < 0.5
    target = folder / "scenarios" / "code.txt" if inside else _outside(root, "env.py", "")
    target.write_text(code(GOOD), encoding="utf-8")
    (folder / "env.py").unlink()
    os.symlink(target, folder / "env.py")
    target.write_text(code(EVIL), encoding="utf-8")


def scenarios_as_link(root: Path, rng: random.Random) -> None:
    folder = root / "envs" / "notes"
    elsewhere = root.parent / "outside" / "scenarios"
    elsewhere.mkdir(parents=True, exist_ok=True)
    (elsewhere / "default.json").write_text("{}", encoding="utf-8")
    (folder / "scenarios" / "default.json").unlink()
    (folder / "scenarios" / "tests" / "t.json").unlink()
    (folder / "scenarios" / "tests").rmdir()
    (folder / "scenarios").rmdir()
    os.symlink(elsewhere, folder / "scenarios")


def metadata_as_link(root: Path, rng: random.Random) -> None:
    folder = root / "envs" / "notes"
    target = _outside(root, "metadata.json", (folder / "metadata.json").read_text(encoding="utf-8"))
    (folder / "metadata.json").unlink()
    os.symlink(target, folder / "metadata.json")


def plant_pyc(root: Path, rng: random.Random, beside: bool = False) -> None:
    """Bytecode of other code where the import system would look, marked not to be checked against the source."""
    folder = root / "envs" / "notes"
    evil = root.parent / "outside" / "evil.py"
    evil.parent.mkdir(exist_ok=True)
    evil.write_text(code(EVIL), encoding="utf-8")
    cfile = folder / "__pycache__" / f"env.{sys.implementation.cache_tag}.pyc"
    if beside:
        cfile = folder / "env.pyc"
    cfile.parent.mkdir(exist_ok=True)
    unchecked = py_compile.PycInvalidationMode.UNCHECKED_HASH
    py_compile.compile(str(evil), cfile=str(cfile), dfile=str(folder / "env.py"), invalidation_mode=unchecked)


def plant_pyc_beside(root: Path, rng: random.Random) -> None:
    plant_pyc(root, rng, beside=True)


def deep_tree(root: Path, rng: random.Random) -> None:
    deep_folders(root / "envs" / "notes" / "scenarios", rng.choice([20, 300]))


def fifo(root: Path, rng: random.Random) -> None:
    os.mkfifo(root / "envs" / "notes" / "scenarios" / "pipe.json")


def hard_link(root: Path, rng: random.Random) -> None:
    """Another name for a file outside the folder (the same file system), or for one of the folder's own."""
    folder = root / "envs" / "notes"
    target = _outside(root, "hard.json", '{"secret": 1}') if rng.random() < 0.5 else folder / "envgen.json"
    where = rng.choice(["scenarios/extra.json", "lib.py", "scenarios/tests/h.json"])
    os.link(target, folder / where)


def sparse_files(root: Path, rng: random.Random) -> None:
    """Files of the largest size a file may have, holding nothing on disk (a few kilobytes in all)."""
    for i in range(3):
        with open(root / "envs" / "notes" / f"pad{i}.bin", "wb") as f:
            f.truncate(MAX_FILE_BYTES)


MUTATIONS: list[Callable[[Path, random.Random], None]] = [
    edit_code,
    touch_code,
    add_file,
    delete_file,
    rename_file,
    edit_metadata,
    edit_scenario,
    edit_report,
    add_link,
    code_as_link,
    scenarios_as_link,
    metadata_as_link,
    plant_pyc,
    plant_pyc_beside,
    deep_tree,
    fifo,
    hard_link,
    sparse_files,
]
# what must stay in-process and unchanged (data and records, a cache nobody reads); every other mutation drops trust
HARMLESS = {edit_scenario, edit_report, plant_pyc}


@pytest.mark.parametrize("seed", range(12))
def test_random_mutations_after_trust_drop_it_or_change_nothing_that_runs(project: Path, seed: int) -> None:
    assert outcome(project) == f"ran:{GOOD}"
    rng = random.Random(seed)
    chosen = rng.sample(MUTATIONS, rng.choice([1, 1, 2, 3]))
    for mutate in chosen:
        with contextlib.suppress(FileNotFoundError):  # an earlier mutation removed what this one edits
            mutate(project, rng)
    now = outcome(project)
    assert now in ("untrusted", "refused", f"ran:{GOOD}"), f"{[m.__name__ for m in chosen]}: {now}"
    if all(m in HARMLESS for m in chosen):
        assert now == f"ran:{GOOD}", [m.__name__ for m in chosen]
    else:
        assert now in ("untrusted", "refused"), [m.__name__ for m in chosen]


@pytest.mark.parametrize("mutate", MUTATIONS, ids=lambda m: m.__name__)
def test_each_mutation_alone(project: Path, mutate: Callable[[Path, random.Random], None]) -> None:
    mutate(project, random.Random(0))
    assert outcome(project) == (f"ran:{GOOD}" if mutate in HARMLESS else "untrusted")


def test_a_linked_env_py_cannot_be_trusted(project: Path) -> None:
    """The reported attack: env.py as a link into scenarios/ (not hashed), edited after trust."""
    folder = project / "envs" / "notes"
    code_as_link(project, random.Random(1))
    with pytest.raises(TrustError, match="symbolic link"):
        trust(project / "configs" / "trusted.json", "notes", folder)
    assert not is_trusted(project / "configs" / "trusted.json", "notes", folder)
    with pytest.raises(EnvLoadError, match="symbolic link"):
        EnvPool(settings(project)).get("notes")


def test_a_planted_unchecked_pyc_never_runs(project: Path) -> None:
    plant_pyc(project, random.Random(0))
    assert outcome(project) == f"ran:{GOOD}"
    assert is_trusted(project / "configs" / "trusted.json", "notes", project / "envs" / "notes")


def test_no_bytecode_cache_is_written(project: Path) -> None:
    outcome(project)
    assert not (project / "envs" / "notes" / "__pycache__").exists()


def test_the_bytes_hashed_are_the_bytes_compiled(project: Path) -> None:
    """A file changed after it was read and hashed does not change what is loaded from that read."""
    folder = project / "envs" / "notes"
    snap = snapshot(folder)
    (folder / "env.py").write_text(code(EVIL), encoding="utf-8")
    try:
        env = load_env_folder(folder, snap=snap)
        assert env.session({}).call("answer", {}).result == GOOD
    finally:
        sys.modules.pop("envfactory_envs.notes", None)
    assert snap.sha256 != code_hash(folder)


@pytest.mark.parametrize("when", ["import", "call"])
def test_a_module_beside_env_py_is_never_imported(project: Path, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """`from envs.notes import helper` (the working folder on sys.path, as with `python -m envfactory.cli`): the
    import system would read helper.py again after the hash, and a planted unchecked `.pyc` of it first."""
    folder = project / "envs" / "notes"
    (folder / "helper.py").write_text("def word() -> str:\n    return 'trusted'\n", encoding="utf-8")
    importer = "import importlib\n"
    if when == "import":
        importer += "helper = importlib.import_module('envs.notes.helper')\n"
        body = "return helper.word()"
    else:
        body = "return importlib.import_module('envs.notes.helper').word()"
    source = code(GOOD).replace("class Note(Record):", importer + "\n\nclass Note(Record):")
    (folder / "env.py").write_text(source.replace('return "trusted"', body), encoding="utf-8")
    trust(project / "configs" / "trusted.json", "notes", folder)
    evil = project.parent / "outside" / "helper.py"
    evil.parent.mkdir(exist_ok=True)
    evil.write_text("def word() -> str:\n    return 'changed'\n", encoding="utf-8")
    cfile = folder / "__pycache__" / f"helper.{sys.implementation.cache_tag}.pyc"
    cfile.parent.mkdir()
    unchecked = py_compile.PycInvalidationMode.UNCHECKED_HASH
    py_compile.compile(str(evil), cfile=str(cfile), dfile=str(folder / "helper.py"), invalidation_mode=unchecked)
    monkeypatch.syspath_prepend(str(project))
    try:
        assert is_trusted(project / "configs" / "trusted.json", "notes", folder)
        now = outcome(project)
        if when == "import":
            assert now == "refused"
            with pytest.raises(EnvLoadError, match="in an environment folder"):
                EnvPool(settings(project)).get("notes")
        else:
            assert now.startswith("ran:") and EVIL not in now and GOOD not in now
            env = EnvPool(settings(project)).get("notes")
            rec = env.session({}).call("answer", {})
            assert rec.error is not None and "in an environment folder" in rec.error.message, rec
    finally:
        for name in [m for m in sys.modules if m == "envs" or m.startswith(("envs.", "envfactory_envs.notes"))]:
            sys.modules.pop(name, None)


@pytest.mark.parametrize("module", ["envs.notes.helper", "helper_elsewhere", "sqlite3.dump"])
def test_environment_code_imports_only_what_the_sandbox_allows(
    project: Path, monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    """With the working folder elsewhere, `envs.notes.helper` is the working folder's file, in no environment
    folder: trusted code asking for it (or any module the sandbox would refuse) gets an error, not that code."""
    work = project.parent / "work"
    (work / "envs" / "notes").mkdir(parents=True)
    for path in (work / "envs" / "notes" / "helper.py", work / "helper_elsewhere.py"):
        path.write_text(f"def word() -> str:\n    return {EVIL!r}\n", encoding="utf-8")
    folder = project / "envs" / "notes"
    source = code(GOOD).replace("class Note(Record):", "import importlib\n\n\nclass Note(Record):")
    body = f"return str(getattr(importlib.import_module({module!r}), 'word', lambda: 'loaded')())"
    (folder / "env.py").write_text(source.replace('return "trusted"', body), encoding="utf-8")
    trust(project / "configs" / "trusted.json", "notes", folder)
    monkeypatch.syspath_prepend(str(work))
    try:
        env = EnvPool(settings(project)).get("notes")
        rec = env.session({}).call("answer", {})
        assert rec.error is not None, rec
        refusals = ("imports only what the sandbox allows", "is in an environment folder")  # the latter where a
        assert any(r in rec.error.message for r in refusals), rec  # pool on the working folder was loaded first
        assert module not in sys.modules
        import json as allowed  # an allowed module is still found, and other code imports what it likes

        assert allowed.dumps(1) == "1"
        if module == "helper_elsewhere":  # outside any pool folder: other code still imports it
            assert importlib.import_module(module).word() == EVIL
    finally:
        for name in [m for m in sys.modules if m.startswith(("envs", "helper_elsewhere", "envfactory_envs.notes"))]:
            sys.modules.pop(name, None)


def test_what_is_trusted_is_what_was_reviewed(project: Path) -> None:
    """Between a person's review and `envs trust`, something rewrites env.py (an EnvGen run on the same name,
    another user): `--expect` with the hash `--show` printed at review time refuses the folder as it is now."""
    from tests.system.test_terminal_safety import run_main

    trust_file = project / "configs" / "trusted.json"
    before = trust_file.read_text(encoding="utf-8")
    code_, shown, _ = run_main(project, "envs", "trust", "notes", "--show")
    assert code_ == 0 and "env.py" in shown and "metadata.json" in shown and "default.json" not in shown
    reviewed = shown.split("--expect ")[1].split(")")[0]
    assert code_hash(project / "envs" / "notes").startswith(reviewed) and trust_file.read_text("utf-8") == before
    (project / "envs" / "notes" / "env.py").write_text(code(EVIL), encoding="utf-8")
    code_, _, err = run_main(project, "envs", "trust", "notes", "--expect", reviewed)
    assert code_ != 0 and "not the" in err and "review them again" in err and "Traceback" not in err, err
    assert outcome(project) == "untrusted"
    with pytest.raises(TrustError, match="hex digits"):
        trust(trust_file, "notes", project / "envs" / "notes", expect="abc")
    now = code_hash(project / "envs" / "notes")
    assert run_main(project, "envs", "trust", "notes", "--expect", now[:16])[0] == 0
    assert outcome(project) == f"ran:{EVIL}"


# ---- reads never leave the folder ----------------------------------------------------------------


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside every environment folder that only root may read."""
    path = tmp_path / "host" / "secret.json"
    path.parent.mkdir()
    path.write_text('{"notes": {"N-1": {"id": "N-1", "text": "HOST SECRET"}}}', encoding="utf-8")
    path.chmod(0o600)
    return path


def test_a_scenario_linked_to_a_host_file_is_never_read(project: Path, secret: Path) -> None:
    folder = project / "envs" / "notes"
    env = load_env_folder(folder)
    try:
        os.symlink(secret, folder / "scenarios" / "leak.json")  # after load: reads must refuse it too
        assert "leak" in env.scenario_names()
        with pytest.raises(ScenarioError, match="symbolic link"):
            env.session("leak")
        (folder / "scenarios" / "default.json").unlink()
        os.symlink(secret, folder / "scenarios" / "default.json")
        env.__dict__.pop("_scenario_cache", None)
        with pytest.raises(ScenarioError, match="symbolic link"):
            env.scenario("default")
    finally:
        sys.modules.pop("envfactory_envs.notes", None)
    with pytest.raises(EnvLoadError, match="symbolic link"):
        EnvPool(settings(project)).get("notes")


@pytest.mark.parametrize("where", ["metadata.json", "scenarios", "scenarios/tests", "env.py", "."])
def test_a_link_at_every_place_is_refused_by_every_reader(tmp_path: Path, secret: Path, where: str) -> None:
    folder = tmp_path / "envs" / "notes"
    (folder / "scenarios" / "tests").mkdir(parents=True)
    for name in ("env.py", "metadata.json", "scenarios/default.json", "scenarios/tests/t.json"):
        (folder / name).write_text("{}", encoding="utf-8")
    if where == ".":
        real = tmp_path / "real"
        folder.rename(real)
        os.symlink(real, folder)
    else:
        path = folder / where
        if path.is_dir():
            for p in sorted(path.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
            path.rmdir()
            os.symlink(secret.parent, path)
        else:
            path.unlink()
            os.symlink(secret, path)
    with pytest.raises(FolderError, match="symbolic link"):
        walk(folder)
    with pytest.raises(FolderError, match="symbolic link"):
        snapshot(folder)
    rel = {"scenarios": "scenarios/secret.json", "scenarios/tests": "scenarios/tests/secret.json", ".": "metadata.json"}
    with pytest.raises(FolderError, match="symbolic link"):
        read_json_object(folder, rel.get(where, where))


def test_a_hard_link_to_a_host_file_is_never_read(project: Path, secret: Path) -> None:
    """A second name for a root-only file outside the folder (what a tarball or `cp -al` can carry): the
    parent would read the file itself, whatever its name."""
    folder = project / "envs" / "notes"
    env = load_env_folder(folder)
    try:
        os.link(secret, folder / "scenarios" / "leak.json")
        assert "leak" in env.scenario_names()
        with pytest.raises(ScenarioError, match="hard link"):
            env.session("leak")
        with pytest.raises(FolderError, match="hard link"):
            read_json_object(folder, "scenarios/leak.json")
    finally:
        sys.modules.pop("envfactory_envs.notes", None)
    with pytest.raises(FolderError, match="hard link"):
        snapshot(folder)
    with pytest.raises(EnvLoadError, match="hard link"):
        EnvPool(settings(project)).get("notes")


def test_a_mount_inside_the_folder_is_never_read(project: Path, secret: Path) -> None:
    """A host file bound over a scenario, a host folder over `scenarios/` (root only; the same file system keeps
    the device number, so only the mount id tells)."""
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("binding a file needs root and mount(8)")
    import subprocess

    folder = project / "envs" / "notes"
    (folder / "scenarios" / "bound.json").write_text("{}", encoding="utf-8")
    bound = [folder / "scenarios" / "bound.json", folder / "scenarios" / "tests"]
    done = []
    try:
        for where, target in zip(bound, [secret, secret.parent], strict=True):
            if subprocess.run(["mount", "--bind", str(target), str(where)], capture_output=True).returncode:
                pytest.skip("this machine allows no bind mount")
            done.append(where)
        assert "HOST SECRET" in (folder / "scenarios" / "bound.json").read_text(encoding="utf-8")
        with pytest.raises(FolderError, match="mount point"):
            read_json_object(folder, "scenarios/bound.json")
        with pytest.raises(FolderError, match="mount point"):
            read_json_object(folder, "scenarios/tests/secret.json")
        with pytest.raises(FolderError, match="mount point"):
            walk(folder)
        assert not is_trusted(project / "configs" / "trusted.json", "notes", folder)
    finally:
        for where in reversed(done):
            subprocess.run(["umount", str(where)], check=True)


def test_a_folder_of_sparse_files_is_refused_before_it_is_held_in_memory(project: Path) -> None:
    sparse_files(project, random.Random(0))
    with pytest.raises(FolderError, match="in all"):
        snapshot(project / "envs" / "notes")
    assert outcome(project) == "untrusted"


def test_export_refuses_a_folder_with_a_link(tmp_path: Path, secret: Path) -> None:
    from envfactory.hubs.export import HubExportError, export_package

    root = tmp_path / "project"
    (root / "configs").mkdir(parents=True)
    shutil.copytree(ROOT / "envs" / "hotels", root / "envs" / "hotels")
    os.symlink(secret, root / "envs" / "hotels" / "scenarios" / "extra.json")
    with pytest.raises(HubExportError, match="symbolic link"):
        export_package(EnvPool(settings(root)), ["hotels"], [], "openenv", tmp_path / "out")
    assert "HOST SECRET" not in "".join(
        p.read_text(encoding="utf-8", errors="replace") for p in (tmp_path / "out").rglob("*") if p.is_file()
    )


def test_envgen_never_writes_through_a_link(project: Path) -> None:
    """A folder EnvGen may overwrite (it holds envgen.json) left with links where EnvGen writes: the code, a
    scenario, the report. Writing the new environment must not write the host files they point to."""
    from envfactory.envgen.checks import ExpectedCall, TestScenario
    from envfactory.envgen.register import GeneratedEnvironment, write_environment

    folder = project / "envs" / "notes"
    meta = parse_metadata(json.loads((folder / "metadata.json").read_text(encoding="utf-8")), "metadata.json")
    victims = {
        rel: _outside(project, rel.replace("/", "_"), f"HOST FILE {rel}\n")
        for rel in ("env.py", "scenarios/default.json", "scenarios/tests/s.json", "envgen.json")
    }
    for rel, victim in victims.items():
        (folder / rel).unlink(missing_ok=True)
        os.symlink(victim, folder / rel)
    generated = GeneratedEnvironment(
        metadata=meta,
        code=code(EVIL),
        scenarios=[TestScenario(name="s", initial_config={"notes": {}}, steps=[ExpectedCall(tool="answer")])],
    )
    write_environment(folder, generated)
    for rel, victim in victims.items():
        assert victim.read_text(encoding="utf-8") == f"HOST FILE {rel}\n", rel
        assert not (folder / rel).is_symlink() and (folder / rel).is_file(), rel
    assert (folder / "env.py").read_text(encoding="utf-8") == code(EVIL)
    # the folder itself a link to a host folder: refused, nothing written there
    elsewhere = project.parent / "outside" / "dir"
    elsewhere.mkdir()
    shutil.rmtree(folder)
    os.symlink(elsewhere, folder)
    with pytest.raises(OSError):
        write_environment(folder, generated)
    assert list(elsewhere.iterdir()) == []


def test_scenarios_whose_names_slug_alike_each_keep_their_file(project: Path) -> None:
    """A second test scenario named "Default" (or two named "a b" and "a-b") overwrote the first's file: the state
    judged as the default was replaced by another."""
    from envfactory.envgen.checks import ExpectedCall, TestScenario
    from envfactory.envgen.register import GeneratedEnvironment, write_environment

    folder = project / "envs" / "notes"
    meta = parse_metadata(json.loads((folder / "metadata.json").read_text(encoding="utf-8")), "metadata.json")
    states = [{"notes": {}}, {"notes": {"n1": {"id": "n1", "text": "INJECTED"}}}, {"notes": {}}, {"notes": {}}]
    names = ["first", "Default", "a b", "a-b"]
    scenarios = [
        TestScenario(name=n, initial_config=c, steps=[ExpectedCall(tool="answer")])
        for n, c in zip(names, states, strict=True)
    ]
    write_environment(folder, GeneratedEnvironment(metadata=meta, code=code(EVIL), scenarios=scenarios))
    assert json.loads((folder / "scenarios" / "default.json").read_text()) == states[0]
    assert json.loads((folder / "scenarios" / "default_2.json").read_text()) == states[1]
    assert {p.name for p in (folder / "scenarios").glob("*.json")} == {
        "default.json",
        "default_2.json",
        "a_b.json",
        "a_b_2.json",
    }
    assert {p.name for p in (folder / "scenarios" / "tests").glob("*.json")} == {
        "first.json",
        "default.json",
        "a_b.json",
        "a_b_2.json",
    }


def test_deep_trees_and_long_names_are_one_line_errors(tmp_path: Path) -> None:
    folder = tmp_path / "envs" / "notes"
    (folder / "scenarios").mkdir(parents=True)
    (folder / "env.py").write_text("x = 1\n", encoding="utf-8")
    deep_folders(folder / "scenarios", 1100)
    try:
        with pytest.raises(FolderError, match="nested deeper") as e:
            snapshot(folder)
        assert "\n" not in str(e.value)
        with pytest.raises(FolderError, match="longer than 255 bytes"):
            read_json_object(folder, "x" * 300 + ".json")
        assert list_names(folder, "scenarios", ".json") == []
        assert not is_trusted(tmp_path / "trusted.json", "notes", folder)
        with pytest.raises(TrustError, match="nested deeper"):
            trust(tmp_path / "trusted.json", "notes", folder)
    finally:
        remove_deep(folder / "scenarios")


def deep_folders(top: Path, depth: int) -> None:
    """`top/d/d/.../d`, `depth` folders deep, made one level at a time (no path grows past PATH_MAX)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
    finally:
        os.close(fd)


def remove_deep(top: Path) -> None:
    """Remove what `deep_folders` made, without recursion (pytest's clean-up would recurse past the limit)."""
    fds = [os.open(top, os.O_RDONLY | os.O_DIRECTORY)]
    while True:
        try:
            fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
        except FileNotFoundError:
            break
    os.close(fds.pop())
    while fds:
        os.rmdir("d", dir_fd=fds[-1])
        os.close(fds.pop())


def test_a_broken_trust_file_trusts_nothing_and_says_so_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from envfactory.env import trust as trust_store

    broken = tmp_path / "trusted.json"
    broken.write_text("{not json")
    trust_store._warned.discard(broken)
    with caplog.at_level(logging.WARNING, logger="envfactory.env.trust"):
        assert trust_store.pinned(broken, "hotels") is None
        assert trust_store.pinned(broken, "flights") is None
    said = [r.getMessage() for r in caplog.records if r.name == "envfactory.env.trust"]
    assert len(said) == 1 and "trusted.json" in said[0] and "runs sandboxed" in said[0]


def test_a_linked_environment_folder_is_listed_and_refused_naming_the_link(project: Path) -> None:
    """A pool entry that is a link to a folder elsewhere is never read through; getting it says so, naming the link
    and the setting to use (it once said "no environment 'notes2' ... (known: notes2, ...)"), not where it points
    (a hub's client sees the message). A dangling link is no environment. Every other environment loads as before."""
    real = project / "elsewhere" / "notes2"
    shutil.copytree(project / "envs" / "notes", real)
    link = project / "envs" / "notes2"
    os.symlink(real, link)
    pool = EnvPool(settings(project))
    assert "notes2" in pool.names()
    with pytest.raises(FolderError) as e:
        pool.get("notes2")
    assert str(link) in str(e.value) and "symbolic link" in str(e.value) and "ENVFACTORY_ENVS_DIR" in str(e.value)
    assert str(real) not in str(e.value)
    assert not pool.trusted("notes2")
    assert pool.get("notes").name == "notes"
    os.symlink(project / "nowhere", project / "envs" / "notes3")
    with pytest.raises(EnvNotFoundError):
        EnvPool(settings(project)).get("notes3")
