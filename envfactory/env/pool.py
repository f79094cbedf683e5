"""The environment pool: folders under `envs/` plus imported suites (BFCL multi-turn).

A folder whose code a person has trusted (`configs/trusted.json`, `envfactory envs trust NAME`)
is imported in-process, the fast path. Any other folder — what EnvGen wrote, what someone copied
in, a bundled environment edited since it was trusted — is untrusted: it loads as a
`SandboxedEnvironment`, whose code runs only in OS-sandboxed workers.
"""

from __future__ import annotations

import functools
import linecache
import sys
import threading
import types
from collections.abc import Callable
from pathlib import Path

from envfactory.config import Settings, get_settings
from envfactory.env.compiled import PLAN_FILE, CompiledEnvironment, load_plan
from envfactory.env.environment import BaseEnvironment, Environment
from envfactory.env.folder import exists as folder_exists
from envfactory.env.folder import parse_json_object, read_json_object
from envfactory.env.import_guard import guard_folder
from envfactory.env.metadata import EnvMetadata, parse_metadata
from envfactory.env.trust import CODE_FILE, METADATA_FILE, CodeSnapshot, code_hash, is_trusted, pinned, snapshot
from envfactory.errors import EnvFactoryError, EnvLoadError, EnvNotFoundError


def _metadata(snap: CodeSnapshot) -> EnvMetadata:
    """`metadata.json` parsed from the snapshot's bytes (the ones that were hashed)."""
    where = str(snap.folder / METADATA_FILE)
    if snap.metadata is None:
        raise EnvLoadError(f"{snap.folder}: missing {METADATA_FILE}")
    return parse_metadata(parse_json_object(snap.metadata, where, "metadata file"), where)


def load_compiled_folder(folder: Path) -> CompiledEnvironment:
    """A compiled environment: its plan (`compiled.json`) interpreted in-process, checked against `metadata.json`."""
    folder = folder.absolute()
    plan = load_plan(read_json_object(folder, PLAN_FILE, what="compiled plan"), str(folder / PLAN_FILE))
    if plan.name != folder.name:
        raise EnvLoadError(
            f"{folder / PLAN_FILE}: names the environment '{plan.name}' but its folder is '{folder.name}'"
        )
    env = CompiledEnvironment(plan, folder)
    env.attach_metadata(read_metadata(folder), str(folder / METADATA_FILE))
    return env


def read_metadata(folder: Path) -> EnvMetadata:
    """An environment folder's `metadata.json` alone (no code runs), read without following a link."""
    return parse_metadata(read_json_object(folder, METADATA_FILE, what="metadata file"), str(folder / METADATA_FILE))


def _source(snap: CodeSnapshot) -> str:
    if snap.code is None:
        raise EnvLoadError(f"{snap.folder}: missing {CODE_FILE}")
    try:
        return snap.code.decode("utf-8")
    except UnicodeDecodeError as e:
        raise EnvLoadError(f"{snap.folder / CODE_FILE}: not valid UTF-8 (byte {e.start})") from None


def load_env_folder(folder: Path, *, with_metadata: bool = True, snap: CodeSnapshot | None = None) -> Environment:
    """Run `folder/env.py` in this process, check it against `folder/metadata.json`, return it.

    Only for trusted code: `EnvPool` calls it for folders pinned in the trust file, with the snapshot
    whose hash it compared (`snap`), so the bytes compiled are the bytes that were hashed; anything else
    goes through `load_untrusted_folder`. The module is compiled from those bytes — no bytecode cache
    is read or written — and nothing else in the pool folder can be imported (`import_guard`).
    `with_metadata=False` skips metadata.json (to write it from the code). Whatever the module raises,
    `SystemExit` included, is this environment's failure.
    """
    folder = folder.absolute()
    snap = snap or snapshot(folder)
    code_path = folder / CODE_FILE
    meta = _metadata(snap) if with_metadata else None
    source = _source(snap)
    mod_name = f"envfactory_envs.{folder.name}"
    module = types.ModuleType(mod_name)
    module.__file__ = str(code_path)
    # tracebacks and inspect show the source that ran, not whatever the file holds now
    linecache.cache[str(code_path)] = (len(source), None, source.splitlines(True), str(code_path))
    # registered before running: pydantic resolves the module's annotations through sys.modules
    sys.modules[mod_name] = module
    guard_folder(folder.parent)  # nothing else in the pool folder is imported: it would run unhashed bytes
    try:
        exec(compile(source, str(code_path), "exec", dont_inherit=True), module.__dict__)
    except EnvFactoryError:
        sys.modules.pop(mod_name, None)
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # SystemExit(0) included: an environment must not end the process
        sys.modules.pop(mod_name, None)
        raise EnvLoadError(f"{code_path}: import failed: {type(e).__name__}: {e}") from None
    env = getattr(module, "env", None)
    if not isinstance(env, Environment):
        raise EnvLoadError(f"{code_path}: must define `env = Environment(...)` at module level")
    if env.name != folder.name:
        raise EnvLoadError(f"{code_path}: environment is named '{env.name}' but its folder is '{folder.name}'")
    if meta is not None:
        env.attach_metadata(meta, str(folder / METADATA_FILE))
    env.folder = folder
    return env


def load_untrusted_folder(folder: Path, settings: Settings, snap: CodeSnapshot | None = None) -> BaseEnvironment:
    """An untrusted folder served by sandboxed workers (`SandboxUnavailable` where there is no OS sandbox).

    The worker gets the snapshot's code bytes over its pipe (the sandbox does not see the folder)."""
    from envfactory.env.sandbox.wall import find_wall
    from envfactory.env.sandboxed import PoolSettings, load_sandboxed_folder

    folder = folder.absolute()
    snap = snap or snapshot(folder)
    meta = _metadata(snap)
    source = _source(snap)
    if meta.name != folder.name:
        raise EnvLoadError(
            f"{folder / METADATA_FILE}: names the environment '{meta.name}' but its folder is '{folder.name}'"
        )
    pool_settings = PoolSettings(
        wall=find_wall(unsafe_no_os_sandbox=settings.unsafe_no_os_sandbox),
        memory_mb=settings.sandbox_memory_mb,
        tmpfs_mb=settings.sandbox_tmpfs_mb,
        workers=settings.sandbox_workers,
        call_timeout_s=settings.sandbox_call_timeout_s,
        start_timeout_s=settings.sandbox_start_timeout_s,
        cpu_s=settings.sandbox_worker_cpu_s,
        canary_calls=settings.sandbox_canary_calls,
        canary_s=settings.sandbox_canary_s,
    )
    return load_sandboxed_folder(folder, meta, source, pool_settings, snap.sha256)


def derived_metadata(folder: Path, settings: Settings) -> EnvMetadata:
    """The metadata a folder's code defines (signatures, docstrings): in-process if trusted, else sandboxed."""
    snap = snapshot(folder)
    if pinned(settings.trust_file, folder.name) == snap.sha256:
        return load_env_folder(folder, with_metadata=False, snap=snap).derived_metadata()
    from envfactory.env.sandbox.wall import find_wall
    from envfactory.env.sandboxed import derive_metadata_sandboxed

    return derive_metadata_sandboxed(
        folder, _source(snap), find_wall(unsafe_no_os_sandbox=settings.unsafe_no_os_sandbox), settings.sandbox_memory_mb
    )


def _is_compiled(folder: Path) -> bool:
    """A folder holding a compiled plan and no code of its own."""
    return not folder_exists(folder, CODE_FILE) and folder_exists(folder, PLAN_FILE)


def _digest(folder: Path) -> str | None:
    try:
        return code_hash(folder) if folder_exists(folder, CODE_FILE) or folder_exists(folder, PLAN_FILE) else None
    except EnvFactoryError:
        return None


@functools.cache
def imported_suites() -> dict[str, Callable[[], dict[str, Callable[[], BaseEnvironment]]]]:
    """The imported benchmark suites installed: the `envfactory.suites` entry point group (read once a process).

    Each entry names a function returning the suite's environment factories by name ({} when the
    benchmark's package is missing). The runtime never imports a suite: `envfactory.suites.bfcl`
    registers itself in pyproject.toml, and another package can add one the same way.
    """
    from importlib.metadata import entry_points

    return {ep.name: ep.load() for ep in entry_points(group="envfactory.suites")}


class EnvPool:
    """Lazily loads environments by name; each is loaded once per pool."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self._cache: dict[str, BaseEnvironment] = {}
        self._imported: dict[str, Callable[[], BaseEnvironment]] | None = None
        self._lock = threading.Lock()
        self._name_locks: dict[str, threading.Lock] = {}  # one load per name at a time; others go on
        self._failed: dict[str, tuple[str, EnvFactoryError]] = {}  # name -> (code hash, why): not retried

    @property
    def folder(self) -> Path:
        return self.settings.envs_path

    def _folders(self) -> list[Path]:
        """Where environment folders live: the pool folder, then the compiled environments' folder (if set)."""
        extra = self.settings.compiled_dir
        return [self.folder] + ([extra] if extra is not None and extra != self.folder else [])

    def folder_of(self, name: str) -> Path | None:
        """The folder of the environment `name` (code or a compiled plan), or None (an imported suite's, or none)."""
        if "/" in name or "\\" in name or name in ("", ".", ".."):
            return None
        for base in self._folders():
            folder = base / name
            if folder_exists(folder, CODE_FILE) or folder_exists(folder, PLAN_FILE):
                return folder
        return None

    def native_names(self) -> list[str]:
        """Environments with a folder: written in Python (`env.py`) or compiled from an API spec (`compiled.json`)."""
        names: set[str] = set()
        for base in self._folders():
            if base.is_dir():
                names.update(p.name for p in base.iterdir() if (p / CODE_FILE).is_file() or (p / PLAN_FILE).is_file())
        return sorted(names)

    def compiled(self, name: str) -> bool:
        """True if `name` is a compiled environment: data the project's own code interprets (no sandbox, no trust)."""
        folder = self.folder_of(name)
        return folder is not None and _is_compiled(folder)

    def imported_factories(self) -> dict[str, Callable[[], BaseEnvironment]]:
        if self._imported is None:
            self._imported = {}
            for name, environments in imported_suites().items():
                if self.settings.suite_enabled(name):
                    self._imported.update(environments())
        return self._imported

    def names(self, include_imported: bool = True) -> list[str]:
        names = self.native_names()
        if include_imported:
            names += sorted(self.imported_factories())
        return names

    def trusted(self, name: str) -> bool:
        """True if `name` may run in-process: a folder whose current code is pinned in the trust file, a
        compiled environment (no code of its own), an imported suite."""
        folder = self.folder_of(name)
        if folder is None:
            return name in self.imported_factories()
        if self.compiled(name):
            return True
        return is_trusted(self.settings.trust_file, name, folder)

    def get(self, name: str) -> BaseEnvironment:
        env = self._cache.get(name)
        if env is not None:
            return env
        with self._lock:
            lock = self._name_locks.setdefault(name, threading.Lock())
        with lock:
            if name in self._cache:
                return self._cache[name]
            folder = self.folder_of(name)
            digest = _digest(folder) if folder is not None else None
            failed = self._failed.get(name)
            if failed is not None and digest is not None and failed[0] == digest:
                raise failed[1]  # the same code failed to load: not waited for again
            try:
                return self._load(name)
            except EnvFactoryError as e:
                if digest is not None:
                    self._failed[name] = (digest, e)
                raise

    def _load(self, name: str) -> BaseEnvironment:
        folder = self.folder_of(name)
        if folder is not None and _is_compiled(folder):
            env: BaseEnvironment = load_compiled_folder(folder)
        elif folder is not None:
            snap = snapshot(folder)  # read once: what is hashed here is what is compiled or sent to the sandbox
            if pinned(self.settings.trust_file, name) == snap.sha256:
                env = load_env_folder(folder, snap=snap)
            else:
                env = load_untrusted_folder(folder, self.settings, snap)
        elif name in self.imported_factories():
            env = self.imported_factories()[name]()
        else:
            known = ", ".join(self.names()) or "none"
            shown = name if len(name) <= 80 else name[:77] + "..."
            raise EnvNotFoundError(f"no environment {shown!r} in {self.folder} (known: {known})")
        self._cache[name] = env
        return env
