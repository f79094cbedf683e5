"""The `envfactory` CLI, run as a real subprocess on a temporary project folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envfactory.inputs import FOLDER_LOCK
from tests.support.paths import ROOT


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "envs" / "hotels", tmp_path / "envs" / "hotels")
    broken = tmp_path / "envs" / "broken"
    shutil.copytree(ROOT / "envs" / "hotels", broken)
    meta = json.loads((broken / "metadata.json").read_text())
    meta["name"] = "broken"
    (broken / "metadata.json").write_text(json.dumps(meta))
    code = (broken / "env.py").read_text().replace('"hotels",', '"broken",', 1)
    (broken / "env.py").write_text(
        code.replace('@env.tool(kind="write")\ndef cancel_booking', '@env.tool(kind="read")\ndef cancel_booking')
    )
    return tmp_path


def run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ENVFACTORY_ROOT": str(project), "ENVFACTORY_BFCL": "false", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "envfactory.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


def one_line_error(res: subprocess.CompletedProcess[str], needle: str) -> None:
    assert res.returncode == 1, res
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.stderr


def test_envs_list(project: Path) -> None:
    res = run(project, "envs", "list")
    assert res.returncode == 0, res.stderr
    assert "hotels" in res.stdout and "travel" in res.stdout
    assert "broken" in res.stdout  # listed, even though it will fail validation


def test_envs_validate_syncs_registry(project: Path) -> None:
    registry = project / "configs" / "mcp_server.json"
    res = run(project, "envs", "validate")
    one_line_error(res, "1 of 2 environments failed validation: broken")
    assert "kind 'write', env.py says 'read'" in res.stdout
    servers = json.loads(registry.read_text())["mcpServers"]
    assert list(servers) == ["hotels"]
    assert servers["hotels"]["args"] == ["serve", "hotels", "--transport", "stdio"]
    assert servers["hotels"]["tools"] == 8 and servers["hotels"]["write_tools"] == 3

    (project / "envs" / "broken" / "metadata.json").unlink()
    shutil.rmtree(project / "envs" / "broken")
    assert run(project, "envs", "validate", "hotels").returncode == 0
    assert list(json.loads(registry.read_text())["mcpServers"]) == ["hotels"]


def test_call_and_state_file(project: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    args = json.dumps({"hotel_id": "HT-POR-01", "guest_name": "Ana", "check_in": "2026-03-01", "nights": 1})
    res = run(project, "call", "hotels", "book_room", "--args", args, "--state", str(state))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["id"] == "BK-0002"
    res = run(project, "call", "hotels", "cancel_booking", "--args", '{"booking_id": "BK-0002"}', "--state", str(state))
    assert json.loads(res.stdout)["status"] == "cancelled"
    assert json.loads(state.read_text())["bookings"]["BK-0002"]["status"] == "cancelled"
    res = run(project, "call", "hotels", "get_booking", "--args", '{"booking_id": "BK-0404"}')
    assert res.returncode == 1 and json.loads(res.stdout)["error"]["type"] == "not_found"


def test_cli_errors_are_one_line(project: Path) -> None:
    one_line_error(run(project, "call", "nope", "x"), "no environment 'nope'")
    one_line_error(run(project, "call", "hotels", "get_hotel", "--args", "{bad"), "--args: invalid JSON")
    one_line_error(run(project, "call", "hotels", "get_hotel", "--args", "[1]"), "--args must be a JSON object")
    one_line_error(run(project, "call", "hotels", "get_hotel", "--scenario", "nope"), "has no scenario 'nope'")
    one_line_error(run(project, "serve", "hotels", "--scenario", "nope"), "has no scenario 'nope'")
    one_line_error(run(project, "serve", "hotels", "--uds", "x.sock"), "--uds: HTTP options; add --transport http")
    sock = str(project / "s.sock")
    both = run(project, "serve", "hotels", "--transport", "http", "--uds", sock, "--port", "8999")
    one_line_error(both, "--uds serves on a Unix socket: leave out --host and --port")
    nowhere = run(project, "serve", "hotels", "--transport", "http", "--uds", str(project / "no" / "s.sock"))
    one_line_error(nowhere, "its folder does not exist")
    one_line_error(run(project, "hub", "serve", "--uds", sock), "--uds: HTTP options; add --transport http")
    one_line_error(run(project, "hub", "serve", "--host", "0.0.0.0"), "--host: HTTP options; add --transport http")
    # usage errors click finds (unknown option or command, a bad value, a missing option): one line too, exit 2
    usage = [
        (("serve", "hotels", "--transport", "http", "--port", "99999"), "'--port'"),  # was uvicorn's traceback
        (("serve", "hotels", "--transport", "http", "--port", "0"), "'--port'"),
        (("envs", "export", "hotels", "--format", "gym"), "'--format'"),
        (("envs", "export", "hotels", "--outt", "x"), "No such option: --outt"),
        (("mcp", "haproxy"), "Missing option '--backend'"),
        (("export", "x", "--out", "y"), "Missing option '--format'. Choose from: trl-sft, trl-grpo,"),
        (("nope",), "No such command 'nope'"),
        (("export", "x", "--format", "trl-sft", "--out", ""), "an empty path names no place to write"),  # not the cwd
        (("mcp", "config", "--client", "generic", "--out", " "), "an empty path names no place to write"),
        (("scaling", "simulate", "--out", "-"), "'-' (standard output) is not a file this option writes"),
    ]
    for args, needle in usage:
        res = run(project, *args)
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), res
        assert needle in lines[0] and "--help" in lines[0], res.stderr
    assert run(project, "envs", "list", "--help").returncode == 0


def test_envs_metadata_prints_the_code_schema(project: Path) -> None:
    res = run(project, "envs", "metadata", "hotels")
    assert res.returncode == 0, res.stderr
    meta = json.loads(res.stdout)
    assert meta == json.loads((project / "envs" / "hotels" / "metadata.json").read_text())


def test_a_graph_command_without_langgraph_says_which_extra_to_install(tmp_path: Path) -> None:
    """LangGraph is the `graphs` extra: without it the core commands run and `envgen` says what to install."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nsys.modules['langgraph'] = None  # as if the graphs extra were not installed\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "ENVFACTORY_BFCL": "false", "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "envfactory.cli"]
    res = subprocess.run([*cmd, "envgen", "history"], env=env, capture_output=True, text=True, timeout=120)
    one_line_error(res, "pip install 'envfactory[graphs]'")
    helped = subprocess.run([*cmd, "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "envgen" not in helped.stdout and "envs" in helped.stdout
    listed = subprocess.run([*cmd, "envs", "list", "--native"], env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "hotels" in listed.stdout


def test_out_dash_prints_where_a_command_prints_and_is_refused_where_it_writes_a_file(
    project: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "ENVFACTORY_ROOT": str(project), "ENVFACTORY_BFCL": "false", "COLUMNS": "200"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "envfactory.cli", *args]
        return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    printed = cli("mcp", "config", "--hub", "--out", "-")
    assert printed.returncode == 0, printed.stderr
    assert "envfactory-hub" in json.loads(printed.stdout)["mcpServers"]
    empty = cli("mcp", "config", "--out", "-")  # nothing registered in this project: said, not an empty config
    assert empty.returncode == 1 and "no environment is registered" in empty.stderr
    one_line_error_2 = cli("scaling", "simulate", "--out", "-")
    assert one_line_error_2.returncode == 2 and "is not a file this option writes" in one_line_error_2.stderr
    assert not (tmp_path / "-").exists()  # neither wrote a file named '-'


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["envs", "list"], "interrupted"),
        (
            ["--quiet", "synth", "--config", "x.yaml"],
            "interrupted: what was written is kept; run the same command again to continue where it stopped",
        ),
        (
            ["corpus", "compile", "--id", "x"],
            "interrupted: what was written is kept; run the same command again to continue where it stopped",
        ),
        (["serve", "hotels", "--transport", "http"], "stopped: the server is down and its sessions' states are gone"),
        (["hub", "serve"], "stopped: the server is down and its sessions' states are gone"),
    ],
)
def test_ctrl_c_says_what_it_left_for_the_command_and_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    """A server stopped by Ctrl-C said what a batch's resume keeps ("synth, eval and corpus compile continue")."""
    import importlib

    cli = importlib.import_module("envfactory.cli.main")  # (the package exports its function `main` by that name)

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt  # what Ctrl-C raises in the middle of a command's work

    monkeypatch.setattr(cli, "_add_plugins", interrupted)
    monkeypatch.setattr(sys, "argv", ["envfactory", *argv])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    assert stopped.value.code == 130
    said = capsys.readouterr().err.strip().splitlines()
    assert said[-1] == says and "Traceback" not in "\n".join(said)


def test_synth_and_export_end_by_naming_every_file_they_wrote(tmp_path: Path) -> None:
    env = {**os.environ, "ENVFACTORY_ROOT": str(ROOT), "ENVFACTORY_DATA_DIR": str(tmp_path / "data"), "COLUMNS": "200"}
    env["ENVFACTORY_BFCL"] = "false"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "envfactory.cli", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)

    plan = tmp_path / "plan.yaml"
    plan.write_text(f"envs: [hotels]\nT: 1\nS: 1\nD: 1\nplot: false\nout: {tmp_path / 'run'}\n")
    res = cli("synth", "--config", str(plan))
    assert res.returncode == 0, res.stderr
    written = {p.name for p in (tmp_path / "run").iterdir() if p.is_file() and p.name != FOLDER_LOCK}  # (the lock)
    named = {name for name in written if f"{tmp_path / 'run' / name}:" in res.stdout}
    assert {"conversations.jsonl", "summary.json", "settings.json"} <= written and named == written, res.stdout
    res = cli("export", str(tmp_path / "run"), "--format", "trl-sft", "--out", str(tmp_path / "sft"))
    assert res.returncode == 0, res.stderr
    for path in (tmp_path / "sft").iterdir():
        assert str(path) in res.stdout, (path, res.stdout)


def test_ctrl_c_while_a_command_is_still_loading_is_the_same_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    cli = importlib.import_module("envfactory.cli.main")

    def loading(argv: list[str]) -> None:
        raise KeyboardInterrupt  # a plugin's imports (synth: seconds) are where a Ctrl-C often lands

    monkeypatch.setattr(cli, "_add_plugins", loading)
    monkeypatch.setattr(sys, "argv", ["envfactory", "synth", "--config", "x.yaml"])
    with pytest.raises(SystemExit) as stopped:
        cli.main()
    said = capsys.readouterr().err
    assert stopped.value.code == 130 and "Traceback" not in said and said.strip().startswith("interrupted:")


def test_a_runs_own_files_are_kept_only_beside_a_runs_file(tmp_path: Path) -> None:
    """`contamination RUN/conversations.jsonl --json RUN/summary.json` replaced the run's summary; the rule that
    refuses it must not refuse a `summary.json` beside any other input (`scaling fit runs.csv --json summary.json`)."""
    from envfactory.cli.args import refuse_overwriting_input
    from envfactory.errors import EnvFactoryError

    run = tmp_path / "run"
    run.mkdir()
    for name in ("conversations.jsonl", "summary.json", "heldout.jsonl", "runs.csv", "report.json"):
        (run / name).write_text("x\n")
    for out in ("summary.json", "heldout.jsonl"):
        with pytest.raises(EnvFactoryError, match=f"would overwrite {out} of the run"):
            refuse_overwriting_input(run / out, "--json", run / "conversations.jsonl")
    refuse_overwriting_input(run / "report.json", "--json", run / "conversations.jsonl")  # not the run's: a rerun's
    refuse_overwriting_input(run / "summary.json", "--json", run / "runs.csv")  # a table is not a run's file
    refuse_overwriting_input(tmp_path / "new.json", "--json", run / "conversations.jsonl")
