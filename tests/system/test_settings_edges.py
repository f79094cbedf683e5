"""Settings at the edges: `get_settings()` (the settings read from the environment) is called only where a
program starts — the CLI, the graphs' entry and state, training and benchmark scripts — and library code takes
`settings` (and the pool) as arguments. An AST scan over the packages, like the layer test's."""

from __future__ import annotations

import ast

from tests.support.paths import ROOT

REPO = ROOT
SCANNED = ("envfactory", "graphs", "training", "envfactory_agents", "benchmarks")

# packages (folders under the repository) where a program starts: they read the settings
ENTRY_PACKAGES = {
    "envfactory/cli": "the `envfactory` commands: each reads the settings once and passes them down",
    "graphs": "LangGraph's entry: a graph's state takes the run context's settings, else (LangGraph Studio, "
    "`langgraph dev`) the environment's; graphs/cli holds the graph commands",
    "training": "training scripts (`python -m training...`), run as programs",
    "benchmarks": "benchmark scripts, run as programs",
}

# library call sites that still read the settings themselves, each with why it cannot take them yet
ALLOWED_CALLS = {
    ("envfactory/env/pool.py", "EnvPool.__init__"): "`EnvPool()` with no settings is the public default that "
    "scripts and tests build (tests/envgen/test_health.py, tests/metatools/test_hub.py); library callers pass settings",
    ("envfactory/export/turns.py", "export_wording"): "`ExportOptions.prompts_dir=None` means the settings' prompt "
    "folder, and export.json records the options as given: the CLI cannot fill it in without changing the file",
    ("envfactory/reward/scorer.py", "default_pool"): "the functional form `composite_reward` is what outside "
    "trainers (VeRL) call with a record's fields only: its default pool is built at that edge",
    ("envfactory/reward/trl.py", "ToolUseReward.__init__"): "`ToolUseReward()` is what a TRL script hands "
    "`GRPOTrainer(reward_funcs=...)`, built with no arguments: the trainer-facing edge",
}


def get_settings_calls(source: str) -> list[tuple[int, str]]:
    """(line, the enclosing function's qualified name, or '<module>') of every `get_settings(...)` call."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, [*scope, child.name])
                continue
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name == "get_settings":
                    found.append((child.lineno, ".".join(scope) or "<module>"))
            visit(child, scope)

    visit(ast.parse(source), [])
    return found


def _library_calls() -> dict[tuple[str, str], list[int]]:
    calls: dict[tuple[str, str], list[int]] = {}
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if any(rel.startswith(package + "/") for package in ENTRY_PACKAGES) or rel == "envfactory/config.py":
                continue
            for line, scope in get_settings_calls(path.read_text(encoding="utf-8")):
                calls.setdefault((rel, scope), []).append(line)
    return calls


def test_the_scan_sees_calls_and_their_scope() -> None:
    source = (
        "from envfactory.config import get_settings\n"
        "class Pool:\n"
        "    def __init__(self, settings=None):\n"
        "        self.settings = settings or get_settings()\n"
        "def f():\n"
        "    return config.get_settings().root\n"
        "X = get_settings()\n"
    )
    assert get_settings_calls(source) == [(4, "Pool.__init__"), (6, "f"), (7, "<module>")]


def test_get_settings_is_called_only_at_entry_points() -> None:
    stray = {
        f"{rel}:{lines[0]} in {scope}": lines
        for (rel, scope), lines in _library_calls().items()
        if (rel, scope) not in ALLOWED_CALLS
    }
    assert not stray, (
        "library code reads the settings itself; take `settings` as an argument and read them in the entry point "
        f"(envfactory/cli/, graphs/, training/, benchmarks/): {sorted(stray)}"
    )


def test_the_allowed_list_holds_only_live_call_sites() -> None:
    """An entry fixed (no call left there) comes off the list, so the list only shrinks."""
    live = set(_library_calls())
    assert set(ALLOWED_CALLS) <= live, sorted(set(ALLOWED_CALLS) - live)


def test_the_entry_packages_exist() -> None:
    for package in ENTRY_PACKAGES:
        assert (REPO / package).is_dir(), package
