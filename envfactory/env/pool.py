"""The environment pool: bundled folders under `envs/` plus imported suites (BFCL multi-turn)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from envfactory.config import Settings, get_settings
from envfactory.env.environment import BaseEnvironment, Environment
from envfactory.env.metadata import load_metadata
from envfactory.errors import EnvFactoryError, EnvLoadError, EnvNotFoundError


def load_env_folder(folder: Path, *, with_metadata: bool = True) -> Environment:
    """Import `folder/env.py`, check it against `folder/metadata.json`, return the environment.

    Only for trusted code (the bundled pool); generated code goes through the sandbox first.
    `with_metadata=False` skips metadata.json (to write it from the code).
    """
    folder = folder.resolve()
    meta_path, code_path = folder / "metadata.json", folder / "env.py"
    for p in (meta_path, code_path) if with_metadata else (code_path,):
        if not p.is_file():
            raise EnvLoadError(f"{folder}: missing {p.name}")
    meta = load_metadata(meta_path) if with_metadata else None
    mod_name = f"envfactory_envs.{folder.name}"
    spec = importlib.util.spec_from_file_location(mod_name, code_path)
    if spec is None or spec.loader is None:
        raise EnvLoadError(f"{code_path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    # registered before running: pydantic resolves the module's annotations through sys.modules
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except EnvFactoryError:
        raise
    except Exception as e:
        sys.modules.pop(mod_name, None)
        raise EnvLoadError(f"{code_path}: import failed: {type(e).__name__}: {e}") from e
    env = getattr(module, "env", None)
    if not isinstance(env, Environment):
        raise EnvLoadError(f"{code_path}: must define `env = Environment(...)` at module level")
    if env.name != folder.name:
        raise EnvLoadError(f"{code_path}: environment is named '{env.name}' but its folder is '{folder.name}'")
    if meta is not None:
        env.attach_metadata(meta, str(meta_path))
    env.folder = folder
    return env


class EnvPool:
    """Lazily loads environments by name; each is loaded once per pool."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self._cache: dict[str, BaseEnvironment] = {}
        self._imported: dict[str, Callable[[], BaseEnvironment]] | None = None

    @property
    def folder(self) -> Path:
        return self.settings.envs_path

    def native_names(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        return sorted(p.name for p in self.folder.iterdir() if (p / "env.py").is_file())

    def imported_factories(self) -> dict[str, Callable[[], BaseEnvironment]]:
        if self._imported is None:
            self._imported = {}
            if self.settings.bfcl:
                from envfactory.env import bfcl

                if bfcl.available():
                    self._imported.update(bfcl.factories())
        return self._imported

    def names(self, include_imported: bool = True) -> list[str]:
        names = self.native_names()
        if include_imported:
            names += sorted(self.imported_factories())
        return names

    def get(self, name: str) -> BaseEnvironment:
        if name in self._cache:
            return self._cache[name]
        if (self.folder / name / "env.py").is_file():
            env: BaseEnvironment = load_env_folder(self.folder / name)
        elif name in self.imported_factories():
            env = self.imported_factories()[name]()
        else:
            known = ", ".join(self.names()) or "none"
            raise EnvNotFoundError(f"no environment '{name}' in {self.folder} (known: {known})")
        self._cache[name] = env
        return env
