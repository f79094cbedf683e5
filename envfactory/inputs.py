"""Reading what users and clients hand us: files and JSON text, bounded in size and depth.

Every file the CLI or a loader reads goes through `read_file_bytes` (a regular file, opened without
blocking, no larger than a limit: a FIFO, /dev/zero or a 20 GB file is refused at once, not read)
and every JSON document through `parse_json` (valid UTF-8, no lone surrogates, nesting no deeper
than a limit, parsed without recursion into the caller's stack). Errors are `InputError`s whose
message names the source and says what is wrong, on one line.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import functools
import json
import math
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from envfactory.errors import ErrorFactory, InputError, first_error

M = TypeVar("M", bound=BaseModel)

MAX_FILE_BYTES = 64 * 1024 * 1024  # state dumps, scenarios, metadata, task files: far below this
MAX_CODE_BYTES = 2 * 1024 * 1024  # an env.py
MAX_DEPTH = 100  # state dumps nest ~6 levels; tool arguments a few more


MAX_NODES = 5_000_000  # values in one document once expanded: YAML aliases can make a small file a huge tree
MAX_INT_DIGITS = 640  # an integer literal's digits (2**2048 has 617): CPython reads one in time quadratic in its length


def parse_int(text: str) -> int:
    """A JSON integer literal, refused past `MAX_INT_DIGITS` digits before Python converts it: 950 integers of
    4,299 digits (4 MB) took 0.23 s to parse, holding the GIL, where a million small values take less."""
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits (at most {MAX_INT_DIGITS} are read)")
    return int(text)


def _children(item: Any) -> Any:
    if isinstance(item, dict):
        return item.values()
    if isinstance(item, list | tuple):
        return item
    return ()


def depth_exceeds(value: Any, limit: int, max_nodes: int = MAX_NODES) -> bool:
    """True if `value` nests lists/dicts deeper than `limit`, expands to more than `max_nodes` values,
    or contains itself.

    Iterative (no recursion on hostile data), and linear in the *distinct* containers: a shared
    subtree (a YAML alias) is measured once, so an alias bomb is caught without walking its expansion.
    """
    if not isinstance(value, dict | list | tuple):
        return False
    measured: dict[int, tuple[int, int]] = {}  # finished containers: id -> (height, values below)
    open_: set[int] = set()  # containers whose subtree is being walked
    stack: list[tuple[Any, int, bool]] = [(value, 1, False)]
    while stack:
        item, depth, done = stack.pop()
        key = id(item)
        if done:
            kids = [measured[id(c)] for c in _children(item) if isinstance(c, dict | list | tuple)]
            height = 1 + max((h for h, _ in kids), default=0)
            size = 1 + len(item) + sum(n for _, n in kids)
            if size > max_nodes:
                return True
            measured[key] = (height, size)
            open_.discard(key)
            continue
        if key in measured:
            if depth + measured[key][0] - 1 > limit:
                return True
            continue
        if key in open_ or depth > limit:  # a cycle, or simply too deep
            return True
        open_.add(key)
        stack.append((item, depth, True))
        stack.extend((c, depth + 1, False) for c in _children(item) if isinstance(c, dict | list | tuple))
    return False


LONE_SURROGATE = "a lone surrogate (an unpaired \\ud800-\\udfff escape), which is not UTF-8"  # how errors name one


def has_lone_surrogate(value: Any) -> bool:
    """True if a string anywhere in `value` (keys included) holds a lone surrogate (not valid Unicode)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    except (TypeError, ValueError, RecursionError):
        return False
    return False


_AST_LOCK = threading.RLock()  # re-entrant: a finalizer run inside a parse may parse too


def parse_python(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse`, one thread at a time: CPython 3.11 keeps the AST validator's recursion depth per
    interpreter, so a parse interleaved with another thread's (a switch inside the conversion, e.g. through a
    finalizer) can fail with "SystemError: AST constructor recursion depth mismatch" (cpython gh-106905; seen
    once in CI-like runs of the concurrent sandbox-round tests). Its errors pass through unchanged."""
    with _AST_LOCK:
        return ast.parse(source, filename=filename, mode=mode)


def no_constant(name: str) -> Any:
    """`parse_constant` that refuses NaN and Infinity (Python's json reads them; JSON has no such numbers)."""
    raise ValueError(f"{name} is not a JSON number")  # (json.loads passes it on: read as invalid JSON below)


def finite_float(text: str) -> float:
    """`parse_float` that refuses a literal past a float's range (`1e999` reads as infinity: JSON has no such number,
    and `json.dumps` would write it back as `Infinity`, which no JSON parser reads)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is beyond a float's range")
    return value


def parse_json(
    data: str | bytes,
    source: str,
    *,
    max_depth: int = MAX_DEPTH,
    surrogates: bool = False,
    max_nodes: int = MAX_NODES,
    error: ErrorFactory = InputError,
    constants: bool = True,
) -> Any:
    """Parse a JSON document from `source` (a label for messages), or raise a one-line `InputError` (or the
    caller's `error`, given the message: every reader here takes one, so nothing re-wraps what it raises).
    `max_nodes`: the values it may hold (a large document read on purpose, a tool graph, raises it).
    `constants=False` refuses `NaN`, `Infinity` and `-Infinity`, which Python writes and reads but JSON has not
    (what a server takes from a client: another JSON parser reads such a body differently, or not at all), and a
    number past a float's range (`1e999`, read as infinity)."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise error(f"{source}: not valid UTF-8 (byte {e.start})") from None
    maybe_deep = data.count("[") + data.count("{") > max_depth
    try:
        value = json.loads(
            data,
            parse_int=parse_int,
            parse_constant=None if constants else no_constant,
            parse_float=None if constants else finite_float,
        )
    except RecursionError:
        raise error(f"{source}: JSON nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as e:
        raise error(f"{source}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except ValueError as e:  # e.g. a number too long to convert
        raise error(f"{source}: invalid JSON: {e}") from None
    if maybe_deep and depth_exceeds(value, max_depth, max_nodes):
        raise error(f"{source}: JSON nested deeper than {max_depth} levels")
    if not surrogates and "\\u" in data and has_lone_surrogate(value):
        raise error(f"{source}: a string holds {LONE_SURROGATE}")
    return value


@functools.cache
def _unique_keys_loader() -> Any:
    """YAML's safe loader that refuses a key given twice in one mapping: PyYAML keeps the last one silently, so a
    config saying `mode: offline` and later `mode: llm` ran in llm mode. (Built on first use: `yaml` is imported
    only when a YAML document is read.)"""
    import yaml

    class UniqueKeysLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            if isinstance(node, yaml.MappingNode):  # the keys as written (a merge `<<:` may be overridden)
                seen: set[tuple[str, str]] = set()
                for key_node, _ in node.value:
                    if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = (key_node.tag, key_node.value)
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            "while reading a mapping",
                            node.start_mark,
                            f"the key {key_node.value!r} is given twice",
                            key_node.start_mark,
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeysLoader


def parse_yaml(
    text: str, source: str, *, max_depth: int = MAX_DEPTH, error: ErrorFactory = InputError, loader: Any = None
) -> Any:
    """Parse a YAML document (safe loader refusing a key given twice, or `loader`: a subclass of the safe loader),
    or raise a one-line `InputError` naming `source`."""
    import yaml

    try:
        value = yaml.load(text, Loader=loader or _unique_keys_loader())  # a SafeLoader, or a subclass of it
    except RecursionError:
        raise error(f"{source}: YAML nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"{source}: invalid YAML{where}: {problem}") from None
    if depth_exceeds(value, max_depth):
        raise error(f"{source}: YAML nested deeper than {max_depth} levels, or too large once expanded")
    return value


def read_yaml(
    path: Path, *, max_bytes: int = MAX_FILE_BYTES, what: str = "file", error: ErrorFactory = InputError
) -> Any:
    """A bounded regular file parsed as YAML (JSON is YAML too), with one-line errors naming the path."""
    return parse_yaml(read_text(path, max_bytes=max_bytes, what=what, error=error), str(path), error=error)


def _validated(path: Path, data: Any, model: type[M], error: ErrorFactory) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:  # "<path>: 1 validation error for Model: field 'a.b': what"
        loc, msg = first_error(e)
        raise error(f"{path}: {str(e).splitlines()[0]}: " + (f"field '{loc}': {msg}" if loc else msg)) from None


def read_yaml_model(path: Path, model: type[M], *, what: str = "file", error: ErrorFactory = InputError) -> M:
    """A bounded YAML file validated into `model`; an invalid one is an error naming the path, the field
    and the first problem."""
    return _validated(path, read_yaml(path, what=what, error=error), model, error)


def read_json_model(path: Path, model: type[M], *, what: str = "file", error: ErrorFactory = InputError) -> M:
    """A bounded JSON file validated into `model`; an invalid one is an error naming the path, the field
    and the first problem."""
    return _validated(path, read_json(path, what=what, error=error), model, error)


def missing_folders(path: Path) -> tuple[Path, list[Path]]:
    """The nearest existing ancestor of `path` (or link) and the folders below it that do not exist yet
    (outermost first): where a folder to be created would go, and what making it would make."""
    missing: list[Path] = []
    current = path
    while not current.exists() and not current.is_symlink():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    return current, missing[::-1]


def read_bounded(fd: int, max_bytes: int) -> bytes:
    """At most `max_bytes + 1` bytes from `fd` (one more than allowed says the file is over the limit)."""
    chunks: list[bytes] = []
    left = max_bytes + 1
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_new_file(path: Path, data: bytes) -> None:
    """Create `path` (it must not exist) and write `data`; never follows or replaces a link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def open_regular(path: Path, *, max_bytes: int, what: str = "file", error: ErrorFactory = InputError) -> int:
    """A descriptor of the regular file at `path`, no larger than `max_bytes` now; opened without blocking on a FIFO
    or a device, and closed again when it is not such a file. The caller closes it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except OSError as e:
        raise error(f"{path}: cannot open the {what}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: the {what} is not a regular file")
        if st.st_size > max_bytes:
            raise error(f"{path}: the {what} is {st.st_size} bytes, over the {max_bytes}-byte limit")
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError):
            raise error(f"{path}: cannot read the {what}: {e.strerror}") from None
        raise
    return fd


def read_file_bytes(
    path: Path, *, max_bytes: int = MAX_FILE_BYTES, what: str = "file", error: ErrorFactory = InputError
) -> bytes:
    """The bytes of a regular file no larger than `max_bytes`; never blocks on a FIFO or a device."""
    fd = open_regular(path, max_bytes=max_bytes, what=what, error=error)
    try:
        data = read_bounded(fd, max_bytes)
        if len(data) > max_bytes:  # it grew while we read
            raise error(f"{path}: the {what} is over the {max_bytes}-byte limit")
        return data
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {e.strerror}") from None
    finally:
        os.close(fd)


def read_text(
    path: Path, *, max_bytes: int = MAX_FILE_BYTES, what: str = "file", error: ErrorFactory = InputError
) -> str:
    """A bounded regular file as UTF-8 text."""
    data = read_file_bytes(path, max_bytes=max_bytes, what=what, error=error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: the {what} is not valid UTF-8 (byte {e.start})") from None


def read_json(
    path: Path,
    *,
    max_bytes: int = MAX_FILE_BYTES,
    max_depth: int = MAX_DEPTH,
    what: str = "file",
    error: ErrorFactory = InputError,
    **kwargs: Any,
) -> Any:
    """A bounded regular file parsed as JSON, with one-line errors naming the path."""
    data = read_file_bytes(path, max_bytes=max_bytes, what=what, error=error)
    return parse_json(data, str(path), max_depth=max_depth, error=error, **kwargs)


def read_json_object(
    path: Path, *, what: str = "file", error: ErrorFactory = InputError, **kwargs: Any
) -> dict[str, Any]:
    value = read_json(path, what=what, error=error, **kwargs)
    if not isinstance(value, dict):
        raise error(f"{path}: the {what} must be a JSON object")
    return value


def write_atomic(path: Path, text: str, *, error: ErrorFactory = InputError) -> None:
    """Write `text` to `path` so a reader sees the old file or the whole new one, never a torn one.

    A temporary file in the same folder, fsync'ed, then renamed over the target (and the folder
    fsync'ed). The folder must exist: a missing one is an `InputError`, before anything else.
    """
    folder = path.parent
    if not folder.is_dir():
        raise error(f"{path}: the folder {folder} does not exist")
    tmp = folder / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        payload = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise error(f"{path}: the text to write is not valid Unicode (position {e.start})") from None
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # a stale one, or a link planted at the name: removed, never written through
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            data = memoryview(payload)
            while data:
                n = os.write(fd, data)
                data = data[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise error(f"{path}: cannot write the file: {e.strerror or e}") from None
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


# ---- append-only JSONL logs (a batch's results: one line per finished unit) ---------------------------

MAX_LOG_BYTES = 2 * 1024**3  # a large run's log: large, but bounded (and a regular file)


def json_lines(text: str) -> Iterator[tuple[int, str]]:
    """(number, line) of each line of JSON Lines text that is not blank. A line ends at a newline only: U+2028,
    U+0085... are characters inside a JSON string, which `str.splitlines()` would cut it at."""
    for n, line in enumerate(text.split("\n"), 1):
        if line.strip():
            yield n, line


def read_jsonl_log(path: Path, *, repair: bool = True, error: ErrorFactory = InputError) -> list[Any]:
    """The rows of an append-only JSONL log (`iter_jsonl_log`), as a list."""
    return list(iter_jsonl_log(path, repair=repair, error=error))


def iter_jsonl_log(path: Path, *, repair: bool = True, error: ErrorFactory = InputError) -> Iterator[Any]:
    """The rows of an append-only JSONL log, read a line at a time (a large run's log is never held whole); a torn
    last line (the writer was killed mid-line) is left out, and with `repair` also cut off on disk once reached, so
    appending can go on. Lines end at a newline only: U+2028, U+0085... are characters inside a JSON string, which a
    writer that does not escape them (pydantic's) leaves as they are. A missing file has no rows; the file must be
    a regular file of at most `MAX_LOG_BYTES`, however it grows while it is read."""
    if not path.exists() and not path.is_symlink():
        return
    what = "JSONL file"
    fd = open_regular(path, max_bytes=MAX_LOG_BYTES, what=what, error=error)
    try:
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        offset, n = 0, 0
        while True:
            try:
                raw = fh.readline(MAX_LOG_BYTES + 1 - offset)  # never more than the bound, newline or not
            except OSError as e:
                raise error(f"{path}: cannot read the {what}: {e.strerror}") from None
            if not raw:
                return
            n += 1
            if offset + len(raw) > MAX_LOG_BYTES:  # it grew while we read
                raise error(f"{path}: the {what} is over the {MAX_LOG_BYTES}-byte limit")
            if not raw.endswith(b"\n"):  # torn: cut in place (a rewrite of the whole file, killed, would lose it all)
                if repair:
                    with path.open("r+b") as out:
                        out.truncate(offset)
                        os.fsync(out.fileno())
                return
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise error(f"{path}: not valid UTF-8 (byte {offset + e.start}); fix or remove it to resume") from None
            offset += len(raw)
            if line.strip():
                yield parse_json(line, f"{path}:{n}", error=lambda m: error(f"{m}; fix or remove it to resume"))


FOLDER_LOCK = ".envfactory.lock"


@contextlib.contextmanager
def exclusive_folder(folder: Path, command: str, *, error: ErrorFactory = InputError) -> Iterator[None]:
    """Hold `folder` as the one writer of its logs (an flock on `folder/.envfactory.lock`, let go when the process
    ends however it ends): a second batch on the same folder is refused in words, not run beside the first (two
    synth runs on one --out each appended every unit: every record twice, and summaries that disagreed)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = folder.resolve()
    with _FOLDERS_LOCK:
        mine = key in _FOLDERS_HELD  # this process holds it already (a caller around the batch): it goes on
        _FOLDERS_HELD[key] = _FOLDERS_HELD.get(key, 0) + 1
    try:
        if mine:
            yield
        else:
            with _folder_flock(folder, command, error):
                yield
    finally:
        with _FOLDERS_LOCK:
            _FOLDERS_HELD[key] -= 1
            if not _FOLDERS_HELD[key]:
                del _FOLDERS_HELD[key]


_FOLDERS_HELD: dict[Path, int] = {}
_FOLDERS_LOCK = threading.Lock()


@contextlib.contextmanager
def _folder_flock(folder: Path, command: str, error: ErrorFactory) -> Iterator[None]:
    with open(folder / FOLDER_LOCK, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read(20).strip()
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise error(
                f"{folder} is being written by another `{command}`{who}: wait for it to finish, or give another --out"
            ) from None
        try:
            fh.truncate(0)
            fh.write(str(os.getpid()))
            fh.flush()
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """A file error inside names `path`: a full disk's ENOSPC from write() or fsync() names no file, so a user
    read "No space left on device" and not which of a run's files it was."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise


class JsonlAppender:
    """Appends one line and fsyncs: a finished unit survives a kill right after. Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def write(self, line: str) -> None:
        with self._lock, writing(self.path), self.path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
