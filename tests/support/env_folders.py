"""A hand-written test environment as a pool holds one: envs/<name>/ with its code, one default scenario and the
metadata the code derives, trusted (written and reviewed in the test), in a project of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envfactory.config import Settings
from envfactory.env.metadata import dump_metadata
from envfactory.env.pool import EnvPool, load_env_folder
from envfactory.env.trust import trust


def trusted_pool(root: Path, name: str, code: str, scenario: dict[str, Any]) -> EnvPool:
    """A pool over `root` holding environment `name` written from `code`, its default scenario `scenario`."""
    folder = root / "envs" / name
    (folder / "scenarios").mkdir(parents=True)
    (folder / "env.py").write_text(code)
    (folder / "scenarios" / "default.json").write_text(json.dumps(scenario))
    dump_metadata(load_env_folder(folder, with_metadata=False).derived_metadata(), folder / "metadata.json")
    settings = Settings(root=root, bfcl=False)
    trust(settings.trust_file, name, folder, "written by this test")
    return EnvPool(settings)
