"""The limits of one sandbox run: wall clock, per call, memory, CPU, file size, tmpfs, answers, replay.

`worker_limits` is the one place a worker's own limits (what it can read back with `getrlimit`) are
built, for a validation round and for a served worker alike: from the same settings they are the
same, so a worker cannot tell which of the two it is from them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from envfactory.env.sandbox.protocol import WorkerLimits

if TYPE_CHECKING:
    from envfactory.config import Settings

WORKER_CPU_S = 120  # the default of `sandbox_worker_cpu_s`
WORKER_SPIN_US = 300  # the default of `sandbox_spin_us`
WORKER_FSIZE_MB = 32  # the largest file a worker may write (its log on the host, a file in its /tmp)


def worker_limits(memory_mb: int, cpu_s: int, fsize_mb: int = WORKER_FSIZE_MB) -> WorkerLimits:
    """The limits a sandboxed worker applies to itself: the same function for rounds and served workers."""
    return WorkerLimits(memory_mb=memory_mb, cpu_s=cpu_s, fsize_mb=fsize_mb)


class SandboxLimits(BaseModel):
    """Limits of one sandbox run.

    `timeout_s` is wall clock for the whole child, interpreter start included; `call_timeout_s`
    (default a quarter of it, at least 0.5 s) stops one hanging tool call, so the run goes on with
    the next scenario and reports every hang it meets. `memory_mb` is address space the code may
    use on top of the child's baseline after the runtime is imported (a total would depend on the
    machine's libraries). `cpu_s` is the worker's RLIMIT_CPU: the served workers' own
    (`sandbox_worker_cpu_s`), not one sized to the round, so the code cannot tell a round from serving
    by it; the round's wall clock bounds its CPU anyway.
    """

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(default=20.0, gt=0)
    call_timeout_s: float | None = Field(default=None, gt=0)
    memory_mb: int = Field(default=1024, gt=0)
    cpu_s: float | None = Field(default=None, gt=0, description="RLIMIT_CPU, rounded up to whole seconds")
    fsize_mb: int = Field(default=WORKER_FSIZE_MB, gt=0, description="largest file the child may write (its log)")
    tmpfs_mb: int = Field(default=16, gt=0, description="size of the sandbox's private /tmp")
    max_answer_mb: int = Field(default=64, gt=0, description="largest answer the parent reads from the worker")
    max_depth: int = Field(default=100, gt=1, description="deepest JSON nesting the parent accepts from the worker")
    spin_us: int = Field(
        default=WORKER_SPIN_US,
        ge=0,
        le=10_000,
        description="how long parent and worker poll their pipe before sleeping: the served workers' own "
        "(`sandbox_spin_us`), so the code cannot tell a round from serving by it",
    )
    replay: bool = Field(default=True, description="replay each scenario to check the tools are deterministic")
    unsafe_no_os_sandbox: bool = Field(
        default=False, description="run without bubblewrap where it is missing (Python guards only): UNSAFE"
    )

    @classmethod
    def from_settings(cls, settings: Settings) -> SandboxLimits:
        return cls(
            timeout_s=settings.sandbox_timeout_s,
            memory_mb=settings.sandbox_memory_mb,
            tmpfs_mb=settings.sandbox_tmpfs_mb,
            cpu_s=settings.sandbox_worker_cpu_s,
            spin_us=settings.sandbox_spin_us,
            unsafe_no_os_sandbox=settings.unsafe_no_os_sandbox,
        )

    @property
    def call_limit_s(self) -> float:
        return self.call_timeout_s if self.call_timeout_s is not None else max(0.5, self.timeout_s / 4)

    @property
    def cpu_limit_s(self) -> int:
        return math.ceil(self.cpu_s) if self.cpu_s is not None else WORKER_CPU_S

    def worker(self) -> WorkerLimits:
        """This round's worker limits (`worker_limits`, as a served worker gets them)."""
        return worker_limits(self.memory_mb, self.cpu_limit_s, self.fsize_mb)
