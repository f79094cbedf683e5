"""The tests mirror the packages (tests/<package>/test_<module>.py), read from the files (nothing imported):

- every folder of tests/ but `data/`, `support/` and `system/` is a package of envfactory (`tests/env/sandbox/`
  ↔ `envfactory/env/sandbox/`) or a top-level folder of the repository (`tests/graphs/` ↔ `graphs/`), and holds an
  `__init__.py` (test modules keep unique names under pytest-xdist, and `python -m pytest tests/serve/test_fair.py`
  runs from the repository root);
- a test file at the top of tests/ names a top-level module of envfactory (`tests/test_words.py` ↔ `words.py`);
- every module of envfactory is named by a test file in its mirror folder (`test_<module>.py` or
  `test_<module>_<what>.py`), or listed in `COVERED_ELSEWHERE` with the test file that covers it; that file must
  reach the module: import it, through any chain of first-party imports, module names run as `-m` strings and
  entry points (a CLI sub-command, the sandbox's worker). An entry that a named test file makes unneeded, or
  whose module is gone, fails too: the list only shrinks by hand;
- every test file the docs, the Makefile and the code name (`tests/.../test_x.py`) exists.
"""

from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

from tests.support.paths import ROOT

TESTS = ROOT / "tests"
NOT_MIRRORS = {"data", "support", "system"}  # checked-in data, shared helpers, suites across the packages
FIRST_PARTY = ("envfactory", "envfactory_agents", "graphs", "training")

# Modules no test file is named for, and the test file that covers each (most are small pieces of a package
# whose behaviour its named tests hold: errors, settings, models, writers reached through one entry point).
COVERED_ELSEWHERE: dict[str, str] = {
    "envfactory/cli/args.py": "tests/cli/test_main.py",
    "envfactory/cli/contamination.py": "tests/eval/test_contamination.py",
    "envfactory/cli/corpus.py": "tests/corpus/test_index.py",
    "envfactory/cli/demo.py": "tests/cli/test_reward_sanity.py",
    "envfactory/cli/eval.py": "tests/test_run_settings.py",
    "envfactory/cli/export.py": "tests/export/test_export.py",
    "envfactory/cli/mcp.py": "tests/serve/test_clients.py",
    "envfactory/cli/prompts.py": "tests/llm/test_prompts.py",
    "envfactory/cli/scaling.py": "tests/scaling/test_laws.py",
    "envfactory/compiler/build.py": "tests/compiler/test_compile.py",
    "envfactory/compiler/draft.py": "tests/graphs/test_envgen_draft.py",
    "envfactory/compiler/revision.py": "tests/graphs/test_envgen_draft.py",
    "envfactory/compiler/routes.py": "tests/compiler/test_compile.py",
    "envfactory/compiler/scenarios.py": "tests/compiler/test_compile.py",
    "envfactory/compiler/schemas.py": "tests/compiler/test_compile.py",
    "envfactory/config.py": "tests/test_run_settings.py",
    "envfactory/corpus/archive.py": "tests/corpus/test_fetch.py",
    "envfactory/corpus/domains.py": "tests/corpus/test_fetch.py",
    "envfactory/corpus/models.py": "tests/corpus/test_fetch.py",
    "envfactory/corpus/settings.py": "tests/corpus/test_fetch.py",
    "envfactory/corpus/specs.py": "tests/corpus/test_fetch.py",
    "envfactory/corpus/store.py": "tests/corpus/test_fetch.py",
    "envfactory/env/diff.py": "tests/env/test_state_path.py",
    "envfactory/env/folder.py": "tests/env/test_trust_pins.py",
    "envfactory/env/import_guard.py": "tests/env/test_environment_contract.py",
    "envfactory/env/registry.py": "tests/env/test_pool.py",
    "envfactory/env/sandbox/ast_check.py": "tests/env/sandbox/test_fingerprint.py",
    "envfactory/env/sandbox/guards.py": "tests/env/sandbox/test_sandbox.py",
    "envfactory/env/sandbox/integrity.py": "tests/env/sandbox/test_sandbox.py",
    "envfactory/env/sandbox/isolation.py": "tests/env/sandbox/test_sandbox.py",
    "envfactory/env/sandbox/limits.py": "tests/env/sandbox/test_spare.py",
    "envfactory/env/sandbox/policy.py": "tests/env/sandbox/test_fingerprint.py",
    "envfactory/env/sandbox/process.py": "tests/env/sandbox/test_fingerprint.py",
    "envfactory/env/sandbox/protocol.py": "tests/env/sandbox/test_fingerprint.py",
    "envfactory/env/sandbox/wall.py": "tests/env/sandbox/test_sandbox.py",
    "envfactory/env/sandbox/worker.py": "tests/env/sandbox/test_sandbox.py",
    "envfactory/env/tools.py": "tests/env/test_session.py",
    "envfactory/envgen/checks/interface.py": "tests/envgen/checks/test_checks.py",
    "envfactory/envgen/checks/matching.py": "tests/envgen/checks/test_checks.py",
    "envfactory/envgen/checks/report.py": "tests/envgen/checks/test_checks.py",
    "envfactory/envgen/checks/sandbox_round.py": "tests/envgen/checks/test_checks.py",
    "envfactory/envgen/checks/scenarios.py": "tests/envgen/checks/test_checks.py",
    "envfactory/envgen/checks/schema_scenarios.py": "tests/envgen/checks/test_checks.py",
    "envfactory/envgen/checks/verdict.py": "tests/envgen/checks/test_checks.py",
    "envfactory/envgen/register.py": "tests/env/sandbox/test_fingerprint.py",
    "envfactory/envgen/validate.py": "tests/envgen/test_health.py",
    "envfactory/eval/agent.py": "tests/eval/test_run.py",
    "envfactory/eval/items.py": "tests/eval/test_run.py",
    "envfactory/eval/score.py": "tests/eval/test_run.py",
    "envfactory/eval/toolset.py": "tests/eval/test_llama_server.py",
    "envfactory/export/chat_template.py": "tests/export/test_export.py",
    "envfactory/export/errors.py": "tests/export/test_export.py",
    "envfactory/export/files.py": "tests/export/test_export.py",
    "envfactory/export/llamafactory.py": "tests/export/test_export.py",
    "envfactory/export/messages.py": "tests/export/test_export.py",
    "envfactory/export/options.py": "tests/export/test_export.py",
    "envfactory/export/rl.py": "tests/export/test_export.py",
    "envfactory/export/sft.py": "tests/export/test_export.py",
    "envfactory/export/tools_schema.py": "tests/export/test_export.py",
    "envfactory/export/trl_grpo.py": "tests/export/test_export.py",
    "envfactory/export/trl_sft.py": "tests/export/test_export.py",
    "envfactory/export/turns.py": "tests/export/test_export.py",
    "envfactory/export/verl.py": "tests/export/test_export.py",
    "envfactory/hubs/episode.py": "tests/hubs/test_export.py",
    "envfactory/hubs/openenv_env.py": "tests/hubs/test_llama_server.py",
    "envfactory/hubs/package.py": "tests/hubs/test_export.py",
    "envfactory/hubs/verifiers_env.py": "tests/hubs/test_llama_server.py",
    "envfactory/metatools/protocol.py": "tests/metatools/test_hub.py",
    "envfactory/metatools/tasks.py": "tests/metatools/test_hub.py",
    "envfactory/progress.py": "tests/tasks/test_plan.py",
    "envfactory/querygen/records.py": "tests/graphs/test_querygen.py",
    "envfactory/records/models.py": "tests/tasks/test_pi_star.py",
    "envfactory/records/run_folder.py": "tests/tasks/test_plan.py",
    "envfactory/reward/matching.py": "tests/reward/test_scorer.py",
    "envfactory/reward/record.py": "tests/reward/test_scorer.py",
    "envfactory/reward/settings.py": "tests/reward/test_scorer.py",
    "envfactory/reward/state_masking.py": "tests/reward/test_scorer.py",
    "envfactory/reward/state_term.py": "tests/reward/test_fast_path.py",
    "envfactory/reward/tool_calls.py": "tests/reward/test_scorer.py",
    "envfactory/reward/trl.py": "tests/reward/test_scorer.py",
    "envfactory/scaling/budget.py": "tests/scaling/test_laws.py",
    "envfactory/scaling/errors.py": "tests/scaling/test_evidence.py",
    "envfactory/scaling/plot.py": "tests/scaling/test_laws.py",
    "envfactory/scaling/simulate.py": "tests/scaling/test_laws.py",
    "envfactory/scaling/table.py": "tests/scaling/test_evidence.py",
    "envfactory/serve/answers.py": "tests/serve/test_asgi_fast_calls.py",
    "envfactory/serve/base.py": "tests/serve/test_abuse.py",
    "envfactory/serve/hub_server.py": "tests/serve/test_abuse.py",
    "envfactory/serve/limits.py": "tests/serve/test_abuse.py",
    "envfactory/suites/bfcl/calls.py": "tests/suites/bfcl/test_judge.py",
    "envfactory/suites/bfcl/dump.py": "tests/suites/bfcl/test_adapter.py",
    "envfactory/suites/bfcl/entries.py": "tests/suites/bfcl/test_judge.py",
    "envfactory/suites/bfcl/flows.py": "tests/toolgraph/test_build.py",
    "envfactory/suites/bfcl/schema.py": "tests/suites/bfcl/test_adapter.py",
    "envfactory/suites/bfcl/suites.py": "tests/suites/bfcl/test_judge.py",
    "envfactory/tasks/compiled_refs.py": "tests/tasks/test_offline_compiled_ids.py",
    "envfactory/tasks/compiled_state.py": "tests/tasks/test_offline_compiled.py",
    "envfactory/tasks/compose.py": "tests/tasks/test_offline.py",
    "envfactory/tasks/quality.py": "tests/tasks/test_conversation_quality.py",
    "envfactory/tasks/report.py": "tests/tasks/test_plan.py",
    "envfactory/tasks/stats.py": "tests/tasks/test_plan.py",
    "envfactory/tasks/synth_settings.py": "tests/test_run_settings.py",
    "envfactory/tasks/template.py": "tests/tasks/test_conversation_quality.py",
    "envfactory/terminal.py": "tests/system/test_terminal_safety.py",
    "envfactory/toolgraph/classify.py": "tests/toolgraph/test_build.py",
    "envfactory/toolgraph/collect.py": "tests/toolgraph/test_build.py",
    "envfactory/toolgraph/errors.py": "tests/toolgraph/test_build.py",
    "envfactory/toolgraph/graph.py": "tests/toolgraph/test_build.py",
    "envfactory/toolgraph/grounding.py": "tests/toolgraph/test_build.py",
    "envfactory/toolgraph/html.py": "tests/toolgraph/test_build.py",
    "envfactory/toolgraph/io.py": "tests/toolgraph/test_build.py",
    "envfactory/toolgraph/params.py": "tests/toolgraph/test_build.py",
    "envfactory/toolgraph/refine.py": "tests/toolgraph/test_llm_classify.py",
    "envfactory/toolgraph/settings.py": "tests/toolgraph/test_build.py",
    "envfactory/toolgraph/synthetic.py": "tests/toolgraph/test_build.py",
}


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module(p): p for top in FIRST_PARTY for p in sorted((ROOT / top).rglob("*.py"))}


@cache
def _entry_points() -> dict[str, set[str]]:
    """The pyproject's entry-point groups: group name → the modules it loads."""
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    return {group: {target.split(":")[0] for target in eps.values()} for group, eps in groups.items()}


@cache
def _reaches(path: Path) -> frozenset[str]:
    """The first-party modules `path` names directly: imports (also inside functions, `from pkg import module`
    too), module names in strings (`-m envfactory.env.sandbox.worker`), and what an entry-point group it names
    loads."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value.split(":")[0])
    for name in list(names):
        names |= _entry_points().get(name, set())
    return frozenset(n for n in names if n in _modules())


def _closure(path: Path) -> set[str]:
    seen: set[str] = set()
    todo = list(_reaches(path))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_reaches(_modules()[name]))
    return seen


def _test_folders() -> list[Path]:
    return sorted(
        d
        for d in TESTS.rglob("*")
        if d.is_dir() and d.name != "__pycache__" and d.relative_to(TESTS).parts[0] not in NOT_MIRRORS
    )


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if p.relative_to(TESTS).parts[0] != "data")


def _named(module: Path) -> list[Path]:
    """The test files named for `module` (envfactory/<a>/<b>.py): tests/<a>/test_<b>.py or test_<b>_*.py."""
    folder = TESTS / module.relative_to(ROOT / "envfactory").parent
    return [
        t
        for t in _test_files()
        if t.parent == folder and (t.stem == f"test_{module.stem}" or t.stem.startswith(f"test_{module.stem}_"))
    ]


def _library() -> list[Path]:
    """envfactory's modules (not the packages' `__init__.py`, nor `cli/__main__.py`)."""
    return [
        p
        for p in _modules().values()
        if p.parts[len(ROOT.parts)] == "envfactory" and p.name not in ("__init__.py", "__main__.py")
    ]


def test_every_test_folder_mirrors_a_package_or_a_top_folder() -> None:
    wrong = []
    for folder in _test_folders():
        rel = folder.relative_to(TESTS)
        package = ROOT / "envfactory" / rel
        mirrors = any(package.glob("*.py")) or (  # a package (compiler/ is a namespace package: no __init__.py)
            rel.parts[0] != "envfactory" and (ROOT / rel).is_dir() and not (ROOT / "envfactory" / rel.parts[0]).exists()
        )
        if not mirrors:
            wrong.append(
                f"tests/{rel.as_posix()}/ is neither envfactory/{rel.as_posix()}/ nor a folder of the repository"
            )
        if not (folder / "__init__.py").is_file():
            wrong.append(f"tests/{rel.as_posix()}/ has no __init__.py")
    assert wrong == []


def test_top_level_test_files_name_top_level_modules() -> None:
    tops = {p.stem for p in (ROOT / "envfactory").glob("*.py")}
    wrong = [
        p.name
        for p in TESTS.glob("test_*.py")
        if not any(p.stem == f"test_{m}" or p.stem.startswith(f"test_{m}_") for m in tops)
    ]
    assert wrong == [], f"move these into the folder of the package they test: {wrong}"


def test_every_module_is_named_by_a_test_file_or_listed_with_its_cover() -> None:
    missing = [
        str(p.relative_to(ROOT))
        for p in _library()
        if not _named(p) and str(p.relative_to(ROOT)) not in COVERED_ELSEWHERE
    ]
    assert missing == [], "name a test file for each (tests/<package>/test_<module>.py) or list it in COVERED_ELSEWHERE"


def test_the_list_of_modules_covered_elsewhere_holds_no_stale_entry() -> None:
    library = {str(p.relative_to(ROOT)): p for p in _library()}
    stale = [f"{m}: no such module" for m in COVERED_ELSEWHERE if m not in library]
    stale += [
        f"{m}: named by {_named(library[m])[0].relative_to(ROOT)}"
        for m in COVERED_ELSEWHERE
        if m in library and _named(library[m])
    ]
    assert stale == []


def test_each_listed_test_file_reaches_its_module() -> None:
    wrong = []
    for module, test in COVERED_ELSEWHERE.items():
        path = ROOT / test
        if not path.is_file():
            wrong.append(f"{module}: {test} does not exist")
        elif _module(ROOT / module) not in _closure(path):
            wrong.append(f"{module}: {test} never reaches it")
    assert wrong == []


def test_the_reader_follows_imports_strings_and_entry_points() -> None:
    sandbox = _closure(TESTS / "env" / "sandbox" / "test_sandbox.py")
    assert "envfactory.env.sandbox.worker" in sandbox  # run as `python -m envfactory.env.sandbox.worker`
    assert "envfactory.cli.contamination" in _closure(TESTS / "eval" / "test_contamination.py")  # an entry point
    assert "envfactory.tasks.state_values" in _closure(TESTS / "tasks" / "test_initial_state.py")  # two hops
    assert "envfactory.scaling.fit" not in _closure(TESTS / "env" / "test_state.py")
    assert [t.relative_to(ROOT).as_posix() for t in _named(ROOT / "envfactory" / "env" / "pool.py")] == [
        "tests/env/test_pool.py",
        "tests/env/test_pool_lazy.py",
    ]


def test_every_test_file_the_docs_and_the_code_name_exists() -> None:
    texts = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml", *sorted((ROOT / "docs").glob("*.md"))]
    texts += [*sorted(ROOT.glob("*/README.md")), *sorted((ROOT / "benchmarks").glob("*.py")), *_modules().values()]
    texts += [p for p in sorted(TESTS.rglob("*.py")) if p.relative_to(TESTS).parts[0] != "data"]
    named = {(m, p.relative_to(ROOT)) for p in texts for m in re.findall(r"\btests/[\w/]*\.py\b", p.read_text())}
    assert sorted(f"{where}: {m}" for m, where in named if not (ROOT / m).is_file()) == []
