"""The sandbox for generated code: static rejections, real subprocesses, real limits, no mocks."""

from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from envfactory.env.metadata import EnvMetadata, load_metadata
from envfactory.env.sandbox import (
    SandboxLimits,
    parse_observations,
    static_check,
)
from envfactory.env.sandbox.policy import ALLOWED_DUNDER_ATTRS, FORBIDDEN_ATTRS
from envfactory.env.sandbox.wire import WireError, decode, encode
from envfactory.envgen.checks import ExpectedCall, TestScenario
from envfactory.envgen.checks.sandbox_round import SandboxResult, run_checks_in_sandbox
from tests.support.paths import ROOT

HOTELS = ROOT / "envs" / "hotels"
IS_ROOT = os.geteuid() == 0

# A normal run of the hotels code takes ~0.3 s. Limits are generous where a run ends by itself
# (a slow, loaded machine must not turn them into timeouts) and short only where a test has to
# wait for the limit to strike.
FAST = SandboxLimits(timeout_s=10, memory_mb=256)
HANG = SandboxLimits(timeout_s=2, memory_mb=256)  # for code that never finishes: the test waits ~2-3 s
CALL_HANG = SandboxLimits(timeout_s=8, call_timeout_s=0.5, memory_mb=256)  # one call hangs, the rest runs


@pytest.fixture(scope="module")
def hotels_code() -> str:
    return (HOTELS / "env.py").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def hotels_meta() -> EnvMetadata:
    return load_metadata(HOTELS / "metadata.json")


@pytest.fixture(scope="module")
def hotels_config() -> dict:
    return json.loads((HOTELS / "scenarios" / "default.json").read_text(encoding="utf-8"))


def scenario(*steps: ExpectedCall, config: dict | None = None, name: str = "s") -> TestScenario:
    return TestScenario(name=name, initial_config=config or {}, steps=list(steps))


def tiny_env(body: str, *, header: str = "") -> str:
    """A minimal valid environment named 'tiny' with one read tool `ping`, plus `body`."""
    return (
        textwrap.dedent(header)
        + textwrap.dedent(
            """
            from envfactory.env import Environment, State

            class TinyDB(State):
                hits: int = 0

            env = Environment("tiny", TinyDB, description="A tiny environment.", domain="utilities")

            @env.tool(kind="read")
            def ping(db: TinyDB) -> str:
                \"\"\"Answer pong.\"\"\"
                return "pong"
            """
        )
        + textwrap.dedent(body)
    )


TINY_META = EnvMetadata.model_validate(
    {
        "name": "tiny",
        "description": "A tiny environment.",
        "domain": "utilities",
        "tools": [{"name": "ping", "description": "Answer pong.", "kind": "read"}],
    }
)
PING = scenario(ExpectedCall(tool="ping"))


# ---- static check ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "line", "needle"),
    [
        ("import subprocess\n", 1, "'subprocess' is forbidden"),
        ("x = 1\nimport os\n", 2, "'os' is forbidden"),
        ("def f():\n    return open('/etc/passwd').read()\n", 2, "'open' is forbidden"),
        ("y = eval('1 + 1')\n", 1, "'eval' is forbidden"),
        ("m = __import__('os')\n", 1, "'__import__'"),
        ("classes = ().__class__.__subclasses__()\n", 1, "'__subclasses__'"),
        ("classes = ().__class__.__subclasses__()\n", 1, "'__class__'"),
        ("import uuid\n", 1, "nondeterministic"),
        ("import random\n", 1, "nondeterministic"),
        ("import time\n", 1, "nondeterministic"),
        ("from os import path\n", 1, "'os' is forbidden"),
        ("import importlib\n", 1, "'importlib' is forbidden"),
        ("import typing\nx = typing.sys\n", 2, "module 'sys'"),
        ("from typing import sys\n", 1, "module 'sys'"),
        ("import dataclasses\nb = dataclasses.builtins\n", 2, "module 'builtins'"),
        ("import collections\nx = collections._sys\n", 2, "private"),
        ("x = getattr(object, '__subclasses__')\n", 1, "getattr"),
        ("from envfactory.env import load_metadata\n", 1, "cannot be imported from envfactory.env"),
        ("from envfactory.env.pool import load_env_folder\n", 1, "'envfactory.env.pool' is forbidden"),
        ("import envfactory.env\n", 1, "use 'from envfactory.env import"),
        ("from .helpers import x\n", 1, "relative imports"),
        ("from typing import *\n", 1, "import names explicitly"),
        ("try:\n    x = 1\nexcept:\n    pass\n", 3, "bare 'except:'"),
        ("try:\n    x = 1\nexcept BaseException:\n    pass\n", 3, "BaseException"),
        ("def g():\n    yield 1\nf = g().gi_frame\n", 3, "'gi_frame'"),
        ("import string\nf = string.Formatter()\n", 2, "Formatter"),
        ("from pydantic import ImportString\n", 1, "ImportString"),
        ("from pydantic import PrivateAttr\n", 1, "PrivateAttr"),
        ("from envfactory.env import State\nState.dump = None\n", 2, "monkeypatching"),
        ("def f(:\n    pass\n", 1, "syntax error"),
        ("x = compile('1', 'f', 'eval')\n", 1, "'compile' is forbidden"),
        ("g = globals()\n", 1, "'globals' is forbidden"),
    ],
)
def test_static_check_rejects_with_line_and_reason(code: str, line: int, needle: str) -> None:
    problems = static_check(code)
    assert problems, f"not rejected: {code!r}"
    hits = [p for p in problems if needle in p.message]
    assert hits, [p.message for p in problems]
    assert hits[0].line == line


def test_static_check_rejects_env_session_and_file_helpers() -> None:
    code = tiny_env(
        """
        @env.tool(kind="read")
        def peek(db: TinyDB) -> dict:
            \"\"\"Peek.\"\"\"
            db.dump_json("/tmp/x.json")
            return env.session("/etc/some.json").dump()
        """
    )
    messages = " | ".join(p.message for p in static_check(code))
    assert "dump_json" in messages
    assert "'env.session' is forbidden" in messages
    # pydantic's v1 API reads a file too (a reviewer's generated code read one unflagged; the OS wall held)
    leak = tiny_env(
        """
        import pydantic

        @env.tool(kind="read")
        def peek(db: TinyDB) -> dict:
            \"\"\"Peek.\"\"\"
            return pydantic.BaseModel.parse_file("/etc/hostname").model_dump()
        """
    )
    assert any("'parse_file' is forbidden: it reads files" in p.message for p in static_check(leak))


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "envs").iterdir() if (p / "env.py").is_file()))
def test_static_check_accepts_every_bundled_environment(name: str) -> None:
    assert static_check((ROOT / "envs" / name / "env.py").read_text(encoding="utf-8")) == []


def test_static_check_accepts_ordinary_code() -> None:
    code = tiny_env(
        """
        import re
        from collections.abc import Mapping
        from dataclasses import dataclass

        from envfactory.env import ToolError

        _WORD = re.compile(r"\\w+")

        class Oops(ToolError):
            def __init__(self, what: str) -> None:
                super().__init__(f"oops: {what}")

        @dataclass
        class Pair:
            a: int
            b: int

        @env.tool(kind="read")
        def words(db: TinyDB, input: str, field: str = "hits") -> list[str]:
            \"\"\"Split words.

            Args:
                input: Text to split (a parameter may shadow a builtin's name).
                field: A state field to read.
            \"\"\"
            if not isinstance(db, Mapping) and getattr(db, field) < 0:
                raise Oops(type(db).__name__)
            return _WORD.findall(input)
        """
    )
    assert static_check(code) == []


def test_a_rejected_file_never_reaches_a_subprocess(hotels_meta: EnvMetadata) -> None:
    started = time.monotonic()
    result = run_checks_in_sandbox("import os\nos.system('true')\n", hotels_meta, [PING], FAST)
    assert result.status == "static_rejected"
    assert result.exit_code is None and result.output is None
    assert result.problems[0].line == 1
    assert time.monotonic() - started < 0.5


# ---- a normal run ---------------------------------------------------------------------------


def test_good_code_runs_and_reports_raw_observations(
    hotels_code: str, hotels_meta: EnvMetadata, hotels_config: dict
) -> None:
    s = scenario(
        ExpectedCall(tool="get_hotel", args={"hotel_id": "HT-LIS-01"}),
        ExpectedCall(tool="cancel_booking", args={"booking_id": "BK-0001"}, expect_state={"bookings": {}}),
        config=hotels_config,
    )
    result = run_checks_in_sandbox(hotels_code, hotels_meta, [s], FAST)
    assert result.status == "ok", result.stderr_tail
    obs = parse_observations(result.output)
    assert obs is not None and obs.import_error is None and not obs.tampering
    assert obs.derived_metadata is not None and obs.derived_metadata["name"] == "hotels"
    # every library that evaluates annotation strings got the restricted eval (see the gadget test)
    assert set(obs.isolation["sealed_evaluators"]) == {
        "typing",
        "typing_extensions",
        "inspect",
        "pydantic._internal._namespace_utils",
    }
    steps = obs.scenarios[0].steps
    assert steps[0].ok and steps[0].result["name"] == "Casa do Rio"
    assert steps[0].state is None  # state is dumped only where a check reads it
    assert steps[1].state is not None and steps[1].state["bookings"]["BK-0001"]["status"] == "cancelled"
    # the child got no expectations: nothing to compare with, only calls
    assert "expect_state" not in json.dumps(result.output)


def test_child_output_noise_does_not_corrupt_the_protocol() -> None:
    code = tiny_env(
        """
        print('{"status": "forged", "pid": 0}')
        print("x" * 100_000)

        @env.tool(kind="read")
        def shout(db: TinyDB) -> str:
            \"\"\"Print a lot, then answer.\"\"\"
            for _ in range(1000):
                print("noise", "{", "}")
            return "done"
        """
    )
    meta = TINY_META.model_copy(
        update={"tools": [*TINY_META.tools, TINY_META.tools[0].model_copy(update={"name": "shout"})]}
    )
    result = run_checks_in_sandbox(code, meta, [scenario(ExpectedCall(tool="shout"))], FAST)
    assert result.status == "ok"
    obs = parse_observations(result.output)
    assert obs is not None and obs.pid != 0
    assert obs.scenarios[0].steps[0].result == "done"
    assert "noise" in result.stderr_tail  # output goes to the log, tail kept for diagnosis


def test_a_fresh_process_per_round() -> None:
    code = tiny_env(
        """
        CALLS = [0]

        @env.tool(kind="read")
        def count(db: TinyDB) -> int:
            \"\"\"How many times this tool ran in this process.\"\"\"
            CALLS[0] += 1
            return CALLS[0]
        """
    )
    meta = TINY_META.model_copy(
        update={"tools": [*TINY_META.tools, TINY_META.tools[0].model_copy(update={"name": "count"})]}
    )
    s = scenario(ExpectedCall(tool="count"), ExpectedCall(tool="count"))
    first = parse_observations(run_checks_in_sandbox(code, meta, [s], FAST).output)
    second = parse_observations(run_checks_in_sandbox(code, meta, [s], FAST).output)
    assert first is not None and second is not None
    assert [st.result for st in first.scenarios[0].steps] == [1, 2]
    assert [st.result for st in second.scenarios[0].steps] == [1, 2]  # no module kept from round one
    assert first.pid != second.pid != os.getpid()


# ---- limits ---------------------------------------------------------------------------------


def _bounded(result: SandboxResult, limits: SandboxLimits, started: float) -> None:
    elapsed = time.monotonic() - started
    assert elapsed < limits.timeout_s + 2.0, elapsed


def test_infinite_loop_at_import_times_out() -> None:
    started = time.monotonic()
    result = run_checks_in_sandbox(tiny_env("while True:\n    pass\n"), TINY_META, [PING], HANG)
    _bounded(result, HANG, started)
    assert result.status == "timeout"
    obs = parse_observations(result.output)
    assert obs is not None and obs.interrupted is not None and obs.interrupted.phase == "import"


def test_infinite_loop_in_a_tool_times_out_naming_the_tool() -> None:
    code = tiny_env(
        """
        @env.tool(kind="read")
        def spin(db: TinyDB) -> int:
            \"\"\"Never returns.\"\"\"
            n = 0
            while True:
                n += 1
        """
    )
    meta = TINY_META.model_copy(
        update={"tools": [*TINY_META.tools, TINY_META.tools[0].model_copy(update={"name": "spin"})]}
    )
    hang = scenario(ExpectedCall(tool="ping"), ExpectedCall(tool="spin"), ExpectedCall(tool="ping"), name="hang")
    again = scenario(ExpectedCall(tool="spin"), name="again")
    after = scenario(ExpectedCall(tool="ping"), name="after")
    started = time.monotonic()
    result = run_checks_in_sandbox(code, meta, [hang, again, after], CALL_HANG)
    _bounded(result, CALL_HANG, started)
    assert result.status == "timeout" and "per-call limit of 0.5 s: spin" in result.detail
    obs = parse_observations(result.output)
    assert obs is not None and obs.interrupted is None and obs.hung_tools == ["spin"]
    first, second, third = obs.scenarios
    assert [st.error_type for st in first.steps] == [None, "timeout"]  # what ran before the hang is kept
    assert first.steps[0].result == "pong" and first.aborted and not first.completed
    assert second.steps == [] and "hung earlier" in (second.aborted or "")  # no second wait on a known hang
    assert third.completed and third.steps[0].result == "pong"  # the run went on after the hang


def test_a_hang_that_swallows_the_call_limit_still_hits_the_deadline() -> None:
    code = tiny_env(
        """
        @env.tool(kind="read")
        def stubborn(db: TinyDB) -> int:
            \"\"\"Catches everything it can, forever.\"\"\"
            while True:
                try:
                    while True:
                        pass
                finally:
                    continue
        """
    )
    meta = TINY_META.model_copy(
        update={"tools": [*TINY_META.tools, TINY_META.tools[0].model_copy(update={"name": "stubborn"})]}
    )
    started = time.monotonic()
    result = run_checks_in_sandbox(code, meta, [scenario(ExpectedCall(tool="stubborn"))], HANG)
    _bounded(result, HANG, started)
    assert result.status == "timeout"


def test_a_hang_in_native_code_is_killed_by_the_parent() -> None:
    # a C loop never returns to the interpreter: only the parent's clock (a kill) can end it
    code = tiny_env("total = sum(range(10**13))\n")
    started = time.monotonic()
    result = run_checks_in_sandbox(code, TINY_META, [PING], HANG)
    _bounded(result, HANG, started)
    assert result.status == "timeout"
    obs = parse_observations(result.output)
    assert obs is not None and obs.interrupted is not None and obs.interrupted.phase == "import"


def test_unbounded_allocation_at_import_hits_the_memory_limit() -> None:
    started = time.monotonic()
    code = tiny_env("x = []\nwhile True:\n    x.append('a' * 10**6)\n")
    result = run_checks_in_sandbox(code, TINY_META, [PING], FAST)
    _bounded(result, FAST, started)
    assert result.status == "memory", (result.detail, result.stderr_tail)
    assert "256 MB" in result.detail
    obs = parse_observations(result.output)
    assert obs is not None  # the parent's own record: there is no child report to lose
    assert obs.isolation["rlimits"]["as_bytes"] > 256 * 1024 * 1024
    assert obs.interrupted is not None and obs.interrupted.phase == "import"


def test_unbounded_allocation_in_a_tool_hits_the_memory_limit() -> None:
    code = tiny_env(
        """
        @env.tool(kind="read")
        def hog(db: TinyDB) -> int:
            \"\"\"Allocate without end.\"\"\"
            x = []
            while True:
                x.append("a" * 10**6)
        """
    )
    meta = TINY_META.model_copy(
        update={"tools": [*TINY_META.tools, TINY_META.tools[0].model_copy(update={"name": "hog"})]}
    )
    result = run_checks_in_sandbox(code, meta, [scenario(ExpectedCall(tool="hog"))], FAST)
    assert result.status == "memory"
    obs = parse_observations(result.output)
    assert obs is not None and obs.interrupted is not None and obs.interrupted.tool == "hog"


def test_exiting_or_raising_base_exceptions_at_import_is_an_import_failure() -> None:
    result = run_checks_in_sandbox(tiny_env("raise SystemExit(0)\n"), TINY_META, [PING], FAST)
    assert result.status == "ok"
    obs = parse_observations(result.output)
    assert obs is not None and obs.import_error is not None and "SystemExit" in obs.import_error


def test_exiting_from_a_tool_is_reported_not_obeyed() -> None:
    code = tiny_env(
        """
        @env.tool(kind="read")
        def bail(db: TinyDB) -> int:
            \"\"\"Exit the interpreter with the memory code, hoping to be misjudged.\"\"\"
            raise SystemExit(71)
        """
    )
    meta = TINY_META.model_copy(
        update={"tools": [*TINY_META.tools, TINY_META.tools[0].model_copy(update={"name": "bail"})]}
    )
    s = scenario(ExpectedCall(tool="bail"), ExpectedCall(tool="ping"))
    result = run_checks_in_sandbox(code, meta, [s, scenario(ExpectedCall(tool="ping"))], FAST)
    assert result.status == "ok"
    obs = parse_observations(result.output)
    assert obs is not None
    first, second = obs.scenarios
    assert first.steps[0].error_type == "internal_error" and "SystemExit" in (first.steps[0].error_message or "")
    assert first.aborted and second.completed


# ---- isolation ------------------------------------------------------------------------------


def test_isolation_report_bubblewrap_seccomp_nobody_no_new_privs(hotels_code: str, hotels_meta: EnvMetadata) -> None:
    result = run_checks_in_sandbox(hotels_code, hotels_meta, [PING.model_copy(update={"steps": []})], FAST)
    obs = parse_observations(result.output)
    assert obs is not None
    iso = obs.isolation
    assert iso["wall"] == "bubblewrap" and iso["wrapped"] is True
    assert iso["seccomp_mode"] == 2 and iso["seccomp_filters"] >= 2  # bwrap's and the worker's own
    assert iso["no_new_privs"] is True and iso["socket_blocked"] is True
    assert iso["uid"] == 65534 and int(iso["cap_eff"], 16) == 0
    # the root it sees holds nothing but what the worker needs: no /home, no project, no /etc/passwd
    # (the interpreter's folders are bound where they are, so their top folder shows; it holds only them)
    interpreter_tops = {Path(p).resolve().parts[1] for p in (sys.prefix, sys.base_prefix, sys.executable)}
    allowed = {"dev", "etc", "lib", "lib32", "lib64", "opt", "proc", "root", "tmp", "usr"} | interpreter_tops
    assert set(iso["root_entries"]) <= allowed
    assert {"as_bytes", "cpu_s", "nproc", "nofile", "fsize_bytes"} <= set(iso["rlimits"])


def _run_child_snippet(snippet: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(snippet)], capture_output=True, text=True, timeout=30, cwd=ROOT
    )


def test_socket_blocker_refuses_every_route() -> None:
    proc = _run_child_snippet(
        """
        from envfactory.env.sandbox.isolation import block_network
        block_network()
        import socket, _socket
        for attempt in (
            lambda: socket.socket(),
            lambda: socket.create_connection(("127.0.0.1", 9)),
            lambda: socket.getaddrinfo("example.com", 80),
            lambda: _socket.socket(),
        ):
            try:
                attempt()
            except PermissionError as e:
                print("blocked:", e)
            else:
                print("OPEN")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("blocked: network access is disabled") == 4 and "OPEN" not in proc.stdout


@pytest.mark.skipif(not IS_ROOT, reason="unshare(CLONE_NEWNET) needs root")
def test_network_namespace_cuts_even_loopback() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted: list[bool] = []

    def accept() -> None:
        server.settimeout(10)
        try:
            conn, _ = server.accept()
            accepted.append(True)
            conn.close()
        except OSError:
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    snippet = f"""
        import socket, sys
        from envfactory.env.sandbox.isolation import enter_network_namespace
        if sys.argv[-1] == "ns":
            print("netns", enter_network_namespace())
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
            print("CONNECTED")
        except OSError as e:
            print("refused", e)
        """
    inside = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(snippet), "ns"], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert "netns (True, None)" in inside.stdout, inside.stderr
    assert "refused" in inside.stdout and "CONNECTED" not in inside.stdout
    # control: the same connection without the namespace works, so the refusal was the namespace
    outside = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(snippet), "plain"], capture_output=True, text=True, timeout=30, cwd=ROOT
    )
    assert "CONNECTED" in outside.stdout, outside.stderr
    thread.join(timeout=5)
    server.close()
    assert accepted == [True]


def test_runtime_guards_stop_what_the_static_check_cannot_see() -> None:
    code = tiny_env(
        """
        import typing

        @env.tool(kind="read")
        def sneaky(db: TinyDB, name: str) -> str:
            \"\"\"Compute an attribute name and fetch it.

            Args:
                name: The attribute.
            \"\"\"
            return str(getattr(typing, name))
        """
    )
    meta = TINY_META.model_copy(
        update={
            "tools": [
                *TINY_META.tools,
                TINY_META.tools[0].model_copy(
                    update={
                        "name": "sneaky",
                        "description": "Compute an attribute name and fetch it.",
                        "input_schema": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}},
                            "required": ["name"],
                        },
                    }
                ),
            ]
        }
    )
    assert static_check(code) == []
    steps = [
        ExpectedCall(tool="sneaky", args={"name": "sys"}),
        ExpectedCall(tool="sneaky", args={"name": "_" + "_dict__"}),
        ExpectedCall(tool="sneaky", args={"name": "Any"}),
    ]
    result = run_checks_in_sandbox(code, meta, [scenario(*steps)], FAST)
    obs = parse_observations(result.output)
    assert obs is not None
    first, second, third = obs.scenarios[0].steps
    assert first.error_type == "internal_error" and "SandboxViolation" in (first.error_message or "")
    assert second.error_type == "internal_error" and "SandboxViolation" in (second.error_message or "")
    assert third.ok and third.result == "typing.Any"


def test_monkeypatching_the_runtime_through_an_alias_is_detected() -> None:
    code = tiny_env(
        """
        from envfactory.env import State as _S

        Alias = _S
        Alias.dump = lambda self: {}
        """
    )
    assert static_check(code) == []  # the alias hides it from the AST check...
    obs = parse_observations(run_checks_in_sandbox(code, TINY_META, [PING], FAST).output)
    assert obs is not None
    assert any("envfactory.env.state.State.dump" in t for t in obs.tampering)  # ...not from the snapshot


@pytest.mark.parametrize(
    "gadget",
    [
        # a dataclass made here gets __module__ 'types'; pydantic then evaluates its string annotation
        # in that trusted module's namespace, whose builtins are the real ones (found while testing)
        "X = dataclasses.make_dataclass('X', [('a', \"__import__('os').getcwd()\")])\npydantic.TypeAdapter(X)\n",
        "class M(pydantic.BaseModel):\n    a: \"__import__('os').getcwd()\" = 1\n",
        "pydantic.TypeAdapter(\"__import__('os').getcwd()\")\n",
    ],
)
def test_annotation_strings_are_evaluated_with_restricted_builtins(gadget: str) -> None:
    code = tiny_env(gadget, header="import dataclasses\nimport pydantic\n")
    assert static_check(code) == []
    obs = parse_observations(run_checks_in_sandbox(code, TINY_META, [PING], FAST).output)
    assert obs is not None and obs.import_error is not None
    assert "SandboxViolation: import of 'os' is forbidden" in obs.import_error


def test_a_state_model_may_not_redefine_the_runtime_machinery() -> None:
    code = tiny_env(
        """
        class FakeDB(TinyDB):
            def dump(self) -> dict:
                return {}

        env.state_model = FakeDB
        """
    )
    obs = parse_observations(run_checks_in_sandbox(code, TINY_META, [PING], FAST).output)
    assert obs is not None
    assert any("redefines State.dump" in p for p in obs.env_problems)


def test_binds_below_tmp_show_on_top_of_the_private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter or venv under /tmp (a clone in /tmp/x) stays visible: bwrap mounts in order, so the
    private /tmp comes before every read-only bind, and one below /tmp lands on top of it."""
    from envfactory.env.sandbox import wall

    below = str(tmp_path / "venv")
    assert below.startswith("/tmp/")
    real = wall._ro_binds
    monkeypatch.setattr(wall, "_ro_binds", lambda: [*real(), (below, below)])
    args = wall.bwrap_args("bwrap", tmpfs_mb=16, seccomp_fd=None)
    tmp_at = next(  # `--tmpfs /tmp`, or (started by root) `--bind <staged tmp> /tmp`
        i
        for i in range(len(args) - 2)
        if (args[i] == "--tmpfs" and args[i + 1] == "/tmp") or (args[i] == "--bind" and args[i + 2] == "/tmp")
    )
    binds = [i for i in range(len(args) - 2) if args[i] == "--ro-bind"]
    assert any(args[i + 2] == below for i in binds)
    assert all(tmp_at < i for i in binds)


# ---- names the AST holds as plain strings: class patterns, captures, `global` ------------------------

MATCH_FORMS = [
    # the review's gadget: the real builtins through a trusted function's globals, read by the match machinery
    (
        "import json\nmatch json.JSONEncoder():\n    case object(__init__=object(__globals__=g)):\n        b = g\n",
        "'__globals__'",
    ),
    ("def f(x):\n    match x:\n        case object(__class__=c):\n            return c\n", "'__class__'"),
    ("def f(x):\n    match x:\n        case object(_secret=s):\n            return s\n", "private"),
    ("def f(g):\n    match g:\n        case object(gi_frame=fr):\n            return fr\n", "'gi_frame'"),
    # nested under a sequence, a mapping, `|` and `as`: every MatchClass is checked, wherever it sits
    ("def f(x):\n    match x:\n        case [1, object(__dict__=d)]:\n            return d\n", "'__dict__'"),
    ("def f(x):\n    match x:\n        case {'k': object(tb_frame=t)}:\n            return t\n", "'tb_frame'"),
    ("def f(x):\n    match x:\n        case int() | object(f_globals=g):\n            return g\n", "'f_globals'"),
    (
        "def f(x):\n    match x:\n        case (object(__subclasses__=s) as y):\n            return s, y\n",
        "__subclasses__",
    ),
    # a class pattern matched against an imported module reads module members: the rule of `typing.sys`
    ("import typing\nmatch typing:\n    case object(sys=s):\n        pass\n", "module 'sys'"),
    ("import typing\nmatch typing:\n    case str() | object(sys=s):\n        pass\n", "module 'sys'"),
    # names a pattern or `global` binds: the rule of dunder names
    ("def f(x):\n    match x:\n        case __builtins__:\n            return 1\n", "'__builtins__'"),
    ("def f(x):\n    match x:\n        case [*__builtins__]:\n            return 1\n", "'__builtins__'"),
    ("def f(x):\n    match x:\n        case {**__builtins__}:\n            return 1\n", "'__builtins__'"),
    ("def f():\n    global __builtins__\n    return 1\n", "'__builtins__'"),
    # a positional class pattern reads the attributes `__match_args__` names, and `__instancecheck__` makes any
    # subject match: neither may be defined (a def's name is a plain string too), nor a metaclass given
    (
        "class M(type):\n    def __instancecheck__(cls, o):\n        return True\n"
        "    @property\n    def __match_args__(cls):\n        return ('__globals__',)\n",
        "defining '__instancecheck__'",
    ),
    (
        "class M(type):\n    @property\n    def __match_args__(cls):\n        return ('x',)\n",
        "defining '__match_args__'",
    ),
    ("class X(metaclass=type):\n    pass\n", "metaclass"),
    ("class X:\n    def __getattr__(self, name):\n        return name\n", "defining '__getattr__'"),
    # a module used as a value leaves the attribute rule's sight: aliased, listed, matched, passed
    ("import typing\nt = typing\nx = t.sys\n", "`module.member`"),
    ("import typing\nmatch [typing]:\n    case [object(sys=s)]:\n        pass\n", "`module.member`"),
    ("import typing\nmatch {'m': typing}:\n    case {'m': object(sys=s)}:\n        pass\n", "`module.member`"),
    ("import collections.abc\ndef f(m=collections.abc):\n    return m\n", "`module.member`"),
]


@pytest.mark.parametrize(("code", "needle"), MATCH_FORMS)
def test_static_check_sees_attribute_names_held_as_plain_strings(code: str, needle: str) -> None:
    problems = static_check(code)
    assert any(needle in p.message for p in problems), [p.message for p in problems]


ATTRIBUTE_NAMES = sorted(
    {*FORBIDDEN_ATTRS, *ALLOWED_DUNDER_ATTRS, "__globals__", "__class__", "__dict__", "__code__", "_private"}
    | {"x", "name", "value", "items", "real", "model_dump", "__init_subclass__"}
)


@pytest.mark.parametrize("attr", ATTRIBUTE_NAMES)
def test_a_class_pattern_attribute_is_judged_as_the_attribute_read(attr: str) -> None:
    """`case object(attr=v)` reads `subject.attr`: refused exactly when `subject.attr` is (both directions)."""
    read = f"def f(subject):\n    return subject.{attr}\n"
    pattern = f"def f(subject):\n    match subject:\n        case object({attr}=v):\n            return v\n"
    assert ast.parse(pattern).body[0].body[0].cases[0].pattern.kwd_attrs == [attr]  # type: ignore[attr-defined]
    assert bool(static_check(read)) == bool(static_check(pattern)), (static_check(read), static_check(pattern))


def test_static_check_accepts_ordinary_match_statements() -> None:
    code = tiny_env(
        """
        from dataclasses import dataclass

        @dataclass
        class Point:
            x: int
            y: int

        def where(p: object) -> str:
            match p:
                case Point(x=0, y=0):
                    return "origin"
                case Point(x=0) | Point(y=0) as axis:
                    return f"axis {axis}"
                case {"x": x, **rest}:
                    return f"{x} {rest}"
                case [first, *others]:
                    return f"{first} {others}"
                case str() as text:
                    return text
                case _:
                    return "elsewhere"
        """
    )
    assert static_check(code) == []


# ---- a lone surrogate in a worker's answer ----------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        {"id": 1, "ok": True, "result": "a\ud800b"},
        {"id": 1, "ok": True, "result": ["x", {"k": "\udfff"}]},
        {"id": 1, "ok": True, "result": {"\udc00": 1}},  # a key
        {"id": 1, "ok": True, "result": "\ud83d"},  # half a pair
        {"id": 1, "ok": True, "result": "\ude00\ud83d"},  # a pair in the wrong order
    ],
)
def test_the_parent_refuses_an_answer_holding_a_lone_surrogate(answer: dict) -> None:
    body = encode(answer)[4:]
    with pytest.raises(WireError) as caught:
        decode(body, 100)
    assert caught.value.kind == "malformed" and "lone surrogate" in str(caught.value)


def test_the_parent_takes_answers_with_any_character_of_unicode() -> None:
    answer = {"id": 1, "ok": True, "result": {"e\u0301": "caf\u00e9 \U0001f600 \uffff", "esc": "\\ud800 \\uD800"}}
    assert decode(encode(answer)[4:], 100) == answer


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_the_parent_refuses_an_answer_holding_a_number_json_has_not(constant: str) -> None:
    """Python's json reads NaN and Infinity; JSON has no such numbers, and a NaN in a state never equals itself."""
    with pytest.raises(WireError) as caught:
        decode(b'{"id": 1, "ok": true, "result": ' + constant.encode() + b"}", 100)
    assert caught.value.kind == "malformed" and "is not a JSON number" in str(caught.value)


@pytest.mark.skipif(not IS_ROOT or not shutil.which("setpriv"), reason="host uids are only handed out by root")
def test_a_host_uid_a_live_process_holds_is_not_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a parent's first `_UID_SLOTS` workers, a slot is reused only where no process holds its uid: a worker
    that outlives a thousand others keeps its uid to itself."""
    import itertools

    from envfactory.env.sandbox import wall

    base = wall._UID_BASE + (os.getpid() % 1_000_000) * wall._UID_SLOTS
    monkeypatch.setattr(wall, "_uid_counter", itertools.count(wall._UID_SLOTS * 3))  # wrapped: slot 0 comes next
    monkeypatch.setattr(wall, "_uid_handed", {})
    holder = subprocess.Popen(["setpriv", f"--reuid={base}", f"--regid={base}", "--clear-groups", "sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while base not in wall._uids_in_use(base, base + 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert base in wall._uids_in_use(base, base + 1)
        first, second = wall._host_uid(), wall._host_uid()
        assert first == base + 1 and second == base + 2  # slot 0 is held; 1 and 2 are free, and now handed out
        monkeypatch.setattr(wall, "_uid_counter", itertools.count(wall._UID_SLOTS * 4 + 1))
        assert wall._host_uid() == base + 3  # slot 1 was handed out a moment ago: its worker may not be up yet
    finally:
        holder.kill()
        holder.wait()
    monkeypatch.setattr(wall, "_uid_counter", itertools.count(wall._UID_SLOTS * 5))
    assert wall._host_uid() == base  # free again
    # a reservation lasts while a worker starts, not a minute: a process starting workers fast (a worker per
    # session) handed out its thousand and then refused every start though none of them was running
    monkeypatch.setattr(wall, "_uid_handed", dict.fromkeys(range(base, base + wall._UID_SLOTS), time.monotonic()))
    with pytest.raises(wall.SandboxUnavailable, match="running worker or one starting"):
        wall._host_uid()  # a thousand starting at once: none free
    assert wall._UID_HELD_S <= 10
    monkeypatch.setattr(wall, "_UID_HELD_S", 0.05)
    time.sleep(0.1)
    assert base <= wall._host_uid() < base + wall._UID_SLOTS  # started long enough ago: free unless seen running
