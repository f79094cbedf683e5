"""Running untrusted generated environment code: a static check, then a fresh, limited subprocess.

DESIGN: "Generated code is untrusted: it is checked statically (AST: allowed imports only, no
exec/eval/open/subprocess/socket) and executed in a subprocess with time, memory and no-network
limits; a crash or hang there is a validation error, never a crash of the run."

Two layers, because neither is enough alone:

1. `static_check` is a *policy*: it rejects code that reaches for the system (imports outside an
   allow-list, exec/eval/open, dunder and private attribute access, module handles such as
   `typing.sys`) with a line number and a reason the Code Agent can act on. In-process Python
   sandboxing is known to be leaky, so this is not the containment.
2. `run_checks_in_sandbox` is the *containment*: every call starts a new interpreter
   (`python -m envfactory.env.sandbox_child`) that applies resource limits, leaves the network
   namespace, drops root, blocks sockets, runs the code with guarded builtins and reports raw
   observations to a result file. The parent enforces the wall clock and never raises for bad code.

The child only gets the calls to make (tool, arguments, initial config), never the expected
results: the judge (`envfactory.env.checks`) compares in this process, so generated code cannot
read the answers it is checked against.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envfactory.env.metadata import EnvMetadata

if TYPE_CHECKING:
    from envfactory.config import Settings
    from envfactory.env.checks import TestScenario

# ---- the policy -----------------------------------------------------------------------------

# Deterministic, side-effect-free modules a tool module may import. Exact names: a submodule is
# allowed only if listed (json.decoder is not: nobody needs it, and every extra module is surface).
ALLOWED_MODULES: frozenset[str] = frozenset(
    {
        "__future__",
        "abc",
        "bisect",
        "calendar",
        "collections",
        "collections.abc",
        "copy",
        "dataclasses",
        "datetime",
        "decimal",
        "enum",
        "fractions",
        "functools",
        "heapq",
        "itertools",
        "json",
        "math",
        "numbers",
        "pydantic",
        "re",
        "statistics",
        "string",
        "textwrap",
        "typing",
        "typing_extensions",
        "envfactory.env",
        "envfactory.errors",
    }
)

# What a tool module needs from the runtime. Not all of `envfactory.env`: `load_metadata` reads
# files and `Session` would let the code run (and fake) its own checks.
ENVFACTORY_NAMES: dict[str, frozenset[str]] = {
    "envfactory.env": frozenset({"Environment", "Record", "State", "ToolError", "NotFoundError", "ConflictError"}),
    "envfactory.errors": frozenset({"ToolError", "NotFoundError", "ConflictError"}),
}

_NONDETERMINISTIC = "is nondeterministic: new ids come from db.new_id(prefix), 'now' from db.now()"
_SYSTEM = "gives access to the system (processes, files, network or the interpreter)"
MODULE_REASONS: dict[str, str] = {
    **dict.fromkeys(("uuid", "random", "secrets", "time"), _NONDETERMINISTIC),
    **dict.fromkeys(
        (
            "os",
            "sys",
            "subprocess",
            "socket",
            "ssl",
            "importlib",
            "ctypes",
            "threading",
            "multiprocessing",
            "asyncio",
            "concurrent",
            "signal",
            "io",
            "pathlib",
            "shutil",
            "tempfile",
            "glob",
            "builtins",
            "inspect",
            "gc",
            "pickle",
            "marshal",
            "http",
            "urllib",
            "requests",
            "httpx",
            "sqlite3",
        ),
        _SYSTEM,
    ),
    "operator": "bypasses the attribute guards (attrgetter, methodcaller)",
    "types": "builds functions and modules from code objects",
}

# Builtins that run code, touch files or the interpreter's namespaces. The child's builtins lack them too.
FORBIDDEN_BUILTINS: dict[str, str] = {
    "exec": "runs arbitrary code",
    "eval": "runs arbitrary code",
    "compile": "builds code objects",
    "open": "reads and writes files (tools work on the state only)",
    "__import__": "imports bypassing the allow-list",
    "globals": "exposes the module namespace",
    "locals": "exposes the frame namespace",
    "vars": "exposes object namespaces",
    "input": "reads the terminal",
    "breakpoint": "starts a debugger",
    "help": "starts the interactive help",
    "exit": "stops the interpreter",
    "quit": "stops the interpreter",
}

# Dunder attributes that are plain data or needed by ordinary code: `super().__init__(...)` in a
# custom exception, `type(x).__name__` in a message. Every other dunder (__class__, __globals__,
# __subclasses__, __dict__, __builtins__...) is the classic route out of a Python sandbox.
ALLOWED_DUNDER_ATTRS: frozenset[str] = frozenset({"__init__", "__name__", "__doc__"})
ALLOWED_DUNDER_NAMES: frozenset[str] = frozenset({"__name__", "__doc__", "__all__", "__slots__"})

_FRAME = "reaches interpreter frames or code objects (and through them every module's globals)"
_EVAL = "evaluates strings as code (annotations are resolved with unrestricted builtins)"
FORBIDDEN_ATTRS: dict[str, str] = {
    **dict.fromkeys(
        (
            "gi_frame",
            "gi_code",
            "gi_yieldfrom",
            "cr_frame",
            "cr_code",
            "cr_await",
            "ag_frame",
            "ag_code",
            "ag_await",
            "f_back",
            "f_globals",
            "f_locals",
            "f_builtins",
            "f_code",
            "tb_frame",
            "tb_next",
        ),
        _FRAME,
    ),
    **dict.fromkeys(("get_type_hints", "ForwardRef", "model_rebuild", "get_annotations"), _EVAL),
    "Formatter": "string.Formatter.get_field walks attributes with unrestricted getattr",
    "get_field": "string.Formatter.get_field walks attributes with unrestricted getattr",
    "ImportString": "imports arbitrary modules while validating",
    "PrivateAttr": "private attributes are state the dump (and so every check) cannot see",
    "model_serializer": "a custom serializer makes the state dump disagree with the state",
    "field_serializer": "a custom serializer makes the state dump disagree with the state",
    "PlainSerializer": "a custom serializer makes the state dump disagree with the state",
    "WrapSerializer": "a custom serializer makes the state dump disagree with the state",
    "dump_json": "writes files (tools work on the state only)",
    "load_json": "reads files (tools work on the state only)",
    "resolve_config": "reads files (tools work on the state only)",
}

# What module-level code may use of `env = Environment(...)`: registering tools and its labels.
# The rest (sessions, configs, rollback...) is the runtime's business and some of it reads files.
ENV_ATTRS: frozenset[str] = frozenset({"tool", "name", "description", "domain", "state_model", "tools"})

MAX_CODE_CHARS = 500_000


class StaticProblem(BaseModel):
    """One reason the code is rejected before it runs."""

    line: int
    message: str


# catch_warnings swaps a process-wide filter list: serialize our uses (the parent may be threaded)
_WARNINGS_LOCK = threading.Lock()


def _trusted_module(name: str) -> ModuleType | None:
    """The real module (imported here, in the trusted parent) to resolve attribute chains against."""
    try:
        with _WARNINGS_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except Exception:
        return None


def _member(module: ModuleType, name: str) -> Any:
    try:
        with _WARNINGS_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return getattr(module, name)
    except Exception:  # pydantic's lazy __getattr__ raises its own errors for removed names
        return None


def module_member_problem(module: ModuleType, name: str) -> str | None:
    """Why `module.name` is off limits, or None: private names, denied names, non-allowed submodules."""
    if name.startswith("_"):
        return f"'{module.__name__}.{name}' is private"
    if name in FORBIDDEN_ATTRS:
        return f"'{module.__name__}.{name}' is forbidden: it {FORBIDDEN_ATTRS[name]}"
    value = _member(module, name)
    if isinstance(value, ModuleType) and value.__name__ not in ALLOWED_MODULES:
        why = MODULE_REASONS.get(value.__name__.split(".")[0], "is not on the allow-list")
        return f"'{module.__name__}.{name}' is the module '{value.__name__}', which {why}"
    return None


def module_problem(name: str) -> str | None:
    if name in ALLOWED_MODULES:
        return None
    top = name.split(".")[0]
    why = MODULE_REASONS.get(name) or MODULE_REASONS.get(top) or "is not on the allow-list"
    allowed = ", ".join(sorted(m for m in ALLOWED_MODULES if m != "__future__"))
    return f"import of '{name}' is forbidden: it {why} (allowed: {allowed})"


_ATTR_FUNCTIONS = frozenset({"getattr", "setattr", "delattr", "hasattr"})


class _Checker:
    """The AST rules. Iterative (ast.walk), so deeply nested code cannot overflow the recursion limit."""

    def __init__(self) -> None:
        self.problems: list[StaticProblem] = []
        self.modules: dict[str, ModuleType] = {}  # local name -> module bound by an import
        self.env_names: set[str] = set()  # names bound to Environment(...) at module level
        self.bound: set[str] = set()  # every name the code binds anywhere
        self.imported: set[str] = set()  # every name an import binds

    def add(self, node: ast.AST, message: str) -> None:
        self.problems.append(StaticProblem(line=getattr(node, "lineno", 0), message=message))

    def run(self, tree: ast.AST) -> None:
        nodes = list(ast.walk(tree))
        for node in nodes:  # imports first: attribute rules resolve names they bind
            if isinstance(node, ast.Import):
                self.visit_Import(node)
            elif isinstance(node, ast.ImportFrom):
                self.visit_ImportFrom(node)
        for node in nodes:
            if isinstance(node, ast.Name):
                self.visit_Name(node)
            elif isinstance(node, ast.Attribute):
                self.visit_Attribute(node)
            elif isinstance(node, ast.Call):
                self.visit_Call(node)
            elif isinstance(node, ast.ExceptHandler):
                self.visit_ExceptHandler(node)

    # ---- imports ------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            problem = module_problem(alias.name)
            if problem is None and alias.name in ENVFACTORY_NAMES:
                problem = f"'import {alias.name}' is not allowed; use 'from {alias.name} import ...'"
            if problem is not None:
                self.add(node, problem)
                continue
            # `import a.b` binds `a`; `import a.b as c` binds the submodule
            target = alias.name if alias.asname else alias.name.split(".")[0]
            module = _trusted_module(target)
            if module is not None:
                self.modules[alias.asname or target] = module

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.add(node, "relative imports are forbidden: generated code is a single module")
            return
        name = node.module or ""
        problem = module_problem(name)
        if problem is not None:
            self.add(node, problem)
            return
        module = _trusted_module(name) if name != "__future__" else None
        for alias in node.names:
            if alias.name == "*":
                self.add(node, f"'from {name} import *' is forbidden: import names explicitly")
                continue
            if name in ENVFACTORY_NAMES:
                if alias.name not in ENVFACTORY_NAMES[name]:
                    allowed = ", ".join(sorted(ENVFACTORY_NAMES[name]))
                    self.add(node, f"'{alias.name}' cannot be imported from {name} (allowed: {allowed})")
                continue
            if module is None:
                continue
            member_problem = module_member_problem(module, alias.name)
            if member_problem is not None:
                self.add(node, f"'from {name} import {alias.name}': {member_problem}")
                continue
            value = _member(module, alias.name)
            if isinstance(value, ModuleType):
                self.modules[alias.asname or alias.name] = value

    # ---- names and attributes -----------------------------------------------------------------
    def visit_Name(self, node: ast.Name) -> None:
        ident = node.id
        if ident.startswith("__") and ident.endswith("__") and ident not in ALLOWED_DUNDER_NAMES:
            self.add(node, f"name '{ident}' is forbidden: dunder names reach interpreter internals")
        elif ident in FORBIDDEN_BUILTINS and ident not in self.bound:
            self.add(node, f"'{ident}' is forbidden: it {FORBIDDEN_BUILTINS[ident]}")
        elif ident in FORBIDDEN_ATTRS and isinstance(node.ctx, ast.Load) and ident not in self.bound:
            self.add(node, f"'{ident}' is forbidden: it {FORBIDDEN_ATTRS[ident]}")

    def _attr_problem(self, attr: str) -> str | None:
        if attr.startswith("__") and attr.endswith("__"):
            if attr in ALLOWED_DUNDER_ATTRS:
                return None
            return f"attribute '{attr}' is forbidden: dunder attributes reach interpreter internals"
        if attr.startswith("_"):
            return (
                f"attribute '{attr}' is forbidden: private attributes are off limits "
                "(state lives in public fields, written through the CRUD helpers)"
            )
        if attr in FORBIDDEN_ATTRS:
            return f"attribute '{attr}' is forbidden: it {FORBIDDEN_ATTRS[attr]}"
        return None

    def _resolve(self, node: ast.expr) -> Any:
        """The module an expression names (`typing`, `collections.abc`), when statically known."""
        if isinstance(node, ast.Name):
            return self.modules.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._resolve(node.value)
            if isinstance(base, ModuleType):
                return _member(base, node.attr)
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        problem = self._attr_problem(node.attr)
        writes = isinstance(node.ctx, ast.Store | ast.Del)
        if problem is None and writes and isinstance(node.value, ast.Name) and node.value.id in self.imported:
            problem = (
                f"assigning '{node.value.id}.{node.attr}' is forbidden: monkeypatching imported modules "
                "and classes changes the runtime the code is checked with"
            )
        if problem is None:
            base = self._resolve(node.value)
            if isinstance(base, ModuleType):
                problem = module_member_problem(base, node.attr)
            elif isinstance(node.value, ast.Name) and node.value.id in self.env_names and node.attr not in ENV_ATTRS:
                problem = (
                    f"'{node.value.id}.{node.attr}' is forbidden: module code may only use "
                    f"{', '.join(sorted(ENV_ATTRS))} of the Environment"
                )
        if problem is not None:
            self.add(node, problem)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in _ATTR_FUNCTIONS and len(node.args) > 1:
            arg = node.args[1]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                problem = self._attr_problem(arg.value)
                if problem is not None:
                    self.add(node, f"{func.id}(..., {arg.value!r}): {problem}")

    # ---- control flow -------------------------------------------------------------------------
    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        caught = node.type
        names = caught.elts if isinstance(caught, ast.Tuple) else [caught] if caught is not None else []
        if caught is None or any(isinstance(n, ast.Name) and n.id == "BaseException" for n in names):
            self.add(
                node,
                "bare 'except:' and 'except BaseException' are forbidden: they swallow the sandbox's "
                "time and memory signals; catch specific exceptions (tools raise ToolError)",
            )


def _env_names(tree: ast.Module) -> set[str]:
    """Module-level names bound to `Environment(...)`."""
    out: set[str] = set()
    for node in tree.body:
        targets: list[ast.expr]
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "Environment":
            out.update(t.id for t in targets if isinstance(t, ast.Name))
    return out


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the module binds (parameters, assignments, defs...): those shadow builtins."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.alias):
            out.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    return out


def static_check(code: str) -> list[StaticProblem]:
    """Problems that keep `code` from running at all (empty: it may go to the sandbox)."""
    if len(code) > MAX_CODE_CHARS:
        return [StaticProblem(line=0, message=f"the code is {len(code)} characters; the limit is {MAX_CODE_CHARS}")]
    try:
        tree = ast.parse(code, filename="env.py")
    except SyntaxError as e:
        return [StaticProblem(line=e.lineno or 0, message=f"syntax error: {e.msg}")]
    except ValueError as e:  # null bytes
        return [StaticProblem(line=0, message=f"cannot parse the code: {e}")]
    except (RecursionError, MemoryError):
        return [StaticProblem(line=0, message="the code is nested too deeply to parse")]
    checker = _Checker()
    checker.bound = _bound_names(tree)
    checker.env_names = _env_names(tree)
    checker.imported = {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    try:
        checker.run(tree)
    except RecursionError:  # resolving a very long attribute chain recurses; no tool module has one
        return [StaticProblem(line=0, message="the code is nested too deeply to check")]
    return sorted(checker.problems, key=lambda p: p.line)


# ---- the protocol between parent and child ---------------------------------------------------

# Child exit codes the parent maps to a status (anything else, or a signal, is a crash).
EXIT_MEMORY = 71
EXIT_TIMEOUT = 72
EXIT_BAD_JOB = 73
EXIT_NO_REPORT = 74


class JobStep(BaseModel):
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    observe_state: bool = False  # dump the state after this step (only where a check reads it)


class JobScenario(BaseModel):
    name: str
    initial_config: dict[str, Any] = Field(default_factory=dict)
    steps: list[JobStep]


class SandboxJob(BaseModel):
    """What the child is asked to do: calls only, never the expected outcomes."""

    code_path: str
    module_name: str
    deadline: float  # time.time() by which the child must have written its result
    call_timeout_s: float
    memory_mb: int
    cpu_s: int
    fsize_mb: int
    drop_privileges: bool
    replay: bool = True  # run each completed scenario twice: the second run must repeat the first
    scenarios: list[JobScenario]


class StepObservation(BaseModel):
    tool: str
    ok: bool
    result: Any = None
    error_type: str | None = None
    error_message: str | None = None
    state: dict[str, Any] | None = None


class ScenarioObservation(BaseModel):
    name: str
    load_error: str | None = None  # the initial config does not fit the state model (the scenario's fault)
    load_crash: str | None = None  # the state model raised something else while loading (the code's fault)
    steps: list[StepObservation] = Field(default_factory=list)
    completed: bool = False
    aborted: str | None = None  # why the scenario stopped early (a hung call)
    replay_difference: str | None = None  # the same calls on a fresh session did something else


Phase = Literal["startup", "import", "scenario"]


class Interrupt(BaseModel):
    """Where the child was when a limit stopped it."""

    kind: Literal["timeout", "cpu", "memory"]
    phase: Phase
    scenario: str | None = None
    step: int | None = None
    tool: str | None = None


class Observations(BaseModel):
    """The child's raw report: what the code did, with no verdict."""

    pid: int
    isolation: dict[str, Any] = Field(default_factory=dict)
    import_error: str | None = None
    import_line: int | None = None
    env_problems: list[str] = Field(default_factory=list)
    derived_metadata: dict[str, Any] | None = None
    scenarios: list[ScenarioObservation] = Field(default_factory=list)
    tampering: list[str] = Field(default_factory=list)
    hung_tools: list[str] = Field(default_factory=list)  # calls stopped by the per-call limit
    interrupted: Interrupt | None = None  # the whole run stopped by a limit


# ---- running a job ---------------------------------------------------------------------------

SandboxStatus = Literal["ok", "static_rejected", "timeout", "memory", "crashed"]


class SandboxLimits(BaseModel):
    """Limits of one sandbox run.

    `timeout_s` is wall clock for the whole child, interpreter start included; `call_timeout_s`
    (default a quarter of it, at least 0.5 s) stops one hanging tool call, so the run goes on with
    the next scenario and reports every hang it meets. `memory_mb` is address space the code may
    use on top of the child's baseline after the runtime is imported (a total would depend on the
    machine's libraries). `cpu_s` defaults to the wall clock plus one second.
    """

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(default=20.0, gt=0)
    call_timeout_s: float | None = Field(default=None, gt=0)
    memory_mb: int = Field(default=1024, gt=0)
    cpu_s: float | None = Field(default=None, gt=0, description="RLIMIT_CPU, rounded up to whole seconds")
    fsize_mb: int = Field(default=64, gt=0, description="largest file the child may write (its result, its log)")
    drop_privileges: bool = Field(default=True, description="when started as root: run the code as nobody")
    replay: bool = Field(default=True, description="replay each scenario to check the tools are deterministic")

    @classmethod
    def from_settings(cls, settings: Settings) -> SandboxLimits:
        return cls(timeout_s=settings.sandbox_timeout_s, memory_mb=settings.sandbox_memory_mb)

    @property
    def call_limit_s(self) -> float:
        return self.call_timeout_s if self.call_timeout_s is not None else max(0.5, self.timeout_s / 4)

    @property
    def cpu_limit_s(self) -> int:
        return math.ceil(self.cpu_s) if self.cpu_s is not None else math.ceil(self.timeout_s) + 1


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
    package_root = str(Path(__file__).resolve().parent.parent.parent)
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
        cmd = [sys.executable, "-P", "-m", "envfactory.env.sandbox_child", str(job_path), str(result_path)]
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


def parse_observations(output: dict[str, Any] | None) -> Observations | None:
    """The child's output as `Observations`, or None if it is missing or malformed (it is untrusted)."""
    if output is None:
        return None
    try:
        return Observations.model_validate(output)
    except ValidationError:
        return None
