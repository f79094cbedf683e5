"""A checked promise for every command: each class of user mistake is one line, a non-zero exit, and nothing
half-written — and every command of the CLI (and each training script) is walked here, so a new command without
its mistakes listed fails `test_every_command_is_walked`.

The classes: a missing path, a path of the wrong kind (a folder for a file, a file for a folder), an output in a
place that cannot hold it (/proc), bad JSON / YAML, an empty input, an unknown name, no model configured, and a
command that would produce nothing. The commands run in-process (`envfactory.cli.main.main`), so the walk takes
seconds, not a subprocess start per case.
"""

from __future__ import annotations

import functools
import importlib
import json
import shutil
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

from tests.support.cli import run_cli
from tests.support.paths import ROOT

cli = importlib.import_module("envfactory.cli.main")  # the module (the package's `main` is its function)


# what needs a synth run (made once, below), the scratch files, and a place nothing can be created in
RUN, T, NOWHERE = "{run}", "{tmp}", "/proc/envfactory-nowhere/x"


SCRIPTED = {"ENVFACTORY_LLM__PROVIDER": "scripted", "ENVFACTORY_LLM__SCRIPT": "{script}"}  # a model is configured
TRANSFORMERS = {"ENVFACTORY_LLM__PROVIDER": "transformers"}  # a checkpoint in-process (the `training` package's)


def case(argv: str, needle: str, **env: str) -> tuple[str, str, dict[str, str]]:
    return argv, needle, env


# (the command line, words the one error line must hold, environment variables for the case)
CASES: list[tuple[str, str, dict[str, str]]] = [
    case("serve nosuch", "no environment 'nosuch'"),
    case("serve hotels --scenario nosuch", "no scenario 'nosuch'"),
    case("serve hotels --scenario {tmp}/bad.json", "invalid JSON"),
    case("serve hotels --scenario {tmp}/misfit.json", "does not fit"),
    case("serve hotels --port 18999", "--port: HTTP options"),
    case("serve hotels --transport http --port {busy}", "another process is listening there"),
    case("serve hotels --transport http --host nosuch.invalid --port {busy}", "not a host name or address"),
    case("call nosuch get_hotel", "no environment 'nosuch'"),
    case("call hotels get_hotel --args {bad", "invalid JSON"),
    case("call hotels get_hotel --args {} --state {tmp}/bad.json", "invalid JSON"),
    case("call hotels get_hotel --args {} --state {tmp}/adir", "--state {tmp}/adir: not a regular file"),
    case("call hotels get_hotel --args {} --state /proc/envfactory-nowhere/s.json", "does not exist"),
    case("call hotels get_hotel --args {} --scenario {tmp}/nope.json", "--scenario {tmp}/nope.json: no such file"),
    case("call hotels get_hotel --args {} --scenario {tmp}/adir", "--scenario {tmp}/adir: not a regular file"),
    case("envs list --native", "does not exist", ENVFACTORY_COMPILED_DIR="{tmp}/nope"),
    case("envs export hotels --out {tmp}/afile", "is a file"),
    case("envs export hotels --out /proc/envfactory-nowhere/x", "cannot create"),
    case("envs export hotels --tasks {tmp}/nope.jsonl --out {tmp}/o", "does not exist"),
    case("envs export --tasks {tmp}/empty.jsonl --out {tmp}/o", "no conversation in it"),
    case("envs export nosuch --out {tmp}/o", "nosuch"),
    case("envs export hotels --all --out {tmp}/o", "names or --all, not both"),
    case("envs validate nosuch", "nosuch"),
    case("envs health nosuch", "no environment 'nosuch'"),
    case("envs trust nosuch", "nosuch"),
    case("envs trust hotels --show --revoke", "--show and --revoke do not go together"),
    case("envs trust hotels --revoke --expect deadbeef", "--revoke and --expect do not go together"),
    case("envs metadata nosuch", "nosuch"),
    case("hub serve --tasks {tmp}/nope.jsonl", "no such tasks file"),
    case("hub serve --tasks {tmp}/empty.jsonl", "no task in it"),
    case("hub serve --tasks {tmp}/adir", "has no conversations.jsonl"),
    case("hub serve --tasks {tmp}/bad.json", "invalid JSON"),
    case("hub serve --app nosuch", "nosuch"),
    case("hub serve --transport http --port {busy}", "another process is listening there"),
    case("prompts show nosuch", "unknown prompt 'nosuch'"),
    case("prompts show code/generate --set nosuchvar=1", "has no such variable"),
    case("prompts show code/generate --set {tmp}/nope.yaml", ""),
    case("mcp config nosuch", "nosuch"),
    case("mcp config hotels --client nosuch", "unknown client 'nosuch'"),
    case("mcp config hotels --out {tmp}/adir", "is a folder"),
    case("mcp haproxy --backend nonsense", "bad balancer settings"),
    case("mcp haproxy --backend 127.0.0.1:8765", "listen on its own backend"),
    case("mcp haproxy --backend 127.0.0.1:1 --out /proc/envfactory-nowhere/x", "cannot"),
    case("corpus fetch --tarball {tmp}/nope.tgz", "nope.tgz"),
    case("corpus fetch --tarball {tmp}/bad.json", "bad.json"),
    case("corpus fetch --tarball {tmp}/adir", "adir is a folder"),
    case("envs health hotels --calls 99999999999", "--calls"),
    case("corpus list", "not fetched yet"),
    case("corpus show apis.guru", "not fetched yet"),
    case("corpus index", "not fetched yet"),
    case("corpus search pets", "not fetched yet"),
    case("corpus gaps", "not fetched yet"),
    case("corpus compile --out {tmp}/afile", "is a file"),
    case("corpus compile --out {tmp}/o", "not fetched yet"),
    case("corpus compile --out {tmp}/o --ray-address auto", "error: --ray-address needs --executor ray"),
    case("corpus search pets --domain nosuch", "--domain must be one of"),
    case("envgen run --metadata {tmp}/nope.json", "no such metadata file"),
    case("envgen run --metadata {meta} --domain travel", "a metadata file names its own domain", **SCRIPTED),
    case("envgen run --metadata {meta} --hint more", "--hint steer the search", **SCRIPTED),
    case("envgen run --n 0", "--n", **SCRIPTED),
    case("envgen run --metadata {meta} --threshold nan", "--threshold", **SCRIPTED),
    case("envgen run --metadata {meta} --threshold 7", "--threshold", **SCRIPTED),
    case("envgen run --metadata {meta} --budget -1", "--budget", **SCRIPTED),
    case("envgen run --metadata {tmp}/bad.json", "invalid JSON"),
    case("envgen run --metadata {tmp}/adir", "not a regular file"),
    case("envgen run --openapi {tmp}/bad.json", "not valid JSON"),
    case("envgen run --metadata {meta} --prompt code/generate={tmp}/nope.yaml", "does not exist"),
    case("envgen run --metadata {meta} --prompt nosuch/prompt={tmp}/bad.yaml", "unknown prompt 'nosuch/prompt'"),
    case("envgen run --metadata {meta}", "no LLM is configured for role 'code'"),
    case("envgen resume nosuch", "envgen threads"),
    case("envgen history nosuch", "no checkpoint for thread 'nosuch'"),
    case("graph build --out {tmp}/adir", "is a folder"),
    case("graph build --env hotels --no-llm --threshold 5 --out {tmp}/g.json", "--threshold"),
    case("graph build --env hotels --no-llm --threshold nan --out {tmp}/g.json", "--threshold"),
    case("graph build --out /proc/envfactory-nowhere/g.json", "cannot"),
    case("graph stats --graph {tmp}/nope.json", "no tool graph"),
    case("graph stats --graph {tmp}/bad.json", "invalid JSON"),
    case("graph show hotels --graph {tmp}/bad.json", "invalid JSON"),
    case("graph sample --graph {tmp}/bad.json", "invalid JSON"),
    case("graph sample --out {tmp}/adir", "is a folder"),
    case("graph sample --length 40..30", "MIN <= MAX"),
    case("graph export --graphml {tmp}/adir", "is a folder"),
    case("scaling fit {tmp}/nope.csv", "no such file"),
    case("scaling fit {tmp}/bad.json", "not valid JSON"),
    case("scaling fit {tmp}/empty.jsonl", ""),
    case("scaling suggest {tmp}/nope.csv --budget 100", "no such file"),
    case("scaling add {tmp}/t.csv --run {tmp}/nope --eval {tmp}/nope", "nope"),
    case("scaling simulate --out {tmp}/adir", "is a folder"),
    case("scaling simulate --out {tmp}/s.csv --ca nan", "--ca must be a finite number"),
    case("scaling fit {tmp}/nope.csv --json {tmp}/r.json --plot {tmp}/p.svgx", "not a figure format"),
    case("synth --config {tmp}/nope.yaml", "no such file"),
    case("synth extra --config {tmp}/nope.yaml", "unexpected extra argument(s) (extra)"),  # a command, no subcommands
    case("export {run} extra --format trl-sft --out {tmp}/o", "unexpected extra argument(s) (extra)"),
    case("eval {run} extra --out {tmp}/o", "unexpected extra argument(s) (extra)"),
    case("synth --config {tmp}/bad.yaml", "invalid YAML"),
    case("synth --config {tmp}/empty.jsonl", "is empty"),
    case("synth --config {tmp}/adir", "not a regular file"),
    case("synth --config {tmp}/llm.yaml", "no LLM is configured for role 'query'"),
    case("synth --config {tmp}/offline.yaml --out {tmp}/afile", "is a file"),
    case("synth --config {tmp}/unknown.yaml --out {tmp}/r", "unknown environment(s) ['nosuch']"),
    case("export {run} --format trl-sft --out {tmp}/afile", "is a file"),
    case("export {run} --format nosuch --out {tmp}/o", "'--format': 'nosuch' is not one of"),  # no 'Value error,'
    case("export {run} --format trl-grpo --per conversation --out {tmp}/o", "--per conversation shapes SFT rows"),
    case("export {run} --format trl-sft --distractors 5 --out {tmp}/o", "--distractors chooses distractor tools"),
    case("export {run} --format llamafactory --include-interactive --out {tmp}/o", "shapes RL rows"),
    case("export {run} --format trl-sft --out /proc/envfactory-nowhere/x", "cannot create"),
    case("export {tmp}/nope --format trl-sft --out {tmp}/o", "does not exist"),
    case("export {tmp}/empty.jsonl --format trl-sft --out {tmp}/o", "nothing to export"),
    case("export {tmp}/bad.json --format trl-sft --out {tmp}/o", "invalid JSON"),
    case("export {tmp}/adir --format verl --out {tmp}/o", "has no conversations.jsonl"),
    case("eval {run} --out {tmp}/o", "no LLM is configured for role 'eval'"),
    case("eval {run} --out {tmp}/afile", "is a file"),
    case("eval {tmp}/nope --out {tmp}/o", "does not exist", **SCRIPTED),
    case("eval --suite nosuch --out {tmp}/o", "unknown suite 'nosuch'", **SCRIPTED),
    case("eval {run} --out {run}", "is an `envfactory synth` folder", **SCRIPTED),
    case("eval {run} --out {tmp}/o --executor nosuch --limit 1", "--executor is local or ray", **SCRIPTED),
    case("eval {run} --out {tmp}/o --workers 2 --limit 1", "--workers", **SCRIPTED),
    case("contamination {tmp}/nope", "does not exist"),
    case("contamination {tmp}/empty.jsonl", "no conversation"),
    case("contamination {run} --json {tmp}/adir", "is a folder"),
    case("contamination /dev/null", "/dev/null is not a regular file"),
    case("contamination {run} --json {tmp}/afile/x.json", "afile is a file, not a folder"),
    # a model the eval role names that is not here: one line before any work (a reviewer's run scored 0 and exit 0)
    case("eval {run} --out {tmp}/o", "no such folder or GGUF file", **TRANSFORMERS, ENVFACTORY_LLM__MODEL="{tmp}/nope"),
    case("eval {run} --out {tmp}/o", "a file that is not a .gguf", **TRANSFORMERS, ENVFACTORY_LLM__MODEL="{tmp}/afile"),
    # a bad folder setting, an empty pool or prompt folder: one line, not a traceback or an empty table
    case("envgen threads", "/proc/envfactory-nowhere", ENVFACTORY_DATA_DIR="/proc/envfactory-nowhere/d"),
    case("envs list", "no environments in", ENVFACTORY_ENVS_DIR="{tmp}/adir"),
    case("envs health", "no environments in", ENVFACTORY_ENVS_DIR="{tmp}/adir"),
    case("prompts list", "no prompts in", ENVFACTORY_PROMPTS_DIR="{tmp}/adir"),
    case("serve hotels", "(environment variable ENVFACTORY_SERVE_EVENT_LOOP)", ENVFACTORY_SERVE_EVENT_LOOP="bogus"),
    case("serve hotels", "server limit 'max_sessions'", ENVFACTORY_SERVE_MAX_SESSIONS="0"),
    # an output that would replace what the command reads
    case("contamination {run} --json {run}/conversations.jsonl", "would overwrite"),
    case("contamination {run}/conversations.jsonl --json {run}/summary.json", "would overwrite"),  # the run's own
    case("scaling fit {tmp}/t.csv --json {tmp}/t.csv", "would overwrite"),
    case("graph sample --graph {tmp}/bad.json --out {tmp}/bad.json", "would overwrite"),
    case("graph export --graph {tmp}/bad.json --graphml {tmp}/bad.json", "would overwrite"),
    case("graph build --out {tmp}/g.json --graphml {tmp}/g.json", "would overwrite"),
    case("export {run} --format trl-sft --out {run}", "would overwrite"),
    case("export {run}/conversations.jsonl --format trl-sft --out {run}", "is an `envfactory synth` folder"),
    case("synth --config {tmp}/offline.yaml --out {sft}", "is an `envfactory export` folder"),
    case("eval {run} --out {sft} --limit 1", "is an `envfactory export` folder", **SCRIPTED),
    # numbers no run could finish: refused, not run until killed
    case("eval {run} --out {tmp}/o --attempts 1000000000000", "--attempts", **SCRIPTED),
    case("graph sample --n 1000000000000", "--n"),
    case("scaling fit {tmp}/nope.csv --restarts 1000000000000", "--restarts"),
    case("synth --config {tmp}/huge.yaml --out {tmp}/r", "more than one run plans"),
    # a config mistake found before the run's folder holds anything
    case("synth --config {tmp}/stray.yaml --out {tmp}/r", "holdout_envs names environment(s)"),
    case("synth --config {tmp}/many.yaml --out {tmp}/r", "A=1000 environments asked, but the run has 1"),
    case("synth --config {tmp}/twice.yaml --out {tmp}/r", "envs lists ['hotels'] more than once"),
    case("synth --config {tmp}/long.yaml --out {tmp}/r", "nothing to run: the plan has no unit"),
    case("mcp config --out {project}/configs/mcp_server.json", "would overwrite"),
    case("contamination {run} --n 1000000000", "--n"),
    case("scaling fit {tmp}/adir", "is a folder"),
    case("synth --config {tmp}/nograph.yaml --out {tmp}/r", "no tool graph here"),
    # found by a reviewer: the config's `out` skipped `--out`'s checks, `envs: []` meant every environment, a count
    # of `true` was 1, and a key given twice kept the last
    case("synth --config {tmp}/emptyout.yaml", "an empty path names no place to write"),
    case("synth --config {tmp}/fileout.yaml", "is a file: out names a folder"),
    case("synth --config {tmp}/noenvs.yaml --out {tmp}/r", "envs: List should have at least 1 item"),
    case("synth --config {tmp}/booleanT.yaml --out {tmp}/r", "T: Input should be a valid integer"),
    case("synth --config {tmp}/dupkey.yaml --out {tmp}/r", "the key 'mode' is given twice"),
]

# commands whose only input is the pool and settings: nothing a user types can be wrong beyond --help
NO_USER_INPUT = {"demo", "prompts list", "envgen threads"}

TRAINING_CASES: list[tuple[str, list[str], str]] = [
    ("sft", ["--model", "/nonexistent/model", "--data", "{sft}"], "no such folder"),
    ("sft", ["--profile", "cpu", "--data", "{grpo}"], "missing columns: completion"),
    ("sft", ["--profile", "cpu", "--data", "{tmp}/bad.json"], "not a JSON-lines dataset"),
    ("sft", ["--config", "{tmp}/nope.yaml"], "nope.yaml"),
    ("grpo", ["--profile", "cpu", "--data", "{sft}"], "missing columns"),
    ("grpo", ["--model", "/nonexistent/model", "--data", "{grpo}"], "no such folder"),
]


@functools.cache
def command_paths() -> frozenset[str]:
    """Every leaf command of the CLI, the plugin sub-apps included ("envs export", "synth", ...)."""
    cli._add_plugins(["envfactory", "--help"])  # every plugin, registered as `main` registers it
    found: set[str] = set()

    def walk(command: object, prefix: list[str]) -> None:
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, [*prefix, name])
        else:
            found.add(" ".join(prefix))

    walk(typer.main.get_command(cli.app), [])
    return frozenset(found)


def covered(argv: str) -> str:
    """The command an argv runs: the longest known command path that starts it."""
    words = argv.split()
    known = command_paths()
    for n in (2, 1):
        if " ".join(words[:n]) in known:
            return " ".join(words[:n])
    raise AssertionError(f"no command for {argv!r}")


def test_every_command_is_walked() -> None:
    walked = {covered(argv) for argv, _, _ in CASES} | NO_USER_INPUT
    assert command_paths() - walked == set(), "commands without their mistakes in CASES"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A project with one environment, the mistake files, a tiny real synth run and its two exports."""
    base = tmp_path_factory.mktemp("mistakes")
    project, tmp = base / "project", base / "tmp"
    shutil.copytree(ROOT / "envs" / "hotels", project / "envs" / "hotels")
    shutil.copytree(ROOT / "prompts", project / "prompts")
    shutil.copytree(ROOT / "configs", project / "configs")  # the trust pins: offline synth runs trusted code
    tmp.mkdir()
    (tmp / "afile").write_text("x\n")
    (tmp / "adir").mkdir()
    (tmp / "bad.json").write_text("{bad\n")
    (tmp / "bad.yaml").write_text("a: [\n")
    (tmp / "empty.jsonl").write_text("")
    (tmp / "llm.yaml").write_text("mode: llm\nenvs: [hotels]\n")
    (tmp / "offline.yaml").write_text("mode: offline\nenvs: [hotels]\n")
    (tmp / "unknown.yaml").write_text("mode: offline\nenvs: [nosuch]\n")
    (tmp / "misfit.json").write_text('{"hotels": 5}')
    (tmp / "many.yaml").write_text("mode: offline\nenvs: [hotels]\nA: 1000\n")
    (tmp / "twice.yaml").write_text("mode: offline\nenvs: [hotels, hotels]\n")
    (tmp / "long.yaml").write_text("mode: offline\nenvs: [hotels]\nchain_length: [40, 50]\n")
    (tmp / "huge.yaml").write_text("mode: offline\nenvs: [hotels]\nT: 1000000000000\n")
    (tmp / "stray.yaml").write_text("mode: offline\nenvs: [hotels]\nholdout_envs: [nosuch]\n")
    (tmp / "nograph.yaml").write_text(f"mode: offline\nenvs: [hotels]\ngraph: {tmp}/nope.json\n")
    (tmp / "emptyout.yaml").write_text('mode: offline\nenvs: [hotels]\nout: ""\n')
    (tmp / "fileout.yaml").write_text(f"mode: offline\nenvs: [hotels]\nout: {tmp}/afile\n")
    (tmp / "noenvs.yaml").write_text("mode: offline\nenvs: []\n")
    (tmp / "booleanT.yaml").write_text("mode: offline\nenvs: [hotels]\nT: true\n")
    (tmp / "dupkey.yaml").write_text("mode: offline\nenvs: [hotels]\nmode: llm\n")
    (tmp / "script.json").write_text("[]\n")
    meta = json.loads((ROOT / "envs" / "hotels" / "metadata.json").read_text())
    meta["name"] = "inns"
    (tmp / "meta.json").write_text(json.dumps(meta))
    values = {"tmp": str(tmp), "project": str(project), "meta": str(tmp / "meta.json")}
    values["script"] = str(tmp / "script.json")
    with pytest.MonkeyPatch.context() as mp:
        _environment(mp, values)
        run = base / "run"
        (tmp / "run.yaml").write_text(f"mode: offline\nenvs: [hotels]\nT: 6\nS: 1\nout: {run}\nplot: false\n")
        for argv in (f"synth --config {tmp}/run.yaml", f"export {run} --format trl-sft --out {base}/sft"):
            code, output = invoke(argv.split())
            assert code == 0, output
        code, output = invoke(f"export {run} --format trl-grpo --out {base}/grpo".split())
        assert code == 0, output
    values |= {"run": str(run), "sft": str(base / "sft"), "grpo": str(base / "grpo")}
    with socket.socket() as busy:  # a port another process listens on
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        values["busy"] = str(busy.getsockname()[1])
        yield values


def _environment(mp: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    mp.setenv("ENVFACTORY_ROOT", values["project"])
    mp.setenv("ENVFACTORY_BFCL", "false")
    mp.setenv("COLUMNS", "200")
    for name in ("ENVFACTORY_LLM__PROVIDER", "ENVFACTORY_COMPILED_DIR", "ENVFACTORY_DATA_DIR"):
        mp.delenv(name, raising=False)


def invoke(argv: list[str]) -> tuple[int, str]:
    """`envfactory ARGV` in this process: its exit code and everything it printed (stderr, then stdout)."""
    run = run_cli(argv)
    return run.code, run.stderr + run.stdout


def files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")}


def fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


@pytest.mark.parametrize(("argv", "needle", "env"), CASES, ids=[c[0] for c in CASES])
def test_a_mistake_is_one_line_and_leaves_nothing(
    scratch: dict[str, str], monkeypatch: pytest.MonkeyPatch, argv: str, needle: str, env: dict[str, str]
) -> None:
    _environment(monkeypatch, scratch)
    for name, value in env.items():
        monkeypatch.setenv(name, fill(value, scratch))
    tmp = Path(scratch["tmp"])
    before = files_under(tmp)
    args = [fill(word, scratch) for word in argv.split()]
    code, output = invoke(args)
    lines = [line for line in output.splitlines() if line.strip()]
    assert code != 0, output
    assert "Traceback" not in output, output
    assert len(lines) == 1 and lines[0].startswith("error:"), output
    assert fill(needle, scratch) in lines[0], output
    assert files_under(tmp) == before, "a mistake left something behind"


@pytest.mark.parametrize(("script", "argv", "needle"), TRAINING_CASES, ids=[" ".join(c[1]) for c in TRAINING_CASES])
def test_a_training_mistake_is_one_line(
    scratch: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    script: str,
    argv: list[str],
    needle: str,
) -> None:
    pytest.importorskip("trl")
    # an empty training cache, as on a fresh machine: the mistake is found before the tiny model is built
    cache = Path(scratch["tmp"]).parent / "training-cache"
    monkeypatch.setenv("ENVFACTORY_TRAINING_CACHE", str(cache))
    module = importlib.import_module(f"training.{script}")
    code = module.main([fill(a, scratch) for a in argv] + ["--output", f"{scratch['tmp']}/never"])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip() and not line.startswith(("INFO", "WARNING"))]
    assert code == 1, captured
    assert "Traceback" not in captured.err
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], captured.err
    assert not Path(scratch["tmp"], "never").exists()
    assert not cache.exists() or not any(cache.iterdir()), "work started before the mistake was found"


def test_sft_reads_both_trl_sft_formats(scratch: dict[str, str]) -> None:
    """`export --format trl-sft` writes prompt-completion rows (per turn) or `messages` rows (`--per
    conversation`); the SFT column check takes both and still refuses a GRPO export."""
    pytest.importorskip("trl")
    from training.runconfig import RunConfigError
    from training.runner import load_dataset_rows
    from training.sft import REQUIRED_COLUMNS, SFTRunConfig

    whole = Path(scratch["tmp"]) / "sft-conversations"
    with pytest.MonkeyPatch.context() as mp:
        _environment(mp, scratch)
        code, output = invoke(f"export {scratch['run']} --format trl-sft --out {whole} --per conversation".split())
    assert code == 0, output
    for data, columns in ((scratch["sft"], {"prompt", "completion"}), (str(whole), {"messages"})):
        rows = load_dataset_rows(
            SFTRunConfig(model="m", data=Path(data), output=Path(scratch["tmp"]) / "never"), REQUIRED_COLUMNS, "trl-sft"
        )
        assert len(rows) > 0 and columns <= set(rows.column_names)
    with pytest.raises(RunConfigError, match="missing columns: completion"):
        load_dataset_rows(
            SFTRunConfig(model="m", data=Path(scratch["grpo"]), output=Path(scratch["tmp"]) / "never"),
            REQUIRED_COLUMNS,
            "trl-sft",
        )


@pytest.mark.parametrize(
    ("variable", "value", "needle"),
    [
        ("ENVFACTORY_LLM__TEMPERATURE", "hot", "setting 'llm.temperature' (environment variable"),
        ("ENVFACTORY_HTTP_PORT", "0", "setting 'http_port'"),
        ("ENVFACTORY_LLM__MAX_TOKENS", "-5", "setting 'llm.max_tokens'"),
        ("ENVFACTORY_LLM__TOP_P", "7", "setting 'llm.top_p'"),
        ("ENVFACTORY_LLM__TEMPERATURE", "-3", "setting 'llm.temperature'"),
        ("ENVFACTORY_LLM__N_CTX", "-1", "setting 'llm.n_ctx'"),
        ("ENVFACTORY_TOOLGRAPH__EMBED_BACKEND", "bogus", "setting 'toolgraph.embed_backend'"),
        ("ENVFACTORY_TOOLGRAPH_EMBED_BACKEND", "bogus", "(environment variable ENVFACTORY_TOOLGRAPH_EMBED_BACKEND)"),
        ("ENVFACTORY_TOOLGRAPH__TURN_MIN", "6", "(environment variable ENVFACTORY_TOOLGRAPH__*)"),
        ("ENVFACTORY_TOOLGRAPH", "notjson", "ENVFACTORY_TOOLGRAPH must be a JSON object"),
        ("ENVFACTORY_DATA_DIR", "{tmp}/afile", "setting 'data_dir' (environment variable ENVFACTORY_DATA_DIR)"),
        ("ENVFACTORY_DATA_DIR", "{tmp}/afile/under", "is not a folder"),
        ("ENVFACTORY_ENVS_DIR", "{tmp}/nope", "does not exist"),
        ("ENVFACTORY_PROMPTS_DIR", "{tmp}/afile", "is not a folder"),
    ],
)
def test_a_bad_setting_in_the_environment_is_one_line(
    scratch: dict[str, str], monkeypatch: pytest.MonkeyPatch, variable: str, value: str, needle: str
) -> None:
    _environment(monkeypatch, scratch)
    monkeypatch.setenv(variable, fill(value, scratch))
    with warnings.catch_warnings():  # the one-underscore spelling also warns (tests/llm/test_onnx_embed.py)
        warnings.simplefilter("ignore", FutureWarning)
        code, output = invoke(["envs", "list"])
    lines = [line for line in output.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], output
    assert variable.split("__")[0] in lines[0]
