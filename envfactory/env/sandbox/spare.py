"""Warm spares: a sandboxed worker started ahead, so a pool's next worker is a hand-over, not a start.

A spare has done only the trusted start-up (`SandboxProcess.start`: bubblewrap, both seccomp filters,
the isolation report checked by the parent) and has seen no environment code; it waits on its pipe
like any idle worker, watched by the same idle monitor. It is handed to exactly one pool, which then
sends it that environment's code as it would a worker it had just started: nothing about the wall,
the code sent or the checks before serving changes, only when the start-up happened. One spare is
kept per start-up configuration (wall, limits, tmpfs, channel); taking it starts the next one in the
background.
"""

from __future__ import annotations

import threading

from envfactory.env.sandbox.process import ChannelLimits, SandboxProcess, WorkerDied
from envfactory.env.sandbox.protocol import WorkerLimits
from envfactory.env.sandbox.wall import Wall

_Key = tuple[str, str | None, str, int, str]


def _key(wall: Wall, limits: WorkerLimits, tmpfs_mb: int, channel: ChannelLimits) -> _Key:
    return (wall.kind, wall.bwrap, limits.model_dump_json(), tmpfs_mb, channel.model_dump_json())


class Spares:
    """At most one started, unused worker per start-up configuration."""

    def __init__(self) -> None:
        self._ready: dict[_Key, SandboxProcess] = {}
        self._starting: dict[_Key, SandboxProcess] = {}
        self._lock = threading.Lock()
        self._generation = 0  # bumped by `close`: a spare that comes up after it is closed at once
        self.handed = 0  # spares handed over so far

    def take(self, wall: Wall, limits: WorkerLimits, tmpfs_mb: int, channel: ChannelLimits) -> SandboxProcess | None:
        """The ready spare for this configuration (alive, idle and clean), or None."""
        with self._lock:
            process = self._ready.pop(_key(wall, limits, tmpfs_mb, channel), None)
        if process is None:
            return None
        if process.alive and process.poll_idle() is None and process.alive:
            self.handed += 1
            return process
        process.close()
        return None

    def refill(self, wall: Wall, limits: WorkerLimits, tmpfs_mb: int, channel: ChannelLimits) -> None:
        """Start a spare for this configuration in the background, unless one is ready or on its way."""
        key = _key(wall, limits, tmpfs_mb, channel)
        with self._lock:
            if key in self._ready or key in self._starting:
                return
            process = SandboxProcess(wall, limits, tmpfs_mb=tmpfs_mb, channel=channel, monitor=True)
            self._starting[key] = process
            generation = self._generation

        def run() -> None:
            try:
                process.start()
                up = True
            except (WorkerDied, OSError, ValueError, RuntimeError):  # RuntimeError: the interpreter is exiting
                up = False
            with self._lock:
                if self._starting.get(key) is process:
                    del self._starting[key]
                keep = up and generation == self._generation and key not in self._ready
                if keep:
                    self._ready[key] = process
            if not keep:
                process.close()

        threading.Thread(target=run, name="envfactory-sandbox-spare", daemon=True).start()

    def close(self) -> None:
        """End every spare, ready or still starting: a pool's shutdown leaves no sandbox process behind."""
        with self._lock:
            self._generation += 1
            ended = [*self._ready.values(), *self._starting.values()]
            self._ready.clear()
            self._starting.clear()
        for process in ended:
            process.close()


SPARES = Spares()
