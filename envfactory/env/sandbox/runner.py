"""The parent side of a sandbox run: `run_checks_in_sandbox` and how a child's end becomes a `SandboxResult`.

Every call starts a new interpreter (`python -P -m envfactory.env.sandbox.child`) in its own
process group, with a scrubbed environment, in a fresh work folder. The parent enforces the wall
clock (killing the whole group as a backstop) and never raises for bad code.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from envfactory.env.metadata import EnvMetadata
from envfactory.env.sandbox.ast_check import StaticProblem, static_check
from envfactory.env.sandbox.limits import SandboxLimits
from envfactory.env.sandbox.protocol import (
    EXIT_BAD_JOB,
    EXIT_MEMORY,
    EXIT_NO_REPORT,
    EXIT_TIMEOUT,
    JobScenario,
    JobStep,
    SandboxJob,
)

if TYPE_CHECKING:
    from envfactory.env.checks.scenarios import TestScenario

SandboxStatus = Literal["ok", "static_rejected", "timeout", "memory", "crashed"]


class SandboxResult(BaseModel):
    """How a sandbox run ended; `output` is the child's raw `Observations` (possibly partial)."""

    status: SandboxStatus
    output: dict[str, Any] | None = None
    problems: list[StaticProblem] = Field(default_factory=list)
    stderr_tail: str = ""
    duration_s: float = 0.0
    exit_code: int | None = None
    detail: str = ""  # why, in words: which limit, which signal


# After the child's own deadline, how long the parent waits for it to write its result and exit.
_GRACE_S = 1.0
_MAX_RESULT_BYTES = 64 * 1024 * 1024
_TAIL_CHARS = 4000


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _TAIL_CHARS))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _read_output(path: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        size = path.stat().st_size
    except OSError:
        return None, "the child wrote no result"
    if size == 0:
        return None, "the child wrote no result"
    if size > _MAX_RESULT_BYTES:
        return None, f"the child's result is {size} bytes (limit {_MAX_RESULT_BYTES})"
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        return None, f"the child's result is not valid JSON: {e}"
    if not isinstance(data, dict):
        return None, "the child's result is not a JSON object"
    return data, ""


def _job_scenarios(scenarios: list[TestScenario]) -> list[JobScenario]:
    return [
        JobScenario(
            name=s.name,
            initial_config=s.initial_config,
            steps=[JobStep(tool=st.tool, args=st.args, observe_state=bool(st.expect_state)) for st in s.steps],
        )
        for s in scenarios
    ]


def _child_env() -> dict[str, str]:
    """A scrubbed environment: no API keys or settings reach generated code; fixed hash seed."""
    package_root = str(Path(__file__).resolve().parents[3])  # the folder holding `envfactory`
    return {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": package_root,
        "PYTHONHASHSEED": "0",  # set iteration order is part of a deterministic tool's behaviour
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "LANG": "C.UTF-8",
    }


def _signal_status(sig: int, limits: SandboxLimits) -> tuple[SandboxStatus, str]:
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = str(sig)
    if sig == signal.SIGXCPU:
        return "timeout", f"the code used its CPU limit of {limits.cpu_limit_s} s (SIGXCPU)"
    if sig == signal.SIGKILL:
        return "memory", "the child was killed (SIGKILL) — most likely out of memory"
    return "crashed", f"the child died from signal {name} (a crash in native code, or memory exhaustion there)"


_WORKDIR_PREFIX = "envfactory-sandbox-"


def _sweep_stale_workdirs(older_than_s: float) -> None:
    """Remove work folders a killed parent left behind (its `finally` never ran); best effort."""
    cutoff = time.time() - older_than_s
    with contextlib.suppress(OSError):
        for path in Path(tempfile.gettempdir()).glob(_WORKDIR_PREFIX + "*"):
            with contextlib.suppress(OSError):
                if path.is_dir() and path.stat().st_mtime < cutoff:
                    shutil.rmtree(path, ignore_errors=True)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _timeout_detail(output: dict[str, Any], limits: SandboxLimits) -> str:
    interrupted = output.get("interrupted") or {}
    if isinstance(interrupted, dict) and interrupted.get("kind") == "cpu":
        return f"the code used its CPU limit of {limits.cpu_limit_s} s"
    if interrupted:
        return f"the code did not finish within the {limits.timeout_s:g} s limit"
    hung = sorted(set(output.get("hung_tools") or []))
    return f"tool calls did not return within the per-call limit of {limits.call_limit_s:g} s: {', '.join(hung)}"


def run_checks_in_sandbox(
    code: str, metadata: EnvMetadata, scenarios: list[TestScenario], limits: SandboxLimits
) -> SandboxResult:
    """Statically check `code`, then run `scenarios` against it in a fresh limited subprocess.

    `metadata` names the module (tracebacks read `envgen_<name>`); the comparison with it is the
    judge's, in this process. Never raises for bad code: every outcome is a `SandboxResult`.
    """
    started = time.monotonic()
    problems = static_check(code)
    if problems:
        return SandboxResult(status="static_rejected", problems=problems, detail=f"{len(problems)} static problems")
    _sweep_stale_workdirs(max(3600.0, 10 * limits.timeout_s))
    workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
    try:
        code_path = workdir / "env.py"
        code_path.write_text(code, encoding="utf-8")
        result_path, log_path, job_path = workdir / "result.json", workdir / "child.log", workdir / "job.json"
        job = SandboxJob(
            code_path=str(code_path),
            module_name=f"envgen_{metadata.name}",
            deadline=time.time() + limits.timeout_s,
            call_timeout_s=limits.call_limit_s,
            memory_mb=limits.memory_mb,
            cpu_s=limits.cpu_limit_s,
            fsize_mb=limits.fsize_mb,
            drop_privileges=limits.drop_privileges,
            replay=limits.replay,
            scenarios=_job_scenarios(scenarios),
        )
        job_path.write_text(job.model_dump_json(), encoding="utf-8")
        cmd = [sys.executable, "-P", "-m", "envfactory.env.sandbox.child", str(job_path), str(result_path)]
        killed = False
        with log_path.open("wb") as log:
            # start_new_session: the child leads its own process group, so one killpg ends everything
            # it started; limits are applied by the child itself (preexec_fn is unsafe in a threaded parent)
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=_child_env(),
                start_new_session=True,
            )
            try:
                proc.wait(timeout=limits.timeout_s + _GRACE_S)
            except subprocess.TimeoutExpired:
                killed = True
                _kill(proc)
            except BaseException:  # interrupted ourselves: never leave the child behind
                _kill(proc)
                raise
        rc = proc.returncode
        tail = _tail(log_path)
        duration = time.monotonic() - started
        if killed:
            return SandboxResult(
                status="timeout",
                stderr_tail=tail,
                duration_s=duration,
                exit_code=rc,
                detail=f"the child did not finish within the {limits.timeout_s:g} s wall-clock limit and was killed",
            )
        output, why = _read_output(result_path)
        status: SandboxStatus
        if rc == 0 and output is not None:
            status, detail = "ok", ""
        elif rc == EXIT_TIMEOUT:
            status, detail = "timeout", _timeout_detail(output or {}, limits)
        elif rc == EXIT_MEMORY:
            status, detail = "memory", f"the code exceeded its memory limit of {limits.memory_mb} MB"
        elif rc < 0:
            status, detail = _signal_status(-rc, limits)
        elif rc == EXIT_NO_REPORT:
            status, detail = "crashed", "the child could not write its report (larger than fsize_mb?): see stderr_tail"
        elif rc == EXIT_BAD_JOB:
            status, detail = "crashed", "the sandbox child could not start (bad job): see stderr_tail"
        else:
            status, detail = "crashed", f"the child exited with code {rc}" + (f"; {why}" if why else "")
        return SandboxResult(
            status=status, output=output, stderr_tail=tail, duration_s=duration, exit_code=rc, detail=detail
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
