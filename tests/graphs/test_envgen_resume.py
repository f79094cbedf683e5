"""EnvGen through the CLI: a real process killed with SIGKILL mid-loop resumes from its checkpoint."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from envfactory.config import get_settings
from graphs.checkpoint import open_checkpointer
from graphs.envgen import build
from tests.support.cli import CliRun, run_cli
from tests.support.envgen import METADATA, SCENARIOS, code, fenced, node_sequence, scripted_calls, setup_project
from tests.support.paths import ROOT

THREAD = "envgen-killed"
# module-level work makes the second test round last long enough to be killed inside it
SLOW_GOOD = code("good") + "\n\n_WARM_UP = sum(i * i for i in range(12_000_000))\n"


def _cli(*args: str) -> CliRun:
    """`envfactory ARGS` in this process (the project's settings come from the test's environment)."""
    return run_cli(list(args))


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # Rich's tables: a thread id is not wrapped


def _snapshot() -> Any:
    for _ in range(50):  # the running process may hold the write lock for a moment
        try:
            with open_checkpointer(get_settings()) as saver:
                return build(saver).get_state({"configurable": {"thread_id": THREAD}})
        except sqlite3.OperationalError:
            time.sleep(0.05)
    raise AssertionError("checkpoint database stayed locked")


def test_sigkill_mid_loop_then_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup_project(
        tmp_path,
        monkeypatch,
        {"code/generate": [fenced(code("bug"))], "test/scenarios": [SCENARIOS], "code/revise": [fenced(SLOW_GOOD)]},
    )
    monkeypatch.setenv("ENVFACTORY_SANDBOX_TIMEOUT_S", "60")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "envfactory.cli",
            "envgen",
            "run",
            "--metadata",
            str(METADATA),
            "--thread-id",
            THREAD,
        ],
        env=os.environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    try:
        while True:  # wait until the loop has revised once and the second test round is running
            assert proc.poll() is None, f"envgen exited before it could be killed: {proc.stderr.read()!r}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "never reached the second test round"
            snap = _snapshot() if (tmp_path / "project" / ".envfactory" / "checkpoints.sqlite").exists() else None
            if snap is not None and snap.values.get("revision") == 1 and snap.next == ("test",):
                break
            time.sleep(0.1)
        time.sleep(0.3)  # inside the test node now
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    killed = _snapshot()
    assert killed.next == ("test",) and killed.values.get("status") == "running"
    assert len(killed.values["reports"]) == 1  # the interrupted round left nothing behind

    resumed = _cli("envgen", "resume", THREAD)
    assert resumed.code == 0, resumed.stderr
    assert "registered" in resumed.stdout
    with open_checkpointer(get_settings()) as saver:
        graph = build(saver)
        final = graph.get_state({"configurable": {"thread_id": THREAD}})
        ran = node_sequence(graph, THREAD)
    # every node exactly once, in order: nothing repeated from before the kill, nothing lost
    assert ran == ["search", "code", "test", "revise", "test", "register"]
    assert final.values["status"] == "registered" and len(final.values["reports"]) == 2

    history = _cli("envgen", "history", THREAD)
    assert history.code == 0 and "revise" in history.stdout
    again = _cli("envgen", "resume", THREAD)
    assert again.code == 0 and "has finished" in again.stdout
    changed = _cli("envgen", "resume", THREAD, "--budget", "7")  # a finished thread runs nothing: said, not ignored
    assert changed.code == 1 and "--budget would change nothing" in changed.stderr
    missing = _cli("envgen", "resume", "no-such-thread")
    assert missing.code == 1 and "no checkpoint for thread 'no-such-thread'" in missing.stderr


def test_cli_interrupt_before_revise_then_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup_project(
        tmp_path,
        monkeypatch,
        {"code/generate": [fenced(code("bug"))], "test/scenarios": [SCENARIOS], "code/revise": [fenced(code("good"))]},
    )
    thread = "envgen-stepped"
    first = _cli("envgen", "run", "--metadata", str(METADATA), "--thread-id", thread, "--interrupt-before", "revise")
    assert first.code == 0, first.stderr
    assert "interrupted before revise" in first.stdout and f"envfactory envgen resume {thread}" in first.stdout
    assert "LLM usage" in first.stdout  # token usage per role, reported at the end of the run
    resumed = _cli("envgen", "resume", thread)
    assert resumed.code == 0 and "registered" in resumed.stdout, resumed.stdout + resumed.stderr
    bad = _cli("envgen", "run", "--metadata", str(METADATA), "--interrupt-before", "nowhere")
    assert bad.code == 1 and "unknown node 'nowhere'" in bad.stderr


def test_cli_batch_runs_concurrently_and_refuses_a_bad_file_before_any_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken_metadata.json"
    broken.write_text('{"name": "x", "domain": "space"}')
    setup_project(
        tmp_path,
        monkeypatch,
        {"code/generate": [fenced(code("good"))] * 2, "test/scenarios": [SCENARIOS] * 2},
    )
    args = ("envgen", "run", "--metadata", str(METADATA), "--metadata", str(METADATA), "--concurrency", "2")
    refused = _cli(*args, "--metadata", str(broken))  # a user's mistake: one line before any work
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert refused.code == 1 and len(lines) == 1 and "broken_metadata.json" in lines[0], refused
    assert "no EnvGen threads yet" in _cli("envgen", "threads").stdout  # nothing started for it
    res = _cli(*args)
    assert res.code == 0, res.stderr
    rows = [line for line in res.stdout.splitlines() if "envgen-" in line]
    assert len(rows) == 2 and all("registered" in r for r in rows), res.stdout
    listed = _cli("envgen", "threads").stdout
    assert sum("registered" in line for line in listed.splitlines() if "envgen-" in line) == 2, listed


def test_a_failed_run_leaves_its_code_and_report_on_disk_and_exits_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Test Agent's model has nothing to say (its script is empty): the run fails after the code was written.
    The code and the run's record were only in the checkpoint; now they are files the summary names."""
    setup_project(tmp_path, monkeypatch, {"code/generate": [fenced(code("good"))]})
    res = _cli("envgen", "run", "--metadata", str(METADATA))
    assert res.code == 1 and "no environment was registered (failed)" in res.stderr, res
    kept = list((get_settings().data_path / "envgen" / "failed").glob("envgen-*"))
    assert len(kept) == 1, res.stdout
    assert (kept[0] / "env.py").read_text() == code("good")
    assert (kept[0] / "report.json").is_file() and kept[0].name in res.stdout.replace("\n", "")


def _garbage(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 16)


def _foreign(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE checkpoints (x)")  # another program's file, a table of the same name


def _a_folder(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize("spoil", [_garbage, _foreign, _a_folder])
def test_a_damaged_or_foreign_checkpoint_database_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: Any
) -> None:
    """`envgen threads` / `history` / `resume` / `run` gave a 45-line sqlite3 traceback, the file never named."""
    from envfactory.config import Settings
    from envfactory.errors import EnvFactoryError
    from graphs.checkpoint import checkpoint_path

    settings = Settings(root=tmp_path, data_dir=tmp_path / "data")
    path = checkpoint_path(settings)
    path.parent.mkdir(parents=True)
    spoil(path)
    with pytest.raises(EnvFactoryError) as caught, open_checkpointer(settings):
        pass
    assert str(path) in str(caught.value) and "move it aside" in str(caught.value) and "\n" not in str(caught.value)


def test_synths_querygen_threads_in_the_same_database_are_not_envgens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`synth` in LLM mode checkpoints its QueryGen units into the same database: `threads` listed them as blank
    rows and `resume` of one said "has finished: None" and exited 0."""
    from graphs.querygen.graph import build as build_querygen

    setup_project(tmp_path, monkeypatch, {"code/generate": [fenced(code("good"))], "test/scenarios": [SCENARIOS]})
    other = "querygen-0a1b2c3d-unit-0007"
    with open_checkpointer(get_settings()) as saver:  # a QueryGen unit stopped before its first node (no model)
        graph = build_querygen(saver)
        cfg: Any = {"configurable": {"thread_id": other}}
        start = {"chain": {"servers": ["hotels"], "tools": []}, "seed": 7, "conversation_id": "unit-0007"}
        graph.invoke(start, cfg, interrupt_before=["prepare"], durability="sync")
    listed = _cli("envgen", "threads")
    assert listed.code == 0 and other not in listed.stdout and "no EnvGen threads yet" in listed.stdout
    assert "1 thread(s) of synth's QueryGen" in listed.stdout
    for command in ("resume", "history"):
        refused = _cli("envgen", command, other)
        assert refused.code == 1 and "is not an EnvGen run" in refused.stderr, (command, refused)
    ours = _cli("envgen", "run", "--metadata", str(METADATA), "--thread-id", "mine-without-prefix")
    assert ours.code == 0, ours.stderr
    listed = _cli("envgen", "threads").stdout
    assert "mine-without-prefix" in listed and other not in listed


def test_a_resume_goes_on_with_the_options_the_run_was_started_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--budget 1` then an interrupt: a plain `resume` used the default budget (3), so the run that the budget
    rejects uninterrupted was registered after a second revision. The run's options are kept with its thread; one
    given to `resume` takes its place and is said."""
    script = {
        "code/generate": [fenced(code("bug"))] * 2,
        "test/scenarios": [SCENARIOS] * 2,
        "code/revise": [fenced(code("nodelete")), fenced(code("good"))] * 2,
    }
    setup_project(tmp_path, monkeypatch, script)
    straight = _cli("envgen", "run", "--metadata", str(METADATA), "--thread-id", "straight", "--budget", "1")
    assert "rejected" in straight.stdout, straight.stdout
    stepped = _cli(
        "envgen",
        "run",
        "--metadata",
        str(METADATA),
        "--thread-id",
        "stepped",
        "--budget",
        "1",
        "--interrupt-before",
        "revise",
    )
    assert "interrupted before revise" in stepped.stdout, stepped.stdout + stepped.stderr
    resumed = _cli("envgen", "resume", "stepped")
    assert "rejected" in resumed.stdout and "registered" not in resumed.stdout, resumed.stdout  # the same outcome
    assert "was started with" not in resumed.stdout  # nothing changed: nothing said
    with open_checkpointer(get_settings()) as saver:
        kept = build(saver).get_state({"configurable": {"thread_id": "stepped"}}).values["options"]
    assert kept["revision_budget"] == 1 and kept["prompt_overrides"] == {}
    other = _cli(
        "envgen",
        "run",
        "--metadata",
        str(METADATA),
        "--thread-id",
        "other",
        "--budget",
        "1",
        "--interrupt-before",
        "revise",
    )
    assert other.code == 0
    changed = _cli("envgen", "resume", "other", "--budget", "3")
    assert "was started with --budget 1; resuming with 3" in changed.stdout, changed.stdout


def test_threads_as_json_lines_hold_the_ids_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table folds a long thread id in a pipe or a narrow terminal: `--json` gives one object a line to script on."""
    import json

    monkeypatch.setenv("COLUMNS", "40")
    setup_project(tmp_path, monkeypatch, {"code/generate": [fenced(code("good"))], "test/scenarios": [SCENARIOS]})
    thread = "envgen-a-rather-long-thread-id-0123456789"
    assert _cli("envgen", "run", "--metadata", str(METADATA), "--thread-id", thread).code == 0
    listed = _cli("envgen", "threads", "--json")
    rows = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
    assert listed.code == 0 and [r["thread"] for r in rows] == [thread], listed.stdout
    assert rows[0]["status"] == "registered" and rows[0]["next"] == [] and rows[0]["environment"]


def test_run_on_a_thread_that_exists_is_refused_and_restart_starts_it_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --thread-id T` on a thread with checkpoints ran on top of them: the old run's scenarios were judged
    again without asking the Test Agent, and the registered environment's envgen.json held the old run's failing
    report beside the new one (`reports` is appended to). Now it is refused; `--restart` starts over from nothing."""
    import json

    root = setup_project(tmp_path, monkeypatch, {"code/generate": [fenced(code("bug"))], "test/scenarios": [SCENARIOS]})
    first = _cli("envgen", "run", "--metadata", str(METADATA), "--thread-id", "T", "--budget", "0")
    assert first.code == 1 and "rejected" in first.stdout, first.stdout + first.stderr
    # the next run's script (each run reads it from the top): good code, and scenarios only if they are asked for
    script = {"code/generate": [fenced(code("good"))], "test/scenarios": [SCENARIOS]}
    (tmp_path / "script.yaml").write_text(yaml.safe_dump(script, sort_keys=False))
    again = _cli("envgen", "run", "--metadata", str(METADATA), "--thread-id", "T")
    assert again.code == 1 and "thread 'T' already exists (rejected)" in again.stderr, again.stderr
    assert "envfactory envgen resume T" in again.stderr
    assert scripted_calls("code/generate") == []  # refused before any model call
    alone = _cli("envgen", "run", "--metadata", str(METADATA), "--restart")
    assert alone.code == 1 and "--restart starts over the thread --thread-id names" in alone.stderr
    restarted = _cli("envgen", "run", "--metadata", str(METADATA), "--thread-id", "T", "--budget", "0", "--restart")
    assert restarted.code == 0 and "registered" in restarted.stdout, restarted.stdout + restarted.stderr
    assert len(scripted_calls("test/scenarios")) == 1  # the Test Agent was asked again
    with open_checkpointer(get_settings()) as saver:
        graph = build(saver)
        values = graph.get_state({"configurable": {"thread_id": "T"}}).values
        assert node_sequence(graph, "T") == ["search", "code", "test", "register"]  # the old run's nodes are gone
    assert len(values["reports"]) == 1 and values["revision"] == 0
    registered = json.loads((root / "envs" / "notebook" / "envgen.json").read_text())
    assert len(registered["reports"]) == 1


def test_a_resume_reads_the_prompt_file_the_run_named_and_says_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--prompt code/revise=rev.yaml` was kept as the relative path given: a resume from another folder read that
    folder's rev.yaml, and an edited file was read silently. The path is kept whole, with the file's sha256."""
    setup_project(
        tmp_path,
        monkeypatch,
        {"code/generate": [fenced(code("bug"))], "test/scenarios": [SCENARIOS], "code/revise": [fenced(code("good"))]},
    )
    source = yaml.safe_load((ROOT / "prompts" / "code" / "revise.yaml").read_text())

    def marked(marker: str) -> str:
        messages = [dict(m) for m in source["messages"]]
        messages[0]["content"] = f"{marker}. {messages[0]['content']}"
        return yaml.safe_dump({**source, "messages": messages})

    first, second = tmp_path / "A", tmp_path / "B"
    for folder, marker in ((first, "PROMPT FROM FOLDER A"), (second, "PROMPT FROM FOLDER B")):
        folder.mkdir()
        (folder / "rev.yaml").write_text(marked(marker))
    monkeypatch.chdir(first)
    started = _cli(
        "envgen", "run", "--metadata", str(METADATA), "--thread-id", "P", "--prompt", "code/revise=rev.yaml",
        "--interrupt-before", "revise",
    )  # fmt: skip
    assert "interrupted before revise" in started.stdout, started.stdout + started.stderr
    monkeypatch.chdir(second)
    resumed = _cli("envgen", "resume", "P")
    assert resumed.code == 0 and "registered" in resumed.stdout, resumed.stdout + resumed.stderr
    assert "has changed since" not in resumed.stdout
    [revise] = scripted_calls("code/revise")
    assert "PROMPT FROM FOLDER A" in revise and "FOLDER B" not in revise

    (first / "rev.yaml").write_text(marked("EDITED"))
    monkeypatch.chdir(first)
    other = _cli(
        "envgen", "run", "--metadata", str(METADATA), "--thread-id", "Q", "--prompt", "code/revise=rev.yaml",
        "--interrupt-before", "revise",
    )  # fmt: skip
    assert other.code == 0
    (first / "rev.yaml").write_text(marked("EDITED AGAIN"))
    # a file that is not YAML was taken for the system message's text (its path sent to the model)
    for value in ("my_prompt.txt", "does_not_exist.json"):
        refused = _cli("envgen", "run", "--metadata", str(METADATA), "--prompt", f"code/revise={value}")
        assert refused.code == 1 and "a prompt file is YAML (.yaml or .yml)" in refused.stderr, refused.stderr
    said = _cli("envgen", "resume", "Q")
    assert f"--prompt code/revise={first / 'rev.yaml'}, which has changed since" in " ".join(said.stdout.split())
