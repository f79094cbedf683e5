"""The layer rules, read from the source (an AST import check, nothing imported):

- `envfactory/` (the library) never imports LangGraph, `envfactory_agents/`, `graphs/` or `training/`;
- `envfactory_agents/` never imports `graphs/`;
- no import cycle between `envfactory/`'s subpackages (and top-level modules), counting every import,
  also those inside functions;
- inside the library, a lower layer never imports a higher one (`LIBRARY_RULES`): the runtime and serving
  never import the generator (`envgen/`), rewards never import export, evaluation and the meta-tools never
  import a server (`serve/`), and what reads a run folder never imports the batch runner that writes it;
- the bottom modules every layer uses (`words.py`, `env/state_path.py`) import nothing of the library;
- the shared records (`records/`: tasks, turns, episodes, verification, the run folder) import nothing above
  the runtime: only `records/`, `env/` and the bottom modules (`words`, `errors`, `inputs`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from tests.support.paths import ROOT


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module `path` imports (absolute names; relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)  # `from pkg import module`
    return out


def _files(top: str) -> list[Path]:
    return sorted((ROOT / top).rglob("*.py"))


def _offending(top: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in _files(top)
        for name in sorted(_imports(p))
        if name.split(".")[0] in forbidden
    ]


def test_the_import_reader_sees_relative_and_nested_imports() -> None:
    assert "langgraph.graph" in _imports(ROOT / "graphs" / "envgen" / "graph.py")
    assert {"envfactory.env.pool", "envfactory.env.pool.EnvPool"} <= _imports(ROOT / "envfactory" / "envgen/health.py")


def test_the_library_imports_no_agents_graphs_training_or_langgraph() -> None:
    assert _offending("envfactory", ("langgraph", "envfactory_agents", "graphs", "training")) == []


def test_agents_never_import_graphs() -> None:
    assert _offending("envfactory_agents", ("graphs",)) == []


def _importing(top: str, modules: tuple[str, ...]) -> list[str]:
    """Every import under `top` of one of `modules` or of anything inside it (`envfactory.serve` matches
    `envfactory.serve.base`, not `envfactory.server`)."""
    return [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in _files(top)
        for name in sorted(_imports(p))
        if any(name == m or name.startswith(f"{m}.") for m in modules)
    ]


BATCH_RUNNER = ("envfactory.tasks.plan", "envfactory.tasks.run")

# (the importing folder, the modules it never imports, why): each was once broken and moved (docs/development.md)
LIBRARY_RULES: list[tuple[str, tuple[str, ...], str]] = [
    ("envfactory/env", ("envfactory.envgen",), "the runtime sits below the generator (the registry: env.registry)"),
    ("envfactory/serve", ("envfactory.envgen",), "serving runs environments; it never generates or judges them"),
    ("envfactory/reward", ("envfactory.export",), "export sits above rewards (the demo's table: cli.reward_sanity)"),
    ("envfactory/eval", ("envfactory.serve",), "evaluation runs the hub in process (envfactory.metatools)"),
    ("envfactory/metatools", ("envfactory.serve",), "the meta-tools sit below the server that serves them"),
    ("envfactory/export", BATCH_RUNNER, "export reads a run folder (records.run_folder), never the batch runner"),
    ("envfactory/reward", BATCH_RUNNER, "rewards read records, never the batch runner"),
    ("envfactory/eval", BATCH_RUNNER, "evaluation reads a run folder (records.run_folder), never the batch runner"),
    (
        "envfactory/serve",
        BATCH_RUNNER,
        "the hub server reads a run folder (records/), never the batch runner",
    ),
    ("envfactory/metatools", BATCH_RUNNER, "the meta-tools read a tasks file, never the batch runner"),
]


def test_the_rules_see_an_import_of_a_module_and_of_what_is_inside_it_and_nothing_else() -> None:
    assert _importing("envfactory/cli", ("envfactory.cli.reward_sanity",))  # cli/demo.py imports it
    assert _importing("envfactory/serve", ("envfactory.metatools",))  # hub_server.py imports it
    assert _importing("envfactory/eval", ("envfactory.env",))  # `from envfactory.env.pool import EnvPool`
    assert _importing("envfactory/eval", ("envfactory.en", "envfactory.env.poo")) == []  # a prefix is not a module
    assert all(p.is_dir() for p in (ROOT / top for top, _, _ in LIBRARY_RULES))  # a moved folder fails loudly


@pytest.mark.parametrize(("top", "modules", "why"), LIBRARY_RULES, ids=[f"{r[0]}-{r[1][0]}" for r in LIBRARY_RULES])
def test_a_lower_layer_never_imports_a_higher_one(top: str, modules: tuple[str, ...], why: str) -> None:
    assert _importing(top, modules) == [], why


# modules every layer may use, so they import nothing of the library themselves
BOTTOM = ("envfactory/words.py", "envfactory/env/state_path.py")


@pytest.mark.parametrize("path", BOTTOM)
def test_the_bottom_modules_import_nothing_of_the_library(path: str) -> None:
    assert [n for n in sorted(_imports(ROOT / path)) if n.split(".")[0] == "envfactory"] == []


# what the records every stage shares may import: themselves, the runtime and the bottom modules
RECORDS_MAY_IMPORT = (
    "envfactory.records",
    "envfactory.env",
    "envfactory.words",
    "envfactory.errors",
    "envfactory.inputs",
)


def test_the_records_import_nothing_above_the_runtime() -> None:
    assert _importing("envfactory/records", ("envfactory.env",))  # the check sees the records' imports
    above = [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in _files("envfactory/records")
        for name in sorted(_imports(p))
        if name.split(".")[0] == "envfactory"
        and name != "envfactory"
        and not any(name == m or name.startswith(f"{m}.") for m in RECORDS_MAY_IMPORT)
    ]
    assert above == [], "records/ sits below every stage that reads them (synthesis, rewards, export, eval, serve)"


# serving's HTTP side (the per-session base, its ASGI layers, answers, uvicorn, limits, fair threads, the addresses it
# binds: net) may import only
# itself, the input readers and the error classes (a leaf: a bad ENVFACTORY_SERVE_* setting is a ConfigError): it
# serves whatever `dispatch` answers and knows no environment, record or task
SERVE_HTTP = ("asgi.py", "answers.py", "base.py", "fair.py", "http.py", "limits.py", "net.py")
SERVE_HTTP_MAY_IMPORT = (
    "envfactory.inputs",
    "envfactory.errors",
    *(f"envfactory.serve.{name[:-3]}" for name in SERVE_HTTP),
)


@pytest.mark.parametrize("name", SERVE_HTTP)
def test_serving_s_http_side_imports_no_environment_record_or_task(name: str) -> None:
    path = ROOT / "envfactory" / "serve" / name
    library = [n for n in sorted(_imports(path)) if n.split(".")[0] == "envfactory" and n != "envfactory"]
    outside = [n for n in library if not any(n == m or n.startswith(f"{m}.") for m in SERVE_HTTP_MAY_IMPORT)]
    assert outside == [], f"serve/{name} is the HTTP side of a server: environments and records are the subclasses'"


def _unit(module: str) -> str | None:
    """A module's unit for the cycle check: `envfactory.<subpackage>` or a top-level `envfactory.<module>`."""
    parts = module.split(".")
    if parts[0] != "envfactory" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def _exists(unit: str) -> bool:
    """`unit` is a subpackage or a module of the library (not a name imported from one)."""
    path = ROOT / Path(*unit.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def test_no_import_cycle_between_the_library_s_parts() -> None:
    graph = nx.DiGraph()
    for path in _files("envfactory"):
        source = _unit(_module(path))
        if source is None:
            continue
        for name in _imports(path):
            target = _unit(name)
            if target is not None and target != source and _exists(target):
                graph.add_edge(source, target)
    assert graph.has_edge("envfactory.tasks", "envfactory.env")  # the check sees the library's imports
    cycles = sorted(sorted(c) for c in nx.simple_cycles(graph))
    assert cycles == [], cycles


def test_no_top_level_package_takes_a_name_another_library_uses() -> None:
    """Run from the checkout (where `''` leads sys.path), `agents` is openai-agents' module (verifiers imports it)
    and ours is `envfactory_agents`: the two once hid each other."""
    code = "import importlib.util as u; s = u.find_spec('agents'); print(s.origin if s and s.origin else '')"
    found = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    origin = found.stdout.strip()
    assert not origin or Path(origin).parent != ROOT / "agents", origin  # empty: openai-agents not installed
    tops = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert "agents" not in tops and "envfactory_agents" in tops


def test_python_is_parsed_one_thread_at_a_time() -> None:
    """Every `ast.parse` of the project goes through `envfactory.inputs.parse_python` (a lock): CPython 3.11's AST
    conversion keeps its recursion depth per interpreter, and two threads parsing at once (an EnvGen batch's code
    agents) failed a run with "SystemError: AST constructor recursion depth mismatch" (cpython gh-106905)."""
    direct: list[str] = []
    for package in ("envfactory", "envfactory_agents", "graphs", "training"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "parse"
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "ast"
                ):
                    direct.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert direct, "the check no longer finds parse_python's own ast.parse"
    assert [d for d in direct if not d.startswith("envfactory/inputs.py:")] == []
