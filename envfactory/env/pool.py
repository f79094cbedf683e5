"""The environment pool: folders under `envs/`, compiled environments (`compiled_dir`), imported suites (BFCL).

A folder whose code a person has trusted (`configs/trusted.json`, `envfactory envs trust NAME`)
is imported in-process, the fast path. Any other folder — what EnvGen wrote, what someone copied
in, a bundled environment edited since it was trusted — is untrusted: it loads as a
`SandboxedEnvironment`, whose code runs only in OS-sandboxed workers. A compiled environment is data
(`compiled.json`) this project's code interprets: no code of its own, so no trust and no sandbox.

The pool is lazy. Listing it (`names`, `entry`: name, domain, tool counts, scenarios, how it runs) reads
folder names and each `metadata.json`'s summary, and builds nothing; an environment is built on its
first `get`. Built compiled environments are kept in a least-recently-used cache bounded by count and by
the size of their files (`Settings.pool_cache_envs`, `pool_cache_mb`), so a run that touches a pool of
hundreds stays bounded in memory: an evicted one is built again from its folder when next asked for
(sessions already holding it keep it). Python environments (few, with modules and sandbox workers) and
imported suites stay built once loaded.
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import threading
import types
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel
from pydantic_core import from_json

from envfactory.config import Settings, get_settings
from envfactory.env.compiled import PLAN_FILE, CompiledEnvironment, load_plan
from envfactory.env.environment import BaseEnvironment, Environment
from envfactory.env.folder import FolderError, list_names, parse_json_object, read_bytes, read_json_object
from envfactory.env.folder import exists as folder_exists
from envfactory.env.import_guard import guard_folder
from envfactory.env.metadata import Domain, EnvMetadata, MetadataSummary, parse_metadata, summarize_metadata
from envfactory.env.trust import CODE_FILE, METADATA_FILE, CodeSnapshot, code_hash, is_trusted, pinned, snapshot
from envfactory.errors import EnvFactoryError, EnvLoadError, EnvNotFoundError

ENVGEN_RECORD = "envgen.json"  # EnvGen's record in a folder it wrote


def _metadata(snap: CodeSnapshot) -> EnvMetadata:
    """`metadata.json` parsed from the snapshot's bytes (the ones that were hashed)."""
    where = str(snap.folder / METADATA_FILE)
    if snap.metadata is None:
        raise EnvLoadError(f"{snap.folder}: missing {METADATA_FILE}")
    return parse_metadata(parse_json_object(snap.metadata, where, "metadata file"), where)


def _load_compiled(folder: Path) -> tuple[CompiledEnvironment, int]:
    """A compiled environment and the bytes of the files it was built from (its weight in the pool's cache)."""
    folder = folder.absolute()
    plan_bytes = read_bytes(folder, PLAN_FILE, what="compiled plan")
    where = str(folder / PLAN_FILE)
    plan = load_plan(parse_json_object(plan_bytes, where, "compiled plan"), where)
    if plan.name != folder.name:
        raise EnvLoadError(f"{where}: names the environment '{plan.name}' but its folder is '{folder.name}'")
    env = CompiledEnvironment(plan, folder)
    meta_bytes = read_bytes(folder, METADATA_FILE, what="metadata file")
    where = str(folder / METADATA_FILE)
    env.attach_metadata(parse_metadata(parse_json_object(meta_bytes, where, "metadata file"), where), where)
    return env, len(plan_bytes) + len(meta_bytes)


def load_compiled_folder(folder: Path) -> CompiledEnvironment:
    """A compiled environment: its plan (`compiled.json`) interpreted in-process, checked against `metadata.json`."""
    return _load_compiled(folder)[0]


def read_metadata(folder: Path) -> EnvMetadata:
    """An environment folder's `metadata.json` alone (no code runs), read without following a link."""
    return parse_metadata(read_json_object(folder, METADATA_FILE, what="metadata file"), str(folder / METADATA_FILE))


def read_summary(folder: Path) -> MetadataSummary:
    """The summary of a folder's `metadata.json` (`summarize_metadata`): no code runs, no schema is validated.

    The bytes come through the folder reader (no link followed, bounded in size); pydantic-core parses
    them, in Rust with its own nesting limit, and only the top-level fields and each tool's name and kind
    are looked at, so a listing does not walk megabytes of schemas. Building the environment parses and
    checks the whole file."""
    where = str(folder / METADATA_FILE)
    data = read_bytes(folder, METADATA_FILE, what="metadata file")
    try:
        value = from_json(data)
    except ValueError as e:
        raise FolderError(f"{where}: invalid JSON: {e}") from None
    summary = summarize_metadata(value, where)
    if summary.name != folder.name:
        raise EnvLoadError(f"{where}: names the environment '{summary.name}' but its folder is '{folder.name}'")
    return summary


def source_label(source: str | None, folder: Path | None) -> str:
    """Where an environment came from, for tables: its metadata's word, else what its folder says."""
    if source:
        return source
    if folder is None:
        return "imported"
    return "envgen" if folder_exists(folder, ENVGEN_RECORD) else "hand-written"


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
        spare=settings.sandbox_spare,
        spin_us=settings.sandbox_spin_us,
        dedicated=settings.sandbox_session_workers,
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
    """What a failed load is remembered by: a code folder's hash; a compiled folder's files' identity and
    times (no trust to check, and hashing a large plan on every build would read it twice)."""
    try:
        if _is_compiled(folder):
            stats = []
            for rel in (PLAN_FILE, METADATA_FILE):
                st = os.stat(folder / rel, follow_symlinks=False)
                stats.append(f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
            return "compiled:" + ",".join(stats)
        return code_hash(folder) if folder_exists(folder, CODE_FILE) else None
    except (EnvFactoryError, OSError):
        return None


def _known(names: list[str], limit: int = 20) -> str:
    """Names for an error message: the first `limit`, and how many more."""
    if not names:
        return "none"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


class PoolEntry(BaseModel):
    """One environment as a listing shows it, known without building it."""

    name: str
    kind: Literal["python", "compiled", "imported"]
    description: str
    domain: Domain
    source: str  # a label: the metadata's source, else imported / envgen / hand-written
    tools: int
    write_tools: int
    scenarios: list[str]
    runs: Literal["in-process", "sandboxed"]


class PoolStats(BaseModel):
    """What the pool has built and keeps: the numbers its cache bound is checked against."""

    builds: int  # environments built (loaded) by this pool, rebuilds after eviction included
    evictions: int  # compiled environments dropped from the cache
    resident: int  # compiled environments built and kept
    resident_bytes: int  # the bytes of their files (compiled.json + metadata.json)
    max_envs: int
    max_bytes: int


@functools.cache
def imported_suites() -> dict[str, Callable[[], dict[str, Callable[[], BaseEnvironment]]]]:
    """The imported benchmark suites installed: the `envfactory.suites` entry point group (read once a process).

    Each entry names a function returning the suite's environment factories by name ({} when the
    benchmark's package is missing). The runtime never imports a suite: `envfactory.suites.bfcl`
    registers itself in pyproject.toml, and another package can add one the same way.
    """
    from importlib.metadata import entry_points

    return {ep.name: ep.load() for ep in entry_points(group="envfactory.suites")}


def _plain_name(name: str) -> bool:
    """Whether `name` can only name an entry of a folder (no separator, not `.` or `..`)."""
    return not ("/" in name or "\\" in name or name in ("", ".", ".."))


def _same_folder(a: Path, b: Path) -> bool:
    """Whether two paths name one folder (written differently: relative, through a link, with `..`)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


class EnvPool:
    """Lazily loads environments by name. Python and imported environments are loaded once per pool;
    compiled ones are kept in an LRU cache bounded by `settings.pool_cache_envs` and `pool_cache_mb`."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self._kept: dict[str, BaseEnvironment] = {}  # Python and imported environments: never evicted
        self._lru: OrderedDict[str, tuple[CompiledEnvironment, int]] = OrderedDict()  # name -> (env, bytes)
        self._lru_bytes = 0
        self._builds = 0
        self._evictions = 0
        self._imported: dict[str, Callable[[], BaseEnvironment]] | None = None
        self._lock = threading.Lock()  # guards the caches and counters (held briefly, never while loading)
        self._name_locks: dict[str, threading.Lock] = {}  # one load per name at a time; others go on
        self._failed: dict[str, tuple[str, EnvFactoryError]] = {}  # name -> (files' digest, why): not retried

    @property
    def folder(self) -> Path:
        return self.settings.envs_path

    @property
    def max_envs(self) -> int:
        return self.settings.pool_cache_envs

    @property
    def max_bytes(self) -> int:
        return int(self.settings.pool_cache_mb * 1024 * 1024)

    def _folders(self) -> list[Path]:
        """Where environment folders live: the pool folder, then the compiled environments' folder (if set)."""
        extra = self.settings.compiled_dir
        if extra is not None and not extra.is_dir():  # a typo in ENVFACTORY_COMPILED_DIR: said, not an empty pool
            raise EnvFactoryError(f"the compiled environments' folder {extra} does not exist (ENVFACTORY_COMPILED_DIR)")
        return [self.folder] + ([extra] if extra is not None and not _same_folder(extra, self.folder) else [])

    def folder_of(self, name: str) -> Path | None:
        """The folder of the environment `name` (code or a compiled plan), or None (an imported suite's, or none)."""
        if not _plain_name(name):
            return None
        for base in self._folders():
            folder = base / name
            if folder_exists(folder, CODE_FILE) or folder_exists(folder, PLAN_FILE):
                return folder
        return None

    def shadowed(self) -> dict[str, Path]:
        """Environments of the compiled folder that a pool folder of the same name hides (`folder_of` takes the
        pool's first), by name: the hidden folder."""
        folders = self._folders()
        if len(folders) < 2:
            return {}

        def envs_in(base: Path) -> dict[str, Path]:
            if not base.is_dir():
                return {}
            return {p.name: p for p in base.iterdir() if folder_exists(p, CODE_FILE) or folder_exists(p, PLAN_FILE)}

        pool, compiled = envs_in(folders[0]), envs_in(folders[1])
        return {name: compiled[name] for name in sorted(pool.keys() & compiled.keys())}

    def _linked_folder(self, name: str) -> Path | None:
        """`<folder>/name` when it is a symbolic link (which `folder_of` never follows) that a listing shows as an
        environment (it leads to a folder holding `env.py` or `compiled.json`), else None."""
        if not _plain_name(name):
            return None
        for base in self._folders():
            p = base / name
            if p.is_symlink() and ((p / CODE_FILE).is_file() or (p / PLAN_FILE).is_file()):
                return p
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
        """Every environment once: those with a folder, then the imported suites' that no folder hides (`folder_of`
        finds the folder first, so a suite's environment of the same name is never reached: `hidden_imported`)."""
        names = self.native_names()
        if include_imported:
            native = set(names)
            names += sorted(n for n in self.imported_factories() if n not in native)
        return names

    def hidden_imported(self) -> dict[str, Path]:
        """Imported suites' environments that a folder of the same name hides, by name: the folder used instead."""
        hidden: dict[str, Path] = {}
        for name in sorted(self.imported_factories()):
            folder = self.folder_of(name)
            if folder is not None:
                hidden[name] = folder
        return hidden

    def trusted(self, name: str) -> bool:
        """True if `name` may run in-process: a folder whose current code is pinned in the trust file, a
        compiled environment (no code of its own), an imported suite."""
        folder = self.folder_of(name)
        if folder is None:
            return name in self.imported_factories()
        if _is_compiled(folder):
            return True
        return is_trusted(self.settings.trust_file, name, folder)

    def entry(self, name: str) -> PoolEntry:
        """What a listing shows of `name`, without building a folder's environment (no code runs, no sandbox
        starts): its `metadata.json`'s summary, its scenario files, and whether it would run in-process.
        An imported suite's environment is built (they are few, and their metadata comes from their code)."""
        folder = self.folder_of(name)
        if folder is None:
            env = self.get(name)
            summary = MetadataSummary.of(env.metadata)
            kind: Literal["python", "compiled", "imported"] = "imported"
            scenarios = env.scenario_names()
            sandboxed = env.blocking_io
        else:
            summary = read_summary(folder)
            kind = "compiled" if _is_compiled(folder) else "python"
            scenarios = list_names(folder, "scenarios", ".json")
            sandboxed = kind == "python" and not is_trusted(self.settings.trust_file, name, folder)
        return PoolEntry(
            name=name,
            kind=kind,
            description=summary.description,
            domain=summary.domain,
            source=source_label(summary.source, folder),
            tools=summary.tools,
            write_tools=summary.write_tools,
            scenarios=scenarios,
            runs="sandboxed" if sandboxed else "in-process",
        )

    def stats(self) -> PoolStats:
        with self._lock:
            return PoolStats(
                builds=self._builds,
                evictions=self._evictions,
                resident=len(self._lru),
                resident_bytes=self._lru_bytes,
                max_envs=self.max_envs,
                max_bytes=self.max_bytes,
            )

    def _cached(self, name: str) -> BaseEnvironment | None:
        kept = self._kept.get(name)  # only ever added to (one dict read is atomic): no lock, on every tool call
        if kept is not None:
            return kept
        with self._lock:
            hit = self._lru.get(name)
            if hit is None:
                return None
            self._lru.move_to_end(name)
            return hit[0]

    def get(self, name: str) -> BaseEnvironment:
        env = self._cached(name)
        if env is not None:
            return env
        with self._lock:
            lock = self._name_locks.setdefault(name, threading.Lock())
        with lock:
            env = self._cached(name)
            if env is not None:
                return env
            folder = self.folder_of(name)
            digest = _digest(folder) if folder is not None else None
            failed = self._failed.get(name)
            if failed is not None and digest is not None and failed[0] == digest:
                raise failed[1]  # the same files failed to load: not waited for again
            try:
                return self._load(name, folder)
            except EnvFactoryError as e:
                if digest is not None:
                    self._failed[name] = (digest, e)
                raise

    def _load(self, name: str, folder: Path | None) -> BaseEnvironment:
        if folder is not None and _is_compiled(folder):
            compiled, weight = _load_compiled(folder)
            self._keep_compiled(name, compiled, weight)
            return compiled
        if folder is not None:
            snap = snapshot(folder)  # read once: what is hashed here is what is compiled or sent to the sandbox
            if pinned(self.settings.trust_file, name) == snap.sha256:
                env: BaseEnvironment = load_env_folder(folder, snap=snap)
            else:
                env = load_untrusted_folder(folder, self.settings, snap)
        elif name in self.imported_factories():
            env = self.imported_factories()[name]()
        else:
            link = self._linked_folder(name)
            if link is not None:  # listed (a listing follows links to say what is there), never read through
                setting = "ENVFACTORY_ENVS_DIR" if link.parent == self.folder else "ENVFACTORY_COMPILED_DIR"
                raise FolderError(
                    f"{link} is a symbolic link: an environment folder is read without following links, so that "
                    f"nothing in it can make the project read outside it; copy the folder in, or make the folder "
                    f"that holds it {setting}"
                )
            shown = name if len(name) <= 80 else name[:77] + "..."
            raise EnvNotFoundError(f"no environment {shown!r} in {self.folder} (known: {_known(self.names())})")
        with self._lock:
            self._kept[name] = env
            self._builds += 1
        return env

    def _keep_compiled(self, name: str, env: CompiledEnvironment, weight: int) -> None:
        """Cache a built compiled environment, then evict the least recently used ones over either bound
        (the newest stays, even alone over the byte bound: it is in use)."""
        with self._lock:
            self._builds += 1
            self._lru[name] = (env, weight)
            self._lru_bytes += weight
            while len(self._lru) > 1 and (len(self._lru) > self.max_envs or self._lru_bytes > self.max_bytes):
                _, (_, gone) = self._lru.popitem(last=False)
                self._lru_bytes -= gone
                self._evictions += 1
