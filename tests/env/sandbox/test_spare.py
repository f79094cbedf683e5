"""Warm spares: a pool's next worker is a started, walled worker with no code yet, handed over; the same
checks run before it serves, and a shutdown leaves no spare behind."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import pytest

from envfactory.config import Settings
from envfactory.env.pool import load_env_folder, load_untrusted_folder
from envfactory.env.sandbox.spare import SPARES, _key
from envfactory.env.sandboxed import SandboxedEnvironment, SandboxedSession, release_pool
from envfactory.env.session import Session
from tests.support.paths import ROOT


def _wait_ready(env: SandboxedEnvironment, timeout_s: float = 30.0) -> None:
    pool = env.pool
    s = pool.settings
    from envfactory.env.sandbox.limits import worker_limits

    key = _key(s.wall, worker_limits(s.memory_mb, s.cpu_s), s.tmpfs_mb, pool.worker_channel())
    stop = time.monotonic() + timeout_s
    while key not in SPARES._ready and time.monotonic() < stop:
        time.sleep(0.02)
    assert key in SPARES._ready, "no spare came up"


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    for name in ("hotels", "banking"):
        shutil.copytree(ROOT / "envs" / name, tmp_path / name)
        with (tmp_path / name / "env.py").open("a", encoding="utf-8") as f:
            f.write(f"\n# {uuid.uuid4()}: code no other test's pool shares\n")
    return tmp_path / "hotels", tmp_path / "banking"


def _load(folder: Path, spare: bool = True) -> SandboxedEnvironment:
    env = load_untrusted_folder(
        folder, Settings(root=folder.parent, bfcl=False, sandbox_workers=1, sandbox_spare=spare)
    )
    assert isinstance(env, SandboxedEnvironment)
    return env


def test_a_spare_serves_another_environment_as_a_fresh_worker_would(folders: tuple[Path, Path]) -> None:
    hotels, banking = folders
    first = _load(hotels)
    Session.fork(first, "default")  # its worker starts cold; a spare is started after it
    _wait_ready(first)
    handed = SPARES.handed
    second = _load(banking)
    session = Session.fork(second, "default")
    assert SPARES.handed == handed + 1
    assert isinstance(session, SandboxedSession) and session._worker is not None
    process = session._worker.process
    assert process.isolation is not None and process.isolation.problems() == []
    native = Session.fork(load_env_folder(banking), "default")  # the same code in-process: the same answers
    try:
        for tool in second.metadata.tool_names:
            a, b = session.call(tool, {}), native.call(tool, {})
            assert (a.ok, a.result, a.error, a.diff) == (b.ok, b.result, b.error, b.diff)
        assert session.dump() == native.dump()
    finally:
        for env in (first, second):
            release_pool(env.pool)


def test_a_dead_spare_is_not_handed_over_and_shutdown_ends_the_spare(folders: tuple[Path, Path]) -> None:
    hotels, banking = folders
    first = _load(hotels)
    Session.fork(first, "default")
    _wait_ready(first)
    spare = next(iter(SPARES._ready.values()))
    spare.kill()  # died while it waited (a limit, the OOM killer)
    handed = SPARES.handed
    second = _load(banking)
    session = Session.fork(second, "default")
    assert SPARES.handed == handed and session.call(second.metadata.tool_names[0], {}) is not None
    assert isinstance(session, SandboxedSession) and session._worker is not None
    assert session._worker.process is not spare
    _wait_ready(second)
    ready = list(SPARES._ready.values())
    release_pool(second.pool)
    release_pool(first.pool)
    assert SPARES._ready == {} and SPARES._starting == {}
    assert all(not p.alive for p in ready)
