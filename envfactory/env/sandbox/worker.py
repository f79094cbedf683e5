"""The sandboxed worker: `python -P -s -m envfactory.env.sandbox.worker`, started through `wall.py`.

It serves the `Session` API of one generated environment over its stdin/stdout pipes, one request
at a time, for as long as the parent keeps it (a validation round, or a pool of sessions).

Start-up (trusted code only, in this order): keep the protocol pipes on private descriptors and
point stdout at stderr (so nothing the generated code prints can corrupt a frame); read `Hello`;
import the runtime and every allowed module (nothing is importable later that was not imported
now); apply resource limits; when not inside bubblewrap (the unsafe opt-out) leave the network
namespace and drop root; load the seccomp filter (no exec, fork, threads, signals or sockets from
here on); replace the socket API; seal the library functions that evaluate strings; report what
the kernel says about this process. Only then does a `load` request bring untrusted code in.

Requests: `load` (the module source), `fork` (a session from a config), `call`, `dump`,
`normalize` (a config loaded and dumped), `parse_args`, `integrity` (tampering snapshots),
`close`. The worker reports what happened; the parent judges. Limits on a call's time are the
parent's: it kills the worker when an answer is late.
"""

from __future__ import annotations

import base64
import contextlib
import json
import linecache
import os
import sys
import types
from typing import Any

from pydantic_core import to_jsonable_python

from envfactory.env.environment import Environment
from envfactory.env.sandbox.guards import restricted_builtins, seal_evaluators
from envfactory.env.sandbox.integrity import _changed, _env_snapshot, _state_overrides, _trusted_snapshot
from envfactory.env.sandbox.isolation import (
    _drop_privileges,
    _preload,
    apply_limits,
    block_network,
    enter_network_namespace,
    install_filter,
    read_status,
)
from envfactory.env.sandbox.protocol import Hello, Isolation
from envfactory.env.sandbox.wire import FrameReader, WireError, encode, holds_lone_surrogate, write_frame
from envfactory.env.session import Session
from envfactory.env.state import State
from envfactory.env.tools import ArgumentError, Tool
from envfactory.errors import ScenarioError
from envfactory.inputs import LONE_SURROGATE

MAX_REQUEST_BYTES = 256 * 1024 * 1024  # the parent is trusted; this only stops a broken pipe's garbage


def _import_error_line(tb: types.TracebackType | None, path: str) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


class Worker:
    def __init__(self, reader: FrameReader, wfd: int) -> None:
        self.reader, self.wfd = reader, wfd
        self.env: Environment | None = None
        self.sessions: dict[int, Session] = {}
        self.trusted: dict[str, Any] = {}
        self.watched: dict[str, Any] = {}

    # ---- requests --------------------------------------------------------------------------
    def load(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.env is not None:
            return {"failure": "a module is already loaded in this worker"}
        source, name, path = str(req["source"]), str(req["module_name"]), str(req["path"])
        self.trusted = self._snapshot()
        module = types.ModuleType(name)
        module.__file__ = path
        module.__dict__["__builtins__"] = restricted_builtins()
        linecache.cache[path] = (len(source), None, source.splitlines(True), path)
        sys.modules[name] = module  # pydantic resolves the module's annotations through sys.modules
        try:
            exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
        except BaseException as e:  # SystemExit, KeyboardInterrupt, MemoryError: all import failures
            return {
                "import_error": f"{type(e).__name__}: {e}",
                "import_line": _import_error_line(e.__traceback__, path),
            }
        out: dict[str, Any] = {"tampering": [f"after import: {k} was changed" for k in self._runtime_changes()]}
        env = module.__dict__.get("env")
        problems: list[str] = []
        if env is None:
            problems.append("env.py must define `env = Environment(...)` at module level")
        elif type(env) is not Environment:
            problems.append(f"`env` must be an envfactory Environment, not {type(env).__name__}")
        elif not (isinstance(env.state_model, type) and issubclass(env.state_model, State)):
            problems.append("`env.state_model` must be a subclass of envfactory State")
        else:
            problems.extend(
                f"tool '{n}' is not registered through @env.tool" for n, t in env.tools.items() if type(t) is not Tool
            )
            problems.extend(_state_overrides(env.state_model))
        if not problems:
            assert isinstance(env, Environment)
            try:
                out["derived_metadata"] = env.derived_metadata().model_dump(mode="json")
                env.metadata  # noqa: B018 - fill the lazy cache now, so the snapshot below sees its final value
            except Exception as e:
                problems.append(f"metadata cannot be derived from the code: {type(e).__name__}: {e}")
        out["env_problems"] = problems
        if not problems:
            assert isinstance(env, Environment)
            self.env = env
            self.watched = _env_snapshot(env)
        return out

    def _snapshot(self) -> dict[str, Any]:
        """The runtime's snapshot, and this worker's own loop: its pipes, its reader (a read patched to run
        code between requests), its sessions."""
        snap = _trusted_snapshot()
        snap.update({f"worker.{k}": getattr(self, k) for k in ("reader", "wfd", "sessions")})
        snap.update({f"worker.reader.{k}": v for k, v in vars(self.reader).items()})
        snap.update({f"worker op {k}": v for k, v in _OPS.items()})
        return snap

    def _runtime_changes(self) -> list[str]:
        return _changed(self.trusted, self._snapshot())

    def _need_env(self) -> Environment:
        if self.env is None:
            raise LookupError("no environment is loaded in this worker")
        return self.env

    def fork(self, req: dict[str, Any]) -> dict[str, Any]:
        env = self._need_env()
        sid = int(req["sid"])
        config = req.get("config")
        try:
            self.sessions[sid] = Session(
                env, env.new_state(config, str(req.get("source") or "<config>")), strict=bool(req.get("strict"))
            )
        except ScenarioError as e:
            return {"load_error": str(e)}
        except MemoryError:
            raise
        except Exception as e:
            return {"load_crash": f"{type(e).__name__}: {e}"}
        return {}

    def call(self, req: dict[str, Any]) -> dict[str, Any]:
        session = self.sessions[int(req["sid"])]
        rec = session.call(str(req["tool"]), req.get("args"))
        session.history.clear()  # the parent keeps the history; the worker keeps only the state
        return {
            "ok": rec.ok,
            "result": rec.result,
            "error": rec.error.model_dump(mode="json") if rec.error is not None else None,
            "diff": rec.diff.model_dump(mode="json"),
            "changes": [c.model_dump(mode="json") for c in rec.changes],
        }

    def dump(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"state": self.sessions[int(req["sid"])].dump()}

    def normalize(self, req: dict[str, Any]) -> dict[str, Any]:
        env = self._need_env()
        try:
            return {"state": env.dump_state(env.new_state(req.get("config"), str(req.get("source") or "<config>")))}
        except ScenarioError as e:
            return {"load_error": str(e)}

    def parse_args(self, req: dict[str, Any]) -> dict[str, Any]:
        tool = self._need_env().tools.get(str(req["tool"]))
        if tool is None:
            return {"problems": [{"parameter": "<tool>", "problem": f"no tool '{req['tool']}'"}]}
        try:
            return {"kwargs": to_jsonable_python(tool.parse_args(req.get("args") or {}))}
        except ArgumentError as e:
            return {"problems": [p.model_dump() for p in e.problems]}

    def integrity(self, req: dict[str, Any]) -> dict[str, Any]:
        env = self._need_env()
        return {"tampering": self._runtime_changes() + _changed(self.watched, _env_snapshot(env))}

    def close(self, req: dict[str, Any]) -> dict[str, Any]:
        for sid in req.get("sids") or []:
            self.sessions.pop(int(sid), None)
        return {}

    # ---- the loop ------------------------------------------------------------------------------
    def answer(self, req: Any) -> dict[str, Any]:
        if not isinstance(req, dict) or not isinstance(req.get("op"), str):
            return {"failure": "a request must be an object with an 'op'"}
        handler = _OPS.get(req["op"])
        if handler is None:
            return {"failure": f"unknown op {req['op']!r}"}
        for sid in req.get("closed") or []:  # sessions the parent dropped since its last request
            self.sessions.pop(int(sid), None)
        try:
            return handler(self, req)
        except MemoryError:
            return {"failure": "MemoryError", "memory": True}
        except Exception as e:  # a malformed request, or the code broke something the session does not catch
            return {"failure": f"{type(e).__name__}: {e}"}
        except BaseException as e:  # SystemExit, KeyboardInterrupt... from a tool: no rollback happened
            with contextlib.suppress(Exception):
                self.sessions.pop(int(req["sid"]), None)  # its state may be half-changed: the parent restores it
            return {"failure": f"{type(e).__name__}: {e} (raised past the session, which catches Exception only)"}

    def serve(self) -> None:
        while True:
            try:
                # polled for (`Hello.spin_us`, the same judged and served): the next request comes within
                # microseconds when the parent is driving one session
                body = self.reader.read(max_bytes=MAX_REQUEST_BYTES, spin=True)
            except WireError:
                return  # the parent went away
            try:
                req = json.loads(body)
            except (ValueError, RecursionError):
                req = None
            reply = self.answer(req)
            reply["id"] = req.get("id") if isinstance(req, dict) else None
            try:
                frame = encode(reply)
                if holds_lone_surrogate(frame, reply):  # the parent refuses it (and ends this worker): say why
                    frame = encode({"id": reply["id"], "failure": f"the answer holds {LONE_SURROGATE}"})
            except (ValueError, TypeError, RecursionError, MemoryError) as e:
                # a result the runtime cannot encode (too deep, not JSON): the call is not usable
                frame = encode({"id": reply["id"], "failure": f"the answer cannot be encoded: {type(e).__name__}"})
            write_frame(self.wfd, frame)


_OPS = {
    "load": Worker.load,
    "fork": Worker.fork,
    "call": Worker.call,
    "dump": Worker.dump,
    "normalize": Worker.normalize,
    "parse_args": Worker.parse_args,
    "integrity": Worker.integrity,
    "close": Worker.close,
}


def _isolation(hello: Hello, applied: dict[str, int], extra: dict[str, Any]) -> Isolation:
    status = read_status()
    try:
        root_entries = sorted(os.listdir("/"))
    except OSError:
        root_entries = []
    return Isolation(
        wrapped=hello.wrapped,
        uid=os.getuid(),
        seccomp_mode=int(status.get("Seccomp", "0") or 0),
        seccomp_filters=int(status.get("Seccomp_filters", "0") or 0),
        no_new_privs=status.get("NoNewPrivs", "0") == "1",
        cap_eff=status.get("CapEff", ""),
        root_entries=root_entries,
        rlimits=applied,
        **extra,
    )


def _start(rfd: int, wfd: int) -> Worker | None:
    """The trusted start-up; answers the hello frame with the isolation report (or a start-up error)."""
    reader = FrameReader(rfd)
    hello = Hello.model_validate(json.loads(reader.read(max_bytes=1 << 20)))
    reader.spin_s = hello.spin_us / 1e6
    _preload()
    extra: dict[str, Any] = {}
    applied = apply_limits(hello.limits)
    if not hello.wrapped:
        extra["netns"], _ = enter_network_namespace()
        if os.geteuid() == 0:
            with contextlib.suppress(OSError):
                _drop_privileges()
    try:
        install_filter(base64.b64decode(hello.seccomp_bpf))
    except OSError as e:
        write_frame(wfd, encode({"failure": f"cannot load the seccomp filter: {e}"}))
        return None
    block_network()
    extra["socket_blocked"] = True
    extra["sealed_evaluators"] = seal_evaluators()
    write_frame(wfd, encode({"isolation": _isolation(hello, applied, extra).model_dump(mode="json")}))
    return Worker(reader, wfd)


def main() -> int:
    # the protocol moves to private descriptors; fd 0 reads nothing, fd 1 goes to the log (stderr)
    rfd, wfd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    try:
        worker = _start(rfd, wfd)
    except Exception as e:
        with contextlib.suppress(Exception):
            write_frame(wfd, encode({"failure": f"worker start-up failed: {type(e).__name__}: {e}"}))
        os._exit(3)
    if worker is not None:
        worker.serve()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)  # no interpreter shutdown: finalizers (__del__, atexit) of the generated code never run


if __name__ == "__main__":
    main()
