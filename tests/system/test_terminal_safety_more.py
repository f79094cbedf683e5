"""Untrusted text reaches the terminal escaped (issue 24), beyond `envfactory.cli`: the tables and lines the
library prints (`envfactory.tasks`: a synth run's summary and statistics; `envfactory.llm`: LLM usage), the
`envgen` and `synth` commands (graphs/cli), EnvGen's reject and register nodes (a model-chosen name never
becomes a bad path or a traceback), and a hub package's name (matched whole).

A run's data (conversations, drop codes), a checkpoint's values (a model's failure text, a Studio edit) and
folder names are untrusted: each is put in cells and lines with `[/x]` (a `MarkupError` when read as markup)
and ESC / C1 sequences (raw, they clear the screen).
"""

from __future__ import annotations

import ast
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from langgraph.runtime import Runtime
from rich.console import Console
from rich.table import Table

from envfactory.config import Settings, get_settings
from envfactory.env.pool import EnvPool
from envfactory.hubs.export import HubExportError, export_package
from envfactory.llm.usage import RoleUsage, usage_table
from envfactory.records.models import (
    Conversation,
    Node,
    Provenance,
    StateVerifier,
    Step,
    Task,
    ToolCall,
)
from envfactory.records.run_folder import CONVERSATIONS
from envfactory.tasks.plan import BatchSummary, Plan, SynthConfig
from envfactory.tasks.report import summary_table
from envfactory.tasks.run import tool_graph
from envfactory.tasks.stats import dataset_stats, stats_table
from envfactory.tasks.synth_settings import record_synth_settings
from envfactory.terminal import visible
from envfactory.toolgraph.graph import ToolGraph
from graphs.checkpoint import open_checkpointer
from graphs.cli import envgen
from graphs.envgen import EnvGenContext, build
from graphs.envgen.nodes import node_register, node_reject
from tests.support.paths import ROOT, TEST_DATA
from tests.system.test_terminal_safety import NASTY, _environ, assert_clean, run_main, texts

META = json.loads((TEST_DATA / "envgen" / "notebook_metadata.json").read_text())

EVIL = "[/x]\x1b[2J"  # an environment name from a run's data: a MarkupError, then a cleared screen
SHOWN = visible(EVIL)  # what the terminal must show: [/x]\x1b[2J, as text


def rendered(*renderables: Any, console: type[Console] = Console) -> str:
    """What a console (a plain `rich` one by default: the escaping is the cells', not only the net's) prints."""
    buffer = io.StringIO()
    out = console(file=buffer, width=400, color_system=None, emoji=False)
    for r in renderables:
        out.print(r, highlight=False)
    return buffer.getvalue()


def conversation(env: str, tool: str = "search") -> Conversation:
    """A minimal conversation on environment `env` (a run's data: whatever the file says)."""
    call = ToolCall(server=env, name=tool)
    node = Node(
        index=0,
        query="q",
        steps=[Step(role="user", content="q"), Step(role="tool_call", content=[call])],
        mcp_servers=[env],
        initial_scenario={},
        final_scenario={},
    )
    task = Task(id="t", instruction="i", servers=[env], initial_state={}, verifier=StateVerifier(goal={}), solver=[])
    return Conversation(
        id=f"c-{env}", servers=[env], tools=[call.qualified], nodes=[node], task=task,
        provenance=Provenance(generator="template", seed=0),
    )  # fmt: skip


# ------------------------------------------------------------------------- the library's tables


def test_the_statistics_table_shows_environment_names_as_written() -> None:
    """`[/x]` in a conversations file ended `synth` and `demo` in a MarkupError; its ESC went raw."""
    table = stats_table(dataset_stats([conversation(EVIL), conversation(f"b{NASTY}")]))
    shown = rendered(table)
    assert_clean(shown)
    assert f"{SHOWN}: 1" in shown and visible(f"b{NASTY}") in shown


def test_the_synth_summary_shows_drop_codes_as_written() -> None:
    summary = BatchSummary(
        planned=2, skipped=0, kept=0, dropped=2, dropped_by_code={EVIL: 1, "[bold]x": 1}, shortfall={}, out=Path(".")
    )
    shown = rendered(summary_table(summary))
    assert_clean(shown)
    assert f"{SHOWN}: 1" in shown and "[bold]x: 1" in shown


def test_the_usage_table_shows_role_names_as_written() -> None:
    shown = rendered(usage_table([RoleUsage(role=EVIL, calls=1), RoleUsage(role="[red]code", calls=2)]))
    assert_clean(shown)
    assert SHOWN in shown and "[red]code" in shown


@settings(max_examples=150, deadline=None)
@given(texts, texts)
def test_random_names_in_the_library_s_tables_print_as_written(env: str, role: str) -> None:
    """Any text: each table prints, its names visible and exactly as written, nothing raw."""
    tables: list[Table] = [
        stats_table(dataset_stats([conversation(env)])),
        summary_table(
            BatchSummary(planned=1, skipped=0, kept=0, dropped=1, dropped_by_code={env: 1}, shortfall={}, out=Path("."))
        ),
        usage_table([RoleUsage(role=role)]),
    ]
    for table in tables:
        assert_clean(rendered(table))
    # the cell holds the name whole (a newline in it starts a new line of the cell; a tab prints as spaces)
    if not {"\n", "\t"} & set(env):
        assert f"{visible(env)}: 1" in rendered(tables[0])


# ------------------------------------------------------------------ a synth run, through the command


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "envs" / "hotels", tmp_path / "envs" / "hotels")
    return tmp_path


@pytest.mark.filterwarnings("ignore:Glyph .* missing from font")  # the plot's labels: an ESC has no glyph
def test_synth_prints_a_run_s_names_and_paths_as_written(project: Path) -> None:
    """`envfactory synth` resuming a run folder whose conversations name an environment `[/x]\\x1b[2J`, in a folder
    named with markup and ESC: the shortfall line, the statistics and the plot path were markup (a crash) and raw."""
    out = project / "run[red]\x1b[2J"  # a folder name holds no `/`: an opening tag, swallowed as markup
    config = project / "synth.json"
    config.write_text(json.dumps({"envs": ["hotels"], "T": 1, "out": str(out), "plot": True}))
    made = Settings(root=project, prompts_dir=ROOT / "prompts")  # (as `run_main`'s environment says)
    plan = Plan(envs=[], units=[], shortfall={EVIL: 1})  # what the graph gave: nothing, for a name from the data
    record_synth_settings(SynthConfig.model_validate(json.loads(config.read_text())), made, envs=plan.envs)
    (out / CONVERSATIONS).write_text(conversation(EVIL).model_dump_json() + "\n")  # the run resumed: its settings
    with mock.patch("graphs.cli.synth.plan_batch", return_value=plan):  # (an empty plan is refused before it)
        code, stdout, stderr = run_main(project, "synth", "--config", str(config))
    assert code == 0, stdout + stderr
    assert_clean(stdout + stderr)
    flat = re.sub(r"\s+", " ", stdout)
    assert f"{SHOWN}: the graph gave 1 chain(s) fewer" in flat
    assert f"environments │ {SHOWN}: 1" in flat
    assert f"plot: {visible(out / 'stats.png')}" in stdout.replace("\n", "")
    assert (out / "stats.png").is_file()


def test_building_a_missing_tool_graph_names_its_path_as_written(tmp_path: Path, capsys: Any) -> None:
    data = tmp_path / "data[red]\x1b[2J"
    with mock.patch("envfactory.toolgraph.build.build_pool_graph", return_value=(ToolGraph(), None)):
        tool_graph(Settings(root=ROOT, bfcl=False, data_dir=data), SynthConfig())  # its own console: stderr
    err = capsys.readouterr().err
    assert_clean(err)
    assert f"no tool graph at {visible(data)}" in err.replace("\n", "")


# ------------------------------------------------------------------------------------ envgen commands


def _checkpoint(project: Path, thread: str, values: dict[str, Any]) -> None:
    """A finished EnvGen thread whose checkpoint holds `values` (as a Studio edit or an old run could)."""
    with _environ(project), open_checkpointer(get_settings()) as saver:
        build(saver).update_state({"configurable": {"thread_id": thread}}, values, as_node="reject")


def test_envgen_resume_and_history_print_a_run_s_text_as_written(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary's cells (the environment's name, a model's failure text) and history's were markup and raw."""
    thread = "envgen-nasty"
    values = {
        "metadata": {**META, "name": EVIL},
        "status": f"failed{EVIL}",
        "failure": f"code: the model said {NASTY}",
        "revision": 1,
        "report": {"scenarios_passed": "[/x]", "scenarios_run": 2},
    }
    _checkpoint(project, thread, values)
    monkeypatch.setattr(envgen.out, "width", 300)  # each cell on one line
    code, stdout, stderr = run_main(project, "envgen", "resume", thread)
    assert code == 0, stdout + stderr
    assert_clean(stdout + stderr)
    stdout = re.sub(" +", " ", stdout)  # cells padded to their column
    assert f"has finished: failed{SHOWN}" in stdout
    assert f"│ {SHOWN} │ failed{SHOWN} │ 1 │ [/x]/2 │ code: the model said {visible(NASTY)} │" in stdout
    code, stdout, stderr = run_main(project, "envgen", "history", thread)
    assert code == 0, stdout + stderr
    assert_clean(stdout + stderr)
    assert f"│ 1 │ failed{SHOWN} │ [/x]/2 │" in re.sub(" +", " ", stdout)


# --------------------------------------------------------------------------- EnvGen's reject / register


def _runtime(tmp_path: Path, data: Path | None = None) -> Runtime[EnvGenContext]:
    settings = Settings(root=tmp_path, bfcl=False, data_dir=data or tmp_path / "data")
    return Runtime(context=EnvGenContext(settings=settings))


def _state(name: str) -> dict[str, Any]:
    return {"metadata": {**META, "name": name}, "code": "x = 1\n", "scenarios": [], "reports": []}


RAW_OR_ESC = re.compile("[\x00-\x1f\x7f-\x9f]")
BAD = {"300": "a" * 300, "nl": "notebook\n", "path": "../../escaped", "slash": "nb/x", "esc": f"n{NASTY}", "empty": ""}


@pytest.mark.parametrize("name", list(BAD.values()), ids=list(BAD))
def test_reject_records_a_bad_name_as_a_failure_and_writes_nothing(tmp_path: Path, name: str) -> None:
    """A 300-character name was an ENAMETOOLONG traceback (or a ValidationError); `../..` a folder elsewhere."""
    update = node_reject(_state(name), _runtime(tmp_path))  # type: ignore[arg-type]
    assert update["status"] == "failed", update
    failure = update["failure"] or ""
    assert failure.startswith("reject: ") and "is not a valid environment name" in failure and "not kept" in failure
    assert "\n" not in failure and RAW_OR_ESC.search(failure) is None and len(failure) < 250
    assert [p for p in tmp_path.rglob("*")] == []  # nothing written, anywhere


@pytest.mark.parametrize("name", list(BAD.values()), ids=list(BAD))
def test_register_records_a_bad_name_as_a_failure(tmp_path: Path, name: str) -> None:
    update = node_register(_state(name), _runtime(tmp_path))  # type: ignore[arg-type]
    assert update["status"] == "failed" and (update["failure"] or "").startswith("register: "), update
    assert "is not a valid environment name" in (update["failure"] or "") and "\n" not in (update["failure"] or "")
    assert [p for p in tmp_path.rglob("*")] == []


def test_reject_records_a_folder_it_cannot_write_as_a_failure(tmp_path: Path) -> None:
    """The data folder is a file: NotADirectoryError was a traceback."""
    (tmp_path / "data").write_text("not a folder")
    update = node_reject(_state("notebook"), _runtime(tmp_path))  # type: ignore[arg-type]
    assert update["status"] == "failed" and (update["failure"] or "").startswith("reject: cannot write "), update


def test_reject_records_metadata_that_no_longer_validates_as_a_failure(tmp_path: Path) -> None:
    state = _state("notebook")
    state["metadata"]["domain"] = "nowhere"
    update = node_reject(state, _runtime(tmp_path))  # type: ignore[arg-type]
    assert update["status"] == "failed" and "the metadata does not validate: domain" in (update["failure"] or "")


def test_reject_keeps_a_well_named_environment(tmp_path: Path) -> None:
    update = node_reject(_state("notebook"), _runtime(tmp_path))  # type: ignore[arg-type]
    folder = tmp_path / "data" / "rejected" / "notebook"
    assert update == {"status": "rejected", "output": str(folder)}
    assert (folder / "env.py").read_text() == "x = 1\n" and (folder / "metadata.json").is_file()


# ---------------------------------------------------------------------------------------- names, whole


@pytest.mark.parametrize("name", ["pkg\n", "pkg\nx", "Pkg", "a" * 50])
def test_a_hub_package_name_is_matched_whole(tmp_path: Path, name: str) -> None:
    """`^...$` with `match` let "pkg\\n" through: a module named with a newline."""
    pool = EnvPool(Settings(root=ROOT, bfcl=False))
    with pytest.raises(HubExportError, match="package name"):
        export_package(pool, ["hotels"], [], "openenv", tmp_path / "out", name=name)
    assert not (tmp_path / "out").exists()


def _console_calls(path: Path) -> list[int]:
    """Lines of `path` that construct a plain rich `Console` (by that name)."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name == "Console":
                calls.append(node.lineno)
    return calls


def test_the_library_and_the_commands_print_through_safe_consoles_only() -> None:
    """One helper, one place (`envfactory/terminal.py`): no plain `Console()` in the library, the agents or graphs/."""
    found = [
        f"{p.relative_to(ROOT)}:{line}"
        for top in ("envfactory", "envfactory_agents", "graphs")
        for p in sorted((ROOT / top).rglob("*.py"))
        for line in _console_calls(p)
    ]
    assert found == []
    assert not (ROOT / "envfactory" / "cli" / "terminal.py").exists()
