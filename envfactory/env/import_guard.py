"""No module is imported from an environment folder into this process.

Trusted environment code runs in-process from the very bytes that were hashed (`envfactory.env.trust`),
compiled with no bytecode cache. A module it imported from its folder — `from envs.notes import helper`
works wherever the working folder is on `sys.path`, as with `python -m envfactory.cli` — would be read
again by the import system after the hash, and from `__pycache__/` first: bytes that no trust pinned (a
planted unchecked-hash `.pyc` of `helper` ran, as root, while the folder stayed trusted). So once an
environment has been loaded in-process, its pool folder is closed to the import system: a module or
package found there is refused with an `ImportError`, whoever imports it and whenever (at import or in a
tool). Environment code is one file; the sandbox, where untrusted code is judged, allows no such import
either, so code that needs one could not have passed a round.

Environment code itself imports only what the sandbox allows (`sandbox.policy.ALLOWED_MODULES`): a
module it asks the import system for that is not on that list is refused, wherever it would be found —
the working folder included (`from envs.notes import helper` with the working folder elsewhere would
load that folder's `envs/`, bytes no one trusted). This is a filter, not a wall: a module some other
code already imported comes from `sys.modules` without a search. What other modules import is
Python's own business (the interpreter's and the project's installation are trusted as a whole).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from envfactory.env.sandbox.policy import ALLOWED_MODULES

ENV_MODULE_PREFIX = "envfactory_envs."  # the module names environment code runs under (`pool.load_env_folder`)


def _allowed(fullname: str) -> bool:
    parts = fullname.split(".")
    return any(".".join(parts[:i]) in ALLOWED_MODULES for i in range(1, len(parts) + 1))


def _importer() -> str:
    """The module whose code asked for this import: the first frame outside the import machinery."""
    frame = sys._getframe(2)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if not (name == "importlib" or name.startswith("importlib.") or name == "_frozen_importlib"):
            return name
        frame = frame.f_back  # type: ignore[assignment]
    return ""


class _PoolFolderGuard(importlib.abc.MetaPathFinder):
    """First on `sys.meta_path`: refuses a module the path finder would load from a guarded folder."""

    def __init__(self) -> None:
        self.folders: frozenset[str] = frozenset()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not self.folders:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        places = [spec.origin] if spec is not None and spec.origin and spec.has_location else []
        places += list(spec.submodule_search_locations or []) if spec is not None else []
        for place in places:
            real = os.path.realpath(place)
            for folder in self.folders:
                if real == folder or real.startswith(folder + os.sep):
                    raise ImportError(
                        f"module {fullname!r} is in an environment folder ({place}): environment code is one "
                        "file (env.py) run from the bytes that were hashed; nothing else in the folder is imported",
                        name=fullname,
                    )
        if (
            _importer().startswith(ENV_MODULE_PREFIX)
            and not _allowed(fullname)
            and _findable(self, spec, fullname, path)
        ):
            raise ImportError(
                f"environment code imports only what the sandbox allows, not {fullname!r} (allowed: "
                f"{', '.join(sorted(ALLOWED_MODULES))})",
                name=fullname,
            )
        return None  # the ordinary finders go on


def _findable(
    guard: _PoolFolderGuard, spec: importlib.machinery.ModuleSpec | None, fullname: str, path: Sequence[str] | None
) -> bool:
    """Whether some finder would load `fullname` (else the import fails as usual: ModuleNotFoundError)."""
    if spec is not None:
        return True
    for finder in sys.meta_path:
        if finder is guard or (isinstance(finder, type) and issubclass(finder, importlib.machinery.PathFinder)):
            continue
        find = getattr(finder, "find_spec", None)
        with contextlib.suppress(Exception):
            if find is not None and find(fullname, path) is not None:
                return True
    return False


_GUARD = _PoolFolderGuard()
_LOCK = threading.Lock()


def guard_folder(folder: Path) -> None:
    """Refuse, from now on in this process, every import of a module found in `folder` (a pool folder)."""
    real = os.path.realpath(folder)
    with _LOCK:
        if real not in _GUARD.folders:
            _GUARD.folders = _GUARD.folders | {real}
        if not sys.meta_path or sys.meta_path[0] is not _GUARD:
            if _GUARD in sys.meta_path:
                sys.meta_path.remove(_GUARD)
            sys.meta_path.insert(0, _GUARD)
    importlib.invalidate_caches()


def guarded_folders() -> frozenset[str]:
    """The folders closed to the import system in this process (real paths)."""
    return _GUARD.folders
