"""What generated code may use: the allow-lists and deny-lists both sandbox layers enforce.

`static_check` (ast_check.py) applies them to the source before it runs; the child's guarded
builtins (guards.py) apply them again at run time, to code that slipped past the AST check.
`module_problem` and `module_member_problem` are shared by both, so the two layers cannot disagree.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from types import ModuleType
from typing import Any

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
# the data-model methods generated code may define (comparisons, containers, context managers); not the ones that
# change how the interpreter looks attributes or types up (`__getattr__`, `__match_args__`, `__instancecheck__`...)
ALLOWED_DUNDER_METHODS: frozenset[str] = frozenset(
    {
        "__init__",
        "__post_init__",
        "__repr__",
        "__str__",
        "__format__",
        "__hash__",
        "__bool__",
        "__len__",
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__iter__",
        "__next__",
        "__contains__",
        "__getitem__",
        "__setitem__",
        "__delitem__",
        "__enter__",
        "__exit__",
        "__call__",
        "__add__",
        "__sub__",
    }
)

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
    "parse_file": "reads files (tools work on the state only)",  # pydantic's BaseModel.parse_file (v1 API, kept)
}

# What module-level code may use of `env = Environment(...)`: registering tools and its labels.
# The rest (sessions, configs, rollback...) is the runtime's business and some of it reads files.
ENV_ATTRS: frozenset[str] = frozenset({"tool", "name", "description", "domain", "state_model", "tools"})


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
