"""Attack suite: hostile generated `env.py` code that gets the interpreter's real builtins, then tries to break out.

The Python filter (the AST check, the guarded builtins) is known to leak: pydantic reads attribute
paths with the real `getattr` (`tests/data/attacks/hostile_env.py` holds the gadgets). So every
attack here starts *past* the filter, with `open`, `exec`, `__import__`, `os` and `ctypes`, and
what must hold is the OS wall: nothing read or written outside the sandbox, no process, signal or
connection leaving it, no verdict it can forge, no answer that crashes or stalls the parent, no
resource beyond its limits. Each attempt's outcome comes back in the attack tool's result (what an
attacker would exfiltrate) and is asserted; the host side is checked by the test itself.

Escapes this suite found, now closed and kept as tests (each proves the hole with the least possible
effect on the host): bwrap started by root mapped the sandbox uid to host root with a writable
/proc/sys; bwrap's init process (PID 1 of the sandbox) could be rewritten through /proc/1/mem;
shared memory, memfd and the unsized tmpfs root escaped the memory limit; a wide answer held the
parent far past its deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from envfactory.config import Settings
from envfactory.env.metadata import EnvMetadata
from envfactory.env.pool import EnvPool, load_env_folder
from envfactory.env.sandbox import (
    Observations,
    SandboxLimits,
    parse_observations,
    static_check,
)
from envfactory.env.sandbox.wall import RUNTIME_MOUNT
from envfactory.env.sandbox.wire import decode
from envfactory.env.sandboxed import SandboxedEnvironment, SandboxedSession
from envfactory.env.session import Session
from envfactory.envgen.checks import ExpectedCall, TestScenario, judge
from envfactory.envgen.checks.sandbox_round import SandboxResult, run_checks_in_sandbox
from tests.support.paths import ROOT, TEST_DATA

DATA = TEST_DATA / "attacks"
TEMPLATE = (DATA / "hostile_env.py").read_text(encoding="utf-8")
PRELUDE = (DATA / "prelude.py").read_text(encoding="utf-8")

ATTACK = SandboxLimits(timeout_s=10, memory_mb=256, replay=False)
FORGE = SandboxLimits(timeout_s=6, call_timeout_s=1.5, memory_mb=256, replay=False)
HANG = SandboxLimits(timeout_s=3, call_timeout_s=0.75, memory_mb=256, replay=False)
SLACK_S = 2.0  # start-up, kill and clean-up on a loaded 2-core machine

# Where two of the escapes below depend on the host: run as root, bubblewrap maps the sandbox uid to
# host uid 0; Yama's ptrace_scope >= 1 keeps a process from opening its parent's /proc/PID/mem.
AS_ROOT = os.geteuid() == 0
_YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")
YAMA_RESTRICTS_PTRACE = _YAMA.is_file() and _YAMA.read_text(encoding="ascii").strip() != "0"

# ---- the harness ----------------------------------------------------------------------------


def hostile_env(
    payload: str = "",
    *,
    values: dict[str, Any] | None = None,
    at_import: bool = False,
    gadget: str = "init_globals",
    ping: str = "pong",
) -> str:
    """The hostile module: the gadgets, then `payload` (after the prelude) run with the real builtins."""
    code = TEMPLATE
    for old, new in (
        ('PAYLOAD = ""', f"PAYLOAD = {PRELUDE + textwrap.dedent(payload)!r}"),
        ("VALUES: dict = {}", f"VALUES: dict = {values or {}!r}"),
        ("AT_IMPORT = False", f"AT_IMPORT = {at_import!r}"),
        ('GADGET = "init_globals"', f"GADGET = {gadget!r}"),
        ('PING = "pong"', f"PING = {ping!r}"),
    ):
        assert code.count(old) == 1, f"the template lost its line {old!r}"
        code = code.replace(old, new)
    problems = static_check(code)
    assert problems == [], f"the hostile module no longer passes the static check: {problems}"
    return code


@pytest.fixture(scope="module")
def meta(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnvMetadata]:
    """The metadata of the hostile module, derived in this process from its harmless form."""
    folder = tmp_path_factory.mktemp("attack-meta") / "attack"
    folder.mkdir()
    (folder / "env.py").write_text(hostile_env(), encoding="utf-8")
    try:
        yield load_env_folder(folder, with_metadata=False).derived_metadata()
    finally:
        sys.modules.pop("envfactory_envs.attack", None)


def scenario(*steps: ExpectedCall, name: str = "s") -> TestScenario:
    return TestScenario(name=name, initial_config={}, steps=list(steps))


ATTACK_STEP = ExpectedCall(tool="attack")


def run_round(
    code: str, metadata: EnvMetadata, scenarios: list[TestScenario], limits: SandboxLimits
) -> tuple[SandboxResult, Observations]:
    started = time.monotonic()
    result = run_checks_in_sandbox(code, metadata, scenarios, limits)
    elapsed = time.monotonic() - started
    assert elapsed < limits.timeout_s + SLACK_S, f"the round took {elapsed:.1f} s (limit {limits.timeout_s:g} s)"
    obs = parse_observations(result.output)
    assert obs is not None, (result.status, result.detail)
    return result, obs


def run_attack(
    payload: str, metadata: EnvMetadata, *, limits: SandboxLimits = ATTACK, **options: Any
) -> tuple[SandboxResult, dict[str, Any]]:
    """Run `payload` in the attack tool; (the round's result, what the payload reported)."""
    result, obs = run_round(hostile_env(payload, **options), metadata, [scenario(ATTACK_STEP)], limits)
    assert obs.import_error is None, (obs.import_error, result.stderr_tail)
    step = obs.scenarios[0].steps[0]
    assert step.ok, (result.status, result.detail, step.error_type, step.error_message, result.stderr_tail)
    out = step.result
    assert isinstance(out, dict) and out.get("real_builtins") is True, out  # past the Python filter
    return result, out


def refused(out: dict[str, Any], key: str, *errors: str) -> None:
    """The attempt `key` raised one of `errors` (exception type names)."""
    got = str(out.get(key))
    assert got.split(":", 1)[0] in errors, f"{key}: {got}"


def assert_no_leak(result: SandboxResult, *needles: str) -> None:
    """Nothing the parent got back (observations, errors, stderr tail, details) holds any of `needles`."""
    blob = result.model_dump_json()
    for needle in needles:
        assert needle and needle not in blob, f"leaked: {needle[:40]!r}"


def processes_with(marker: str) -> list[int]:
    """Host processes whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


# ---- the gadgets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gadget", "at_import"),
    [("init_globals", False), ("traceback", False), ("init_globals", True), ("traceback", True)],
)
def test_the_gadgets_reach_the_real_builtins_and_the_worker(meta: EnvMetadata, gadget: str, at_import: bool) -> None:
    """The premise of this suite: past the static check, generated code holds the real builtins and the
    worker's own objects (frames), in a tool call and at import. If the filter ever closes these, give
    hostile_env.py another gadget: the containment tests below need one."""
    payload = """
        worker, req = worker_and_request()
        out["worker"] = type(worker).__name__
        out["op"] = req.get("op")
        out["uid"] = os.getuid()
        out["os"] = os.__name__
    """
    _, out = run_attack(payload, meta, gadget=gadget, at_import=at_import)
    assert out["gadget"] == gadget and out["worker"] == "Worker" and out["os"] == "os"
    assert out["op"] == ("load" if at_import else "call")
    assert out["uid"] == 65534


# ---- 1. secrets outside the sandbox ---------------------------------------------------------


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A random token in files outside the sandbox and in the parent's environment variables."""
    token = secrets.token_hex(16)
    files = {"tmp": tmp_path / "secret.txt", "project": ROOT / f".attack-secret-{token[:12]}.txt"}
    home = Path("/root")
    if home.is_dir() and os.access(home, os.W_OK):
        files["root_home"] = home / f".attack-secret-{token[:12]}"
    for path in files.values():
        path.write_text(f"SECRET={token}\n", encoding="utf-8")
    env_token = secrets.token_hex(16)
    monkeypatch.setenv("OPENAI_API_KEY", f"sk-{env_token}")
    monkeypatch.setenv("ENVFACTORY_ATTACK_SECRET", env_token)
    try:
        yield {"token": token, "env_token": env_token, "files": {k: str(v) for k, v in files.items()}}
    finally:
        for path in files.values():
            path.unlink(missing_ok=True)


def _distinctive_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    return max(lines, key=len)


SECRETS_PAYLOAD = """
    for name, path in values["files"].items():
        attempt("read " + name, lambda p=path: open(p).read())
        link = "/tmp/link-" + name
        attempt("symlink " + name, lambda p=path, link=link: (os.symlink(p, link), open(link).read())[1])
    for path in values["system_files"]:
        attempt("read " + path, lambda p=path: open(p, "rb").read().decode("latin-1"))
    parent = values["parent"]
    for what in ("environ", "cmdline", "status", "cwd", "root"):
        attempt(f"parent {what}", lambda w=what: os.listdir(f"/proc/{parent}/{w}") if w in ("cwd", "root")
                else open(f"/proc/{parent}/{w}", "rb").read().decode("latin-1"))
    attempt("os.environ", lambda: dict(os.environ))
    attempt("self environ", lambda: open("/proc/self/environ", "rb").read().decode("latin-1"))
    attempt("init environ", lambda: open("/proc/1/environ", "rb").read().decode("latin-1"))
    attempt("pids", lambda: sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
    attempt("list /", lambda: sorted(os.listdir("/")))
    attempt("list project", lambda: sorted(os.listdir(values["project"])))
    attempt("list tmp_path", lambda: sorted(os.listdir(values["tmp_path"])))
    attempt("list /root", lambda: sorted(os.listdir("/root")))
    attempt("list /etc", lambda: sorted(os.listdir("/etc")))
"""


def test_secrets_outside_the_sandbox_stay_unread(meta: EnvMetadata, planted: dict[str, Any], tmp_path: Path) -> None:
    readme = ROOT / "README.md"
    system_files = ["/etc/passwd", "/etc/shadow", "/etc/hostname", "/root/.bash_history", "/root/.ssh/id_rsa"]
    values = {
        "files": planted["files"],
        "system_files": [*system_files, str(readme)],
        "parent": os.getpid(),
        "project": str(ROOT),
        "tmp_path": str(tmp_path),
    }
    result, out = run_attack(SECRETS_PAYLOAD, meta, values=values)
    for name in planted["files"]:
        refused(out, f"read {name}", "FileNotFoundError", "PermissionError")
        refused(out, f"symlink {name}", "FileNotFoundError", "PermissionError")  # resolved inside the sandbox
    for path in values["system_files"]:
        refused(out, f"read {path}", "FileNotFoundError", "PermissionError")
    for what in ("environ", "cmdline", "status", "cwd", "root"):
        refused(out, f"parent {what}", "FileNotFoundError", "PermissionError")  # another PID namespace
    assert out["pids"] == "OK [1]", out["pids"]  # the worker alone: it is PID 1, no bubblewrap init beside it
    for key in ("os.environ", "self environ", "init environ"):
        assert "OPENAI_API_KEY" not in out[key] and "ENVFACTORY_ATTACK" not in out[key], out[key]
    listed = " ".join(str(out[k]) for k in ("list /", "list project", "list /root", "list /etc"))
    assert "README.md" not in listed and "passwd" not in listed and ".attack-secret" not in listed, listed
    refused(out, "list tmp_path", "FileNotFoundError")
    needles = [planted["token"], planted["env_token"], _distinctive_line(readme)]
    if Path("/etc/passwd").is_file():
        needles.append(Path("/etc/passwd").read_text(encoding="utf-8").splitlines()[0])
    assert_no_leak(result, *needles)


# ---- 2. writes outside the sandbox ----------------------------------------------------------

WRITES_PAYLOAD = """
    def write(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(values["token"])
        return path
    for name, path in values["targets"].items():
        attempt("write " + name, lambda p=path: write(p))
"""


def test_writes_outside_the_sandbox_leave_no_trace(meta: EnvMetadata, tmp_path: Path) -> None:
    token = secrets.token_hex(8)
    name = f"attack-pwned-{token}.txt"
    host = {
        "tmp_path": tmp_path / "sub" / name,
        "project": ROOT / name,
        "venv": Path(sys.prefix) / name,
        "runtime": ROOT / "envfactory" / name,
        "home": Path.home() / name,
        "etc": Path("/etc") / name,
    }
    targets = {k: str(v) for k, v in host.items()}
    targets["runtime_mount"] = f"{RUNTIME_MOUNT}/envfactory/{name}"
    try:
        _, out = run_attack(WRITES_PAYLOAD, meta, values={"targets": targets, "token": token})
        appeared = [str(p) for p in host.values() if p.exists()]
        assert appeared == [], f"written outside the sandbox: {appeared}"
        # the interpreter, its packages and the runtime are read-only; the rest lands in the sandbox's own root
        for key in ("venv", "runtime_mount"):
            assert "Read-only file system" in out[f"write {key}"], out[f"write {key}"]
    finally:
        for p in host.values():
            with contextlib.suppress(OSError):
                p.unlink()


# ---- 3. processes and threads ---------------------------------------------------------------

PROCESSES_PAYLOAD = """
    import ctypes
    import subprocess
    import threading
    import _thread

    def fork():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        return pid

    def libc_fork():
        pid = ctypes.CDLL(None, use_errno=True).fork()
        if pid == 0:
            os._exit(0)
        return pid

    attempt("execv python", lambda: os.execv(sys.executable, [sys.executable, "-c", "pass"]))
    attempt("execv sh", lambda: os.execv("/bin/sh", ["sh", "-c", "true"]))
    attempt("system", lambda: os.system("echo pwned > /tmp/by-system"))
    attempt("system effect", lambda: os.path.exists("/tmp/by-system"))
    attempt("subprocess", lambda: subprocess.run([sys.executable, "-c", "pass"], check=False).returncode)
    attempt("fork", fork)
    attempt("libc fork", libc_fork)
    attempt("posix_spawn", lambda: os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], {}))
    attempt("thread", lambda: threading.Thread(target=print).start())
    attempt("raw thread", lambda: _thread.start_new_thread(print, ()))
    attempt("fork bomb", lambda: [fork() for _ in range(1000)])
    attempt("threads", lambda: int(open("/proc/self/status").read().split("Threads:")[1].split()[0]))
"""


def test_no_program_process_or_thread_can_start(meta: EnvMetadata) -> None:
    _, out = run_attack(PROCESSES_PAYLOAD, meta)
    for key in ("execv python", "subprocess", "fork", "posix_spawn", "fork bomb"):
        refused(out, key, "PermissionError")
    refused(out, "execv sh", "PermissionError", "FileNotFoundError")
    assert out["system"] == "OK 32512", out["system"]  # exit status 127: the shell never ran
    assert out["system effect"] == "OK False"
    assert out["libc fork"] == "OK -1", out["libc fork"]
    refused(out, "thread", "RuntimeError")
    refused(out, "raw thread", "RuntimeError")
    assert out["threads"] == "OK 1"


# ---- 4. signals -----------------------------------------------------------------------------

SIGNALS_PAYLOAD = """
    import fcntl
    import signal
    import time

    for name, pid in (("init", 1), ("everyone", -1), ("parent", values["parent"]), ("sibling", values["sibling"]),
                      ("parent group", -values["parent"])):
        attempt("kill " + name, lambda p=pid: os.kill(p, signal.SIGKILL))
    attempt("killpg parent", lambda: os.killpg(values["parent"], signal.SIGKILL))
    attempt("pidfd parent", lambda: os.pidfd_open(values["parent"]))

    def sigio():  # ask the kernel to signal the parent when a pipe is ready
        r, w = os.pipe()
        fcntl.fcntl(r, fcntl.F_SETOWN, values["parent"])
        fcntl.fcntl(r, fcntl.F_SETSIG, signal.SIGKILL)
        fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)
        os.write(w, b"x")
        return "armed"
    attempt("sigio parent", sigio)

    delivered, sweeps = [], 0
    end = time.monotonic() + values["seconds"]
    while time.monotonic() < end:  # every pid this process could name, while the honest run goes on
        for pid in range(3, 40000):
            try:
                os.kill(pid, signal.SIGKILL)
                delivered.append(pid)
            except OSError:
                pass
        sweeps += 1
    out["sweeps"] = sweeps
    out["delivered"] = delivered[:20]
"""


def test_signals_reach_no_process_outside_while_a_neighbour_runs(meta: EnvMetadata) -> None:
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    honest_scenario = scenario(*[ExpectedCall(tool="ping", expect_result="pong")] * 300, name="honest")
    results: dict[str, SandboxResult] = {}

    def honest() -> None:
        time.sleep(0.3)  # start while the attacker sweeps
        results["honest"] = run_checks_in_sandbox(hostile_env(), meta, [honest_scenario], ATTACK)

    values = {"parent": os.getpid(), "sibling": sibling.pid, "seconds": 2.0}
    limits = SandboxLimits(timeout_s=10, call_timeout_s=5, memory_mb=256, replay=False)
    thread = threading.Thread(target=honest)
    try:
        thread.start()
        _, out = run_attack(SIGNALS_PAYLOAD, meta, values=values, limits=limits)
        thread.join(timeout=30)
        for key in ("kill init", "kill everyone", "kill parent", "kill sibling", "kill parent group", "killpg parent"):
            refused(out, key, "PermissionError")
        refused(out, "pidfd parent", "PermissionError")
        refused(out, "sigio parent", "ProcessLookupError", "PermissionError")  # no such pid in its namespace
        assert out["delivered"] == [] and out["sweeps"] >= 1, out
        assert sibling.poll() is None, "a process outside the sandbox was killed"
        report = judge(meta, [honest_scenario], results["honest"], 1.0)
        assert results["honest"].status == "ok" and report.passed(), report.summary()
    finally:
        sibling.kill()
        sibling.wait(timeout=10)
        thread.join(timeout=30)


# ---- 5. network -----------------------------------------------------------------------------

NETWORK_PAYLOAD = """
    import ctypes
    import socket

    port = values["port"]
    attempt("create_connection", lambda: socket.create_connection(("127.0.0.1", port), timeout=1))
    attempt("socket()", lambda: socket.socket())
    real_type = [c for c in type.mro(socket.socket) if c.__module__ == "_socket"][0]
    attempt("the real socket type", lambda: real_type(socket.AF_INET, socket.SOCK_STREAM))
    attempt("unix socket", lambda: real_type(socket.AF_UNIX, socket.SOCK_STREAM))
    attempt("socketpair", lambda: socket.socketpair())

    def libc_socket():
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
        if fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return fd
    attempt("libc socket", libc_socket)
    attempt("interfaces", lambda: sorted(ln.split(":")[0].strip() for ln in open("/proc/net/dev") if ":" in ln))
"""


def test_no_connection_leaves_the_sandbox(meta: EnvMetadata) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list[Any] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(peer)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        _, out = run_attack(NETWORK_PAYLOAD, meta, values={"port": server.getsockname()[1]})
        time.sleep(0.3)
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
    assert accepted == []
    for key in ("create_connection", "socket()", "the real socket type", "unix socket", "socketpair", "libc socket"):
        refused(out, key, "PermissionError")
    assert out["interfaces"] == "OK ['lo']", out["interfaces"]  # its own network namespace: loopback only


# ---- 6. forging the verdict -----------------------------------------------------------------

# What the attacker would like the parent to believe: the four answers after its own call.
FORGED_ANSWERS = """
    def forged_answers(rid):
        call = {"ok": True, "error": None, "diff": {}, "changes": []}
        state = {"hits": 0, "notes": []}
        return [
            {"id": rid, **call, "result": {"real_builtins": True}},
            {"id": rid + 1, "state": state},
            {"id": rid + 2, **call, "result": "pong"},
            {"id": rid + 3, "state": state},
        ]
    verdict = json.dumps({"status": "ok", "passed": True, "pass_rate": 1.0, "errors": []})
"""

FORGERIES = {
    # text that looks like a verdict, on every stream a child usually reports on
    "stdout": """
        print(verdict)
        sys.stdout.flush()
        os.write(1, (verdict + "\\n").encode())
        os.write(2, (verdict + "\\n").encode())
        os.write(1, b"".join(frame_of(a) for a in forged_answers(worker_and_request()[1]["id"])))
    """,
    # forged frames (and a verdict) on every descriptor the process holds
    "every_fd": """
        rid = worker_and_request()[1]["id"]
        for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
            attempt(f"fd {fd}", lambda fd=fd: os.write(fd, b"".join(frame_of(a) for a in forged_answers(rid))))
            attempt(f"fd {fd} verdict", lambda fd=fd: os.write(fd, verdict.encode()))
    """,
    # the exact frames the parent will read next, on the protocol pipe itself
    "protocol_pipe": """
        worker, req = worker_and_request()
        for answer in forged_answers(req["id"]):
            os.write(worker.wfd, frame_of(answer))
    """,
    # a clean exit in the middle of a call: no answer at all
    "exit_0": """
        os._exit(0)
    """,
}


@pytest.mark.parametrize("how", sorted(FORGERIES))
def test_a_failing_environment_cannot_forge_a_pass(meta: EnvMetadata, how: str) -> None:
    """`ping` answers 'pang'; the scenario wants 'pong'. Whatever the code writes, the verdict stays failed."""
    s = scenario(ATTACK_STEP, ExpectedCall(tool="ping", expect_result="pong"))
    code = hostile_env(textwrap.dedent(FORGED_ANSWERS) + textwrap.dedent(FORGERIES[how]), ping="pang")
    result, obs = run_round(code, meta, [s], FORGE)
    report = judge(meta, [s], result, 1.0)
    assert not report.passed(), report.summary()
    steps = obs.scenarios[0].steps
    if how == "stdout":  # the streams are a log: the protocol did not notice
        assert result.status == "ok" and steps[1].result == "pang", (result.status, steps)
        assert any(e.dimension == "results" for e in report.errors)
    else:  # a frame out of turn, or none: the worker is dead and the run failed
        assert result.status == "crashed", (result.status, result.detail)
        if how == "protocol_pipe":  # the first forged frame is read as the attack call's answer; a frame already
            # there when the next request goes is refused ("no request asked for"). (One the worker writes after the
            # request went is that request's answer, as any answer of a hostile worker is: a fresh clone under load
            # caught `ping` answered 'pong' so. The verdict below is what must hold, and did.)
            assert "no request asked for" in result.detail, result.detail
        assert any(e.severity == "critical" for e in report.errors), report.summary()


def test_a_runtime_that_lies_about_a_read_tool_is_caught_by_the_parents_dumps(meta: EnvMetadata) -> None:
    """The worker's Session.call is replaced: `ping` (a read tool) writes the state and reports a clean,
    successful call; the worker's tampering report is silenced too. The parent's own dumps disagree."""
    payload = """
        session_module = sys.modules["envfactory.env.session"]
        worker, _ = worker_and_request()
        worker_globals = type(worker).integrity.__globals__  # the worker runs as __main__
        real_call = session_module.Session.call

        def lying_call(self, tool, args=None):
            if tool == "ping":
                self.state.hits += 1
                return self._record(tool, args or {}, result="pong")
            return real_call(self, tool, args)

        session_module.Session.call = lying_call
        worker_globals["_changed"] = lambda before, after: []  # no tampering to report
        out["patched"] = session_module.Session.call is lying_call
    """
    s = scenario(ATTACK_STEP, ExpectedCall(tool="ping", expect_result="pong"))
    result, obs = run_round(hostile_env(payload), meta, [s], ATTACK)
    steps = obs.scenarios[0].steps
    assert steps[0].ok and steps[0].result["patched"] is True
    assert steps[1].error_type == "contract_violation", steps[1]
    assert obs.tampering == []  # the worker's own integrity report was silenced...
    report = judge(meta, [s], result, 1.0)
    assert not report.passed(), report.summary()  # ...the parent's comparison was not


# ---- 7. swallowing the limits ---------------------------------------------------------------

SWALLOW_ENV = """
from envfactory.env import Environment, State

Catch = BaseException


class SpinDB(State):
    hits: int = 0


env = Environment("spin", SpinDB, description="Spins.", domain="utilities")
{at_import}

@env.tool(kind="read")
def spin(db: SpinDB) -> int:
    \"\"\"Never return, whatever is raised.\"\"\"
    while True:
        try:
            while True:
                db.hits
        except Catch:
            continue
"""
SPIN_META = EnvMetadata.model_validate(
    {
        "name": "spin",
        "description": "Spins.",
        "domain": "utilities",
        "tools": [{"name": "spin", "description": "Never return, whatever is raised.", "kind": "read"}],
    }
)
AT_IMPORT_SPIN = """
while True:
    try:
        while True:
            pass
    except Catch:
        continue
"""


@pytest.mark.parametrize("where", ["call", "import"])
def test_catching_base_exception_does_not_swallow_the_limits(where: str) -> None:
    code = SWALLOW_ENV.format(at_import=AT_IMPORT_SPIN if where == "import" else "")
    assert static_check(code) == []  # `except Catch:` is not `except BaseException:` to the AST check
    result, obs = run_round(code, SPIN_META, [scenario(ExpectedCall(tool="spin"))], HANG)
    assert result.status == "timeout", (result.status, result.detail)
    if where == "call":
        assert obs.hung_tools == ["spin"] and obs.scenarios[0].steps[0].error_type == "timeout"
    else:
        assert obs.interrupted is not None and obs.interrupted.phase == "import"


def test_ignoring_signals_and_raising_limits_with_the_real_builtins_does_not_help(meta: EnvMetadata) -> None:
    payload = """
        import resource
        import signal
        for sig in (signal.SIGXCPU, signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGHUP):
            attempt(f"ignore {sig.name}", lambda s=sig: signal.signal(s, signal.SIG_IGN))
        for name in ("RLIMIT_CPU", "RLIMIT_AS", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_FSIZE"):
            which = getattr(resource, name)
            attempt(f"raise {name}", lambda w=which: resource.setrlimit(w, (resource.RLIM_INFINITY,) * 2))
        while True:
            try:
                while True:
                    pass
            except BaseException:
                continue
    """
    result, obs = run_round(hostile_env(payload), meta, [scenario(ATTACK_STEP)], HANG)
    assert result.status == "timeout" and obs.hung_tools == ["attack"], (result.status, result.detail)


# ---- 8. answers the parent must survive -----------------------------------------------------

HUGE = {
    "result nested 200,000 deep": """
        deep = []
        for _ in range(200_000):
            deep = [deep]
        out["deep"] = deep
    """,
    "result of 100 MB": """
        out["big"] = "x" * 100_000_000
    """,
    "state with a cycle": """
        db.notes.append(db.notes)
    """,
    "a million frames": """
        sys.setrecursionlimit(10**7)
        def down(n):
            return down(n + 1) + 1
        down(0)
    """,
}


@pytest.mark.parametrize("what", sorted(HUGE))
def test_monstrous_results_end_with_a_verdict(meta: EnvMetadata, what: str) -> None:
    s = scenario(ATTACK_STEP, ExpectedCall(tool="ping", expect_result="pong"))
    result, obs = run_round(hostile_env(HUGE[what]), meta, [s], ATTACK)
    assert result.status in ("ok", "crashed", "memory", "timeout"), (result.status, result.detail)
    attack = obs.scenarios[0].steps[0] if obs.scenarios and obs.scenarios[0].steps else None
    assert result.status != "ok" or (attack is not None and not attack.ok), (result.status, attack)
    report = judge(meta, [s], result, 1.0)
    assert not report.passed()
    assert report.summary() and result.model_dump_json()


# Raw bytes on the protocol pipe, in place of the worker's answer to the attack call.
HOSTILE_FRAMES = """
    import struct
    worker, req = worker_and_request()
    rid = req["id"]
    head = struct.pack
    frames = {
        "nested 200,000 deep": frame_of(b"[" * 200_000 + b"]" * 200_000),
        "NaN and Infinity": frame_of(b'{"id": %d, "ok": true, "result": [NaN, Infinity, -Infinity]}' % rid),
        "a 100,000-digit number": frame_of(b'{"id": %d, "ok": true, "result": %s}' % (rid, b"9" * 100_000)),
        "invalid UTF-8": frame_of(b'{"id": %d, "ok": true, "result": "\\xff\\xfe"}' % rid),
        "a lone surrogate": frame_of(b'{"id": %d, "ok": true, "result": "\\\\ud800"}' % rid),
        "a 4 GB length": head(">I", 0xFFFFFFFF),
        "a truncated frame": head(">I", 1000) + b'{"id": 1',
        "not an object": frame_of(b"[1, 2, 3]"),
        "another request's id": frame_of({"id": rid + 7, "ok": True, "result": "pong"}),
        "wrong types": frame_of({"id": rid, "ok": "yes", "result": 1, "diff": "none", "changes": 5}),
        "a duplicate answer": frame_of({"id": rid, "ok": True, "result": 1}) * 2,
        "a float id": frame_of(b'{"id": %d.0, "ok": true, "result": "pong"}' % rid),
        "a boolean id": frame_of({"id": True, "ok": True, "result": "pong"}),
    }
    kind = values["kind"]
    os.write(worker.wfd, frames[kind] if kind in frames else head(">I", 1000) + b'{"id": 1')
    if kind == "silence after a partial frame":
        while True:
            pass
    os._exit(0)
"""
FRAME_KINDS = [
    "nested 200,000 deep",
    "NaN and Infinity",
    "a 100,000-digit number",
    "invalid UTF-8",
    "a lone surrogate",
    "a 4 GB length",
    "a truncated frame",
    "not an object",
    "another request's id",
    "wrong types",
    "a duplicate answer",
    "a float id",
    "a boolean id",
    "silence after a partial frame",
]


@pytest.mark.parametrize("kind", FRAME_KINDS)
def test_hostile_frames_do_not_crash_or_fool_the_parent(meta: EnvMetadata, kind: str) -> None:
    s = scenario(ATTACK_STEP, ExpectedCall(tool="ping", expect_result="pong"))
    result, _ = run_round(hostile_env(HOSTILE_FRAMES, values={"kind": kind}), meta, [s], FORGE)
    assert result.status in ("crashed", "timeout"), (result.status, result.detail)
    if kind in ("a float id", "a boolean id"):  # equal to the request's id in Python, but not its id
        assert "answered request" in result.detail, result.detail
    report = judge(meta, [s], result, 1.0)
    assert not report.passed() and report.summary()
    json.dumps(result.output)
    result.model_dump_json()


def _decode_seconds_per_value() -> float:
    """The parent's cost of one value of a wide answer on this machine (the fastest of a few tries)."""
    n = 50_000
    body = b"[" + b"[]," * n + b"[]]"
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        decode(body, 100)
        best = min(best, time.perf_counter() - started)
    return best / n


def test_a_wide_answer_does_not_hold_the_parent_past_its_deadline(meta: EnvMetadata) -> None:
    limits = SandboxLimits(timeout_s=2, call_timeout_s=1, memory_mb=256, replay=False)
    bound = limits.timeout_s + SLACK_S
    values = min(4_900_000, int(3 * bound / _decode_seconds_per_value()))  # under MAX_NODES: decoded in full
    payload = """
        worker, req = worker_and_request()
        body = b"[" + b"[]," * values["n"] + b"[]]"
        frame = struct.pack(">I", len(body)) + body
        while frame:
            frame = frame[os.write(worker.wfd, frame):]
        os._exit(0)
    """
    started = time.monotonic()
    result = run_checks_in_sandbox(hostile_env(payload, values={"n": values}), meta, [scenario(ATTACK_STEP)], limits)
    elapsed = time.monotonic() - started
    assert result.status == "crashed", (result.status, result.detail)  # the answer came, and was refused
    assert elapsed < bound, (
        f"a {3 * values >> 20} MB answer held the parent {elapsed:.1f} s (limit {limits.timeout_s:g} s)"
    )


# ---- 9. resources ---------------------------------------------------------------------------

FILL_PAYLOAD = """
    chunk = b"x" * (1 << 20)
    held, fds = 0, []
    try:
        for i in range(values["files"]):
            if values["where"] == "memfd":
                fd = os.memfd_create(f"fill-{i}")
            else:
                fd = os.open(os.path.join(values["where"], f"fill-{i}"), os.O_WRONLY | os.O_CREAT, 0o600)
            for _ in range(values["mb_per_file"]):
                os.write(fd, chunk)
                held += 1
            if values["where"] == "memfd":
                fds.append(fd)  # a memfd lives as long as a descriptor does
            else:
                os.close(fd)
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["held_mb"] = held
"""


def test_the_private_tmp_is_bounded(meta: EnvMetadata) -> None:
    values = {"where": "/tmp", "files": 4, "mb_per_file": 32}
    _, out = run_attack(FILL_PAYLOAD, meta, values=values)
    assert "No space left on device" in out.get("error", ""), out
    assert out["held_mb"] <= ATTACK.tmpfs_mb, out


def test_unbounded_allocation_hits_the_memory_limit(meta: EnvMetadata) -> None:
    payload = """
        hoard = []
        while True:
            hoard.append(bytearray(10 * 1024 * 1024))
    """
    result, obs = run_round(hostile_env(payload), meta, [scenario(ATTACK_STEP)], ATTACK)
    assert result.status == "memory", (result.status, result.detail)
    assert obs.interrupted is not None and obs.interrupted.tool == "attack"


def test_the_log_and_the_rlimits_cannot_grow(meta: EnvMetadata) -> None:
    payload = """
        import resource
        attempt("fallocate the log", lambda: os.posix_fallocate(2, 0, 1 << 30))
        attempt("truncate the log", lambda: os.ftruncate(2, 1 << 30))
        attempt("write the log", lambda: [os.write(2, b"y" * (1 << 20)) for _ in range(100)])
        for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC"):
            which = getattr(resource, name)
            attempt("raise " + name, lambda w=which: resource.setrlimit(w, (resource.RLIM_INFINITY,) * 2))
        attempt("descriptors", lambda: [os.open("/dev/null", os.O_RDONLY) for _ in range(10_000)])
    """
    limits = SandboxLimits(timeout_s=10, memory_mb=256, fsize_mb=8, replay=False)
    result, out = run_attack(payload, meta, limits=limits)
    for key in ("fallocate the log", "truncate the log", "write the log"):
        assert "File too large" in out[key], out[key]
    for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC"):
        refused(out, "raise " + name, "ValueError", "PermissionError")
    assert "Too many open files" in out["descriptors"], out["descriptors"]
    assert len(result.stderr_tail) <= 4000


@pytest.mark.parametrize("where", ["/dev/shm", "/", "memfd"])
def test_memory_outside_the_address_space_limit_is_bounded(meta: EnvMetadata, where: str) -> None:
    values = {"where": where, "files": 8, "mb_per_file": 40}  # 320 MB > memory_mb + tmpfs_mb
    _, out = run_attack(FILL_PAYLOAD, meta, values=values)
    assert out["held_mb"] <= ATTACK.memory_mb + ATTACK.tmpfs_mb, f"{out['held_mb']} MB held in {where}: {out}"


# ---- 10. the kernel's other doors -----------------------------------------------------------

KERNEL_PAYLOAD = """
    import ctypes
    import fcntl
    libc = ctypes.CDLL(None, use_errno=True)

    def call(name, *args):
        result = getattr(libc, name)(*args)
        if result == -1:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return result

    NR = {"bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "keyctl": 250, "perf_event_open": 298}
    attempt("ptrace init", lambda: call("ptrace", 16, 1, 0, 0))  # PTRACE_ATTACH
    attempt("unshare user", lambda: call("unshare", 0x10000000))  # CLONE_NEWUSER
    attempt("mount", lambda: call("mount", b"none", b"/tmp", b"tmpfs", 0, None))
    attempt("chroot", lambda: os.chroot("/tmp"))
    attempt("setuid 0", lambda: os.setuid(0))
    attempt("hard link to the log", lambda: os.link("/proc/self/fd/2", "/tmp/log"))
    attempt("open /dev/tty", lambda: os.open("/dev/tty", os.O_RDWR))
    attempt("kernel log", lambda: open("/proc/kmsg", "rb").read(10))
    attempt("grow a pipe", lambda: fcntl.fcntl(os.pipe()[0], 1031, 1 << 20))  # F_SETPIPE_SZ: unaccounted memory
    if platform_machine == "x86_64":
        for name, nr in NR.items():
            attempt(name, lambda nr=nr: call("syscall", nr, 0, 0, 0, 0, 0))
    attempt("capabilities", lambda: [ln for ln in open("/proc/self/status") if ln.startswith("CapEff")][0].split()[1])
"""


def test_the_kernels_other_doors_are_shut(meta: EnvMetadata) -> None:
    payload = f"platform_machine = {platform.machine()!r}\n" + textwrap.dedent(KERNEL_PAYLOAD)
    _, out = run_attack(payload, meta)
    for key in ("ptrace init", "unshare user", "mount", "chroot"):
        refused(out, key, "PermissionError")
    refused(out, "setuid 0", "PermissionError", "OSError")
    refused(out, "hard link to the log", "PermissionError", "OSError", "FileNotFoundError")
    refused(out, "open /dev/tty", "OSError", "PermissionError", "FileNotFoundError")
    refused(out, "kernel log", "PermissionError")
    refused(out, "grow a pipe", "PermissionError")
    if platform.machine() == "x86_64":
        for key in ("bpf", "userfaultfd", "io_uring_setup", "keyctl", "perf_event_open"):
            refused(out, key, "PermissionError")
    assert out["capabilities"] == "OK '0000000000000000'"


def test_host_sysctls_cannot_be_written(meta: EnvMetadata) -> None:
    """Proved with the least effect possible: the current value is written back unchanged."""
    path = Path("/proc/sys/kernel/core_pattern")
    before = path.read_bytes()
    payload = """
        def write_back(path):
            current = open(path, "rb").read()
            fd = os.open(path, os.O_WRONLY)
            try:
                return os.write(fd, current)
            finally:
                os.close(fd)
        attempt("uid_map", lambda: open("/proc/self/uid_map").read().split())
        attempt("write core_pattern", lambda: write_back("/proc/sys/kernel/core_pattern"))
    """
    _, out = run_attack(payload, meta)
    assert path.read_bytes() == before  # the host is unchanged either way
    refused(out, "write core_pattern", "PermissionError", "OSError")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the payload carries x86-64 machine code")
def test_pid_1_of_the_sandbox_cannot_be_taken_over(meta: EnvMetadata) -> None:
    marker = f"envfactory-attack-{secrets.token_hex(8)}"
    values = {"code": f"import time\ntime.sleep(20)  # {marker}"}
    payload = (DATA / "pid1_takeover.py").read_text(encoding="utf-8")
    limits = SandboxLimits(timeout_s=6, call_timeout_s=1.5, memory_mb=256, replay=False)
    try:
        _, obs = run_round(hostile_env(payload, values=values), meta, [scenario(ATTACK_STEP)], limits)
        survivors: list[int] = []
        deadline = time.monotonic() + 2.0
        while not survivors and time.monotonic() < deadline:
            survivors = processes_with(marker)
            time.sleep(0.1)
        assert survivors == [], f"processes started in the sandbox outlived it: {survivors}"
        step = obs.scenarios[0].steps[0]
        assert step.ok and not str(step.result["take_over_pid1"]).startswith("OK"), step
    finally:
        for pid in processes_with(marker):  # ours: started by this test's payload
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# ---- 11. the runtime path: EnvPool -> SandboxedEnvironment -> Session --------------------------


@pytest.fixture
def runtime_env(tmp_path: Path, meta: EnvMetadata) -> Iterator[Callable[..., SandboxedEnvironment]]:
    """A project in tmp_path with an untrusted 'attack' folder; `make(payload, values)` loads it from EnvPool."""
    made: list[SandboxedEnvironment] = []

    def make(payload: str, values: dict[str, Any] | None = None) -> SandboxedEnvironment:
        folder = tmp_path / "envs" / "attack"
        (folder / "scenarios").mkdir(parents=True, exist_ok=True)
        (folder / "env.py").write_text(hostile_env(payload, values=values), encoding="utf-8")
        (folder / "metadata.json").write_text(meta.model_dump_json(indent=2), encoding="utf-8")
        (folder / "scenarios" / "default.json").write_text('{"hits": 0, "notes": []}', encoding="utf-8")
        settings = Settings(root=tmp_path, sandbox_memory_mb=256, sandbox_call_timeout_s=5.0, sandbox_workers=1)
        env = EnvPool(settings).get("attack")
        assert isinstance(env, SandboxedEnvironment)
        made.append(env)
        return env

    try:
        yield make
    finally:
        for env in made:
            env.pool.shutdown()


def test_the_runtime_path_contains_the_same_attacks(
    runtime_env: Callable[..., SandboxedEnvironment], planted: dict[str, Any], tmp_path: Path
) -> None:
    token = secrets.token_hex(8)
    outside = tmp_path / f"pwned-{token}.txt"
    project_file = ROOT / f"pwned-{token}.txt"
    payload = (
        SECRETS_PAYLOAD
        + WRITES_PAYLOAD
        + """
    import signal
    attempt("kill parent", lambda: os.kill(values["parent"], signal.SIGKILL))
    attempt("kill everyone", lambda: os.kill(-1, signal.SIGKILL))
    attempt("fork", os.fork)
    """
    )
    values = {
        "files": planted["files"],
        "system_files": ["/etc/passwd", str(ROOT / "README.md")],
        "parent": os.getpid(),
        "project": str(ROOT),
        "tmp_path": str(tmp_path),
        "targets": {"tmp_path": str(outside), "project": str(project_file)},
        "token": token,
    }
    cwd, environ = os.getcwd(), dict(os.environ)
    try:
        env = runtime_env(payload, values)
        session = Session.fork(env, "default")
        assert isinstance(session, SandboxedSession)
        rec = session.call("attack")
        assert rec.ok, rec.error
        out = rec.result
        assert out["real_builtins"] is True
        for name in planted["files"]:
            refused(out, f"read {name}", "FileNotFoundError", "PermissionError")
        for key in ("kill parent", "kill everyone", "fork"):
            refused(out, key, "PermissionError")
        assert "OPENAI_API_KEY" not in out["os.environ"]
        blob = json.dumps(rec.model_dump(mode="json"))
        assert planted["token"] not in blob and planted["env_token"] not in blob
        assert not outside.exists() and not project_file.exists()
        # the parent is untouched, and the session still serves
        assert os.getcwd() == cwd and dict(os.environ) == environ
        assert session.call("ping").result == "pong"
        assert session.dump()["hits"] == 0
    finally:
        outside.unlink(missing_ok=True)
        project_file.unlink(missing_ok=True)


@pytest.mark.parametrize("how", ["exit", "deep frame", "another id"])
def test_the_runtime_path_survives_a_dying_or_lying_worker(
    runtime_env: Callable[..., SandboxedEnvironment], how: str
) -> None:
    payload = """
        worker, req = worker_and_request()
        if values["how"] == "exit":
            os._exit(0)
        if values["how"] == "deep frame":
            os.write(worker.wfd, frame_of(b"[" * 200_000 + b"]" * 200_000))
        else:
            os.write(worker.wfd, frame_of({"id": req["id"] + 1, "ok": True, "result": "forged"}))
    """
    env = runtime_env(payload, {"how": how})
    session = Session.fork(env, "default")
    rec = session.call("attack")
    assert not rec.ok and rec.error is not None and rec.error.type == "internal_error", rec
    assert session.call("ping").result == "pong"  # restored on a fresh worker


def test_the_runtime_path_cannot_write_host_sysctls(runtime_env: Callable[..., SandboxedEnvironment]) -> None:
    payload = """
        attempt("writable", lambda: os.access("/proc/sys/kernel/core_pattern", os.W_OK))
    """
    env = runtime_env(payload)
    rec = Session.fork(env, "default").call("attack")
    assert rec.ok, rec.error
    assert rec.result["writable"] == "OK False", rec.result
