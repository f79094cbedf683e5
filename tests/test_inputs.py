"""Bounded reading of user files (`envfactory.inputs`) and the loaders that go through it.

Every file the CLI reads must be a regular file no larger than a limit (a FIFO is refused without
blocking, /dev/zero without reading), and every JSON/YAML document bounded in depth and expanded
size; each failure is one line naming the file, never a hang or a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envfactory.errors import EnvFactoryError
from envfactory.inputs import (
    MAX_INT_DIGITS,
    InputError,
    JsonlAppender,
    parse_json,
    parse_yaml,
    read_file_bytes,
    read_json,
    read_json_object,
    read_text,
    read_yaml,
    write_atomic,
)
from tests.support.paths import ROOT

DEEP = 100_000


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert text and "\n" not in text, text
    return text


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def _deep_json(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


def _alias_bomb() -> str:
    """9 levels of 9 aliases: 9**9 (387 million) strings once expanded, a few hundred bytes on disk."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for level in range(1, 10):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


# ---- read_file_bytes / read_text: regular files only, bounded --------------------------------------


@pytest.mark.timeout(20)
def test_a_fifo_is_refused_at_once_without_blocking(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path / "pipe")  # nobody writes to it: a blocking open or read would hang here
    start = time.monotonic()
    with pytest.raises(InputError, match=r"pipe: the file is not a regular file") as err:
        read_file_bytes(fifo)
    assert time.monotonic() - start < 2
    _one_line(err.value)
    for reader in (read_text, read_json, read_yaml):
        with pytest.raises(InputError, match="not a regular file"):
            reader(fifo)


@pytest.mark.timeout(20)
def test_devices_and_folders_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"/dev/zero: the file is not a regular file"):
        read_file_bytes(Path("/dev/zero"))
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")  # a harmless-looking name does not help
    with pytest.raises(InputError, match="not a regular file"):
        read_json(link)
    with pytest.raises(InputError, match="not a regular file"):
        read_file_bytes(tmp_path)


def test_missing_and_oversized_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nope\.json: no such state file"):
        read_file_bytes(tmp_path / "nope.json", what="state file")
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * 11)
    with pytest.raises(InputError, match=r"big\.txt: the file is 11 bytes, over the 10-byte limit") as err:
        read_file_bytes(big, max_bytes=10)
    _one_line(err.value)
    assert read_file_bytes(big, max_bytes=11) == b"x" * 11
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert read_text(empty) == ""


def test_invalid_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"caf\xe9\n")
    with pytest.raises(InputError, match=r"latin1\.txt: the file is not valid UTF-8 \(byte 3\)"):
        read_text(path)
    with pytest.raises(InputError, match=r"doc: not valid UTF-8 \(byte 4\)"):
        parse_json(b'"caf\xe9"', "doc")
    path.write_bytes(b'{"a": "caf\xe9"}')
    with pytest.raises(InputError, match="not valid UTF-8"):
        read_json(path)


# ---- JSON: depth, surrogates, malformed ------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("number", ["1e999", "-1e999", "1E400", "123456789e400"])
def test_a_number_past_a_floats_range_is_refused_where_json_constants_are(number: str) -> None:
    """`1e999` read as infinity: a served hub answered `{"result": Infinity}`, which no JSON parser reads (found by a
    reviewer). Where `NaN` and `Infinity` are refused (what a server takes from a client), so is it."""
    with pytest.raises(InputError, match="beyond a float's range"):
        parse_json(f'{{"numbers": [{number}, 1]}}', "body", constants=False)
    assert parse_json(f"[{number}]", "a file of ours") == [float(number)]  # (Python's own reading, where allowed)
    assert parse_json("[1e308, -2.5e-300, 0.1]", "body", constants=False) == [1e308, -2.5e-300, 0.1]


def test_json_nested_100k_deep_is_an_input_error_not_a_recursion_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"deep: JSON nested deeper than 100 levels") as err:
        parse_json(_deep_json(), "deep")
    _one_line(err.value)
    path = tmp_path / "deep.json"
    path.write_text('{"a": ' + _deep_json() + "}")
    with pytest.raises(InputError, match="nested deeper"):
        read_json(path)
    # the limit is exact: 100 levels pass, 101 do not
    assert parse_json(_deep_json(100), "ok") is not None
    with pytest.raises(InputError, match="nested deeper than 100"):
        parse_json(_deep_json(101), "too deep")
    with pytest.raises(InputError, match="nested deeper than 5"):
        parse_json(_deep_json(6), "small limit", max_depth=5)


def test_lone_surrogates_are_refused_unless_allowed() -> None:
    with pytest.raises(InputError, match=r"doc: a string holds a lone surrogate") as err:
        parse_json('{"name": "\\ud800"}', "doc")
    _one_line(err.value)
    with pytest.raises(InputError, match="lone surrogate"):
        parse_json('{"\\udc00": 1}', "doc")  # in a key too
    assert parse_json('{"name": "\\ud800"}', "doc", surrogates=True) == {"name": "\ud800"}
    assert parse_json('"\\ud83d\\ude00"', "doc") == "\U0001f600"  # a proper pair is fine


def test_malformed_json_names_the_place(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"doc: invalid JSON at line 2 column 1") as err:
        parse_json('{"a": 1,\n}', "doc")
    _one_line(err.value)
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(InputError, match=r"list\.json: the scenario must be a JSON object"):
        read_json_object(path, what="scenario")
    path.write_text('{"a": [1, {"b": null}]}')
    assert read_json_object(path) == {"a": [1, {"b": None}]}


# ---- YAML: aliases, cycles, depth ---------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    assert path.stat().st_size < 1000
    start = time.monotonic()
    with pytest.raises(InputError, match=r"bomb\.yaml: YAML nested deeper than 100 levels, or too large") as err:
        read_yaml(path)
    assert time.monotonic() - start < 5
    _one_line(err.value)


@pytest.mark.timeout(30)
def test_self_referential_and_deep_yaml_are_refused() -> None:
    with pytest.raises(InputError, match="YAML nested deeper"):
        parse_yaml("a: &a [*a]\n", "loop")
    with pytest.raises(InputError, match=r"deep: YAML nested") as err:
        parse_yaml(_deep_json(), "deep")  # flow sequences: JSON is YAML too
    _one_line(err.value)
    with pytest.raises(InputError, match=r"bad: invalid YAML at line \d+ column \d+: expected ','") as err:
        parse_yaml("a: 1\nb: [unclosed\n", "bad")
    _one_line(err.value)
    assert parse_yaml("a: &x [1, 2]\nb: *x\n", "shared") == {"a": [1, 2], "b": [1, 2]}  # plain aliases are fine


def test_long_integer_literals_are_refused_before_they_are_converted() -> None:
    """Python reads an integer literal in time quadratic in its digits (950 of 4,299 digits: 0.23 s)."""
    assert parse_json(str(2**2048), "x") == 2**2048
    assert parse_json("-" + "9" * MAX_INT_DIGITS, "x") == -int("9" * MAX_INT_DIGITS)
    with pytest.raises(InputError, match="641 digits") as err:
        parse_json('{"a": [' + "1" * (MAX_INT_DIGITS + 1) + "]}", "body")
    _one_line(err.value)
    assert parse_json('"' + "1" * 10_000 + '"', "x") == "1" * 10_000  # digits in a string are only text
    assert parse_json("1." + "1" * 10_000, "x") > 1  # floats are read in linear time
    # an OpenAPI YAML spec the same (a reviewer's 5,000-digit maxLength was an 84-line ValueError traceback)
    from envfactory.envgen.openapi import parse_openapi_yaml

    assert parse_openapi_yaml(f"a: {'9' * MAX_INT_DIGITS}\nb: 012\nc: !!int 0x1F", "s.yaml", error=InputError) == {
        "a": int("9" * MAX_INT_DIGITS),
        "b": 12,
        "c": 31,
    }
    for text, needle in ((f"a: -{'9' * 5000}", "5000 digits"), ("a: !!int 0xZZ", "not an integer")):
        with pytest.raises(InputError, match=needle) as err:
            parse_openapi_yaml(text, "s.yaml", error=InputError)
        _one_line(err.value)


# ---- write_atomic -------------------------------------------------------------------------------------------


def test_write_atomic_replaces_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "registry.json"
    write_atomic(path, "first\n")
    write_atomic(path, "second\n")
    assert path.read_text() == "second\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["registry.json"]  # no temp file left behind
    with pytest.raises(InputError, match=r"the folder .*missing does not exist") as err:
        write_atomic(tmp_path / "missing" / "x.json", "{}")
    _one_line(err.value)
    assert not (tmp_path / "missing").exists()


def test_write_atomic_never_writes_through_a_link_at_its_temporary_name(tmp_path: Path) -> None:
    """The temporary file's name is predictable (pid, thread): a link planted there (an environment folder's
    metadata.json is written this way) must not truncate and overwrite the file it points to."""
    victim = tmp_path / "victim"
    victim.write_text("HOST FILE\n")
    folder = tmp_path / "env"
    folder.mkdir()
    tmp = folder / f".metadata.json.{os.getpid()}.{threading.get_ident()}.tmp"
    os.symlink(victim, tmp)
    write_atomic(folder / "metadata.json", "{}\n")
    assert victim.read_text() == "HOST FILE\n"
    assert (folder / "metadata.json").read_text() == "{}\n" and not (folder / "metadata.json").is_symlink()
    assert sorted(p.name for p in folder.iterdir()) == ["metadata.json"]


@pytest.mark.timeout(60)
def test_a_failed_write_leaves_the_old_file_intact(tmp_path: Path) -> None:
    """A write cut short (here: the file size limit, as a full disk would) keeps the old file and no temp file."""
    path = tmp_path / "state.json"
    path.write_text('{"old": true}\n')
    script = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from envfactory.inputs import InputError, write_atomic\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    write_atomic(Path(sys.argv[1]), 'x' * 100_000)\n"
        "except InputError as e:\n"
        "    print(e)\n"
        "    sys.exit(3)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, cwd=ROOT, timeout=50
    )
    assert done.returncode == 3, done.stderr
    assert "cannot write the file" in done.stdout and done.stdout.count("\n") == 1
    assert path.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_failed_write_in_process_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "graph.json"
    path.write_text("old")

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(InputError, match="cannot write the file: No space left on device"):
        write_atomic(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["graph.json"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device that is always full)")
def test_a_full_disk_names_the_file_it_could_not_write() -> None:
    """write() and fsync() on a full disk raise ENOSPC naming no file: a run said "No space left on device" and
    not which of its files; the run logs' and the exports' writers name it (the CLI prints the name)."""
    from envfactory.export.files import write_jsonl
    from envfactory.records.models import ToolCall

    full = Path("/dev/full")
    with pytest.raises(OSError) as info:
        JsonlAppender(full).write('{"unit": 1}')
    assert info.value.errno == 28 and info.value.filename == str(full), info.value
    with pytest.raises(OSError) as info:
        write_jsonl([ToolCall(server="s", name="t", arguments={"x": "y" * 10_000})], full)
    assert info.value.errno == 28 and info.value.filename == str(full), info.value


# ---- the loaders: a FIFO, a deep or a malformed file is a one-line error ------------------------------------


def _tasks(p: Path) -> Any:
    from envfactory.metatools import load_tasks

    return load_tasks(p)


def _synth_config(p: Path) -> Any:
    from envfactory.tasks.plan import load_config

    return load_config(p)


def _state(p: Path) -> Any:
    from envfactory.env.state import State

    return State.load_json(p)


def _registry(p: Path) -> Any:
    from envfactory.env.registry import load_registry

    return load_registry(p)


def _openapi(p: Path) -> Any:
    from envfactory.envgen.openapi import load_openapi

    return load_openapi(p)


def _prompt(p: Path) -> Any:
    from envfactory.llm.prompts import load_prompt_file

    return load_prompt_file("demo/x", p)


def _script(p: Path) -> Any:
    from envfactory.llm.scripted import load_script

    return load_script(p)


def _table(p: Path) -> Any:
    from envfactory.scaling.table import load_table

    return load_table(p)


def _graph(p: Path) -> Any:
    from envfactory.toolgraph.io import load_graph

    return load_graph(p)


def _synth_jsonl(p: Path) -> Any:
    from envfactory.tasks.plan import read_jsonl

    return read_jsonl(p)


def _bfcl_jsonl(p: Path) -> Any:
    from envfactory.suites.bfcl.suites import read_jsonl

    return read_jsonl(p)


def _conversations(p: Path) -> Any:
    from envfactory.export.files import load_conversations

    return load_conversations(p)


def _run_config(p: Path) -> Any:
    from training.runconfig import read_config_file

    return read_config_file(p)


LOADERS: list[tuple[str, Callable[[Path], Any], str]] = [
    ("tasks.jsonl", _tasks, "HubError"),
    ("synth.yaml", _synth_config, "SynthConfigError"),
    ("state.json", _state, "ScenarioError"),
    ("mcp_server.json", _registry, "RegistryError"),
    ("api.yaml", _openapi, "OpenAPIError"),
    ("api.json", _openapi, "OpenAPIError"),
    ("prompt.yaml", _prompt, "PromptError"),
    ("script.yaml", _script, "LLMConfigError"),
    ("runs.jsonl", _table, "RunTableError"),
    ("runs.json", _table, "RunTableError"),
    ("graph.json", _graph, "ToolGraphError"),
    ("conversations.jsonl", _synth_jsonl, "SynthConfigError"),
    ("BFCL_v4_x.json", _bfcl_jsonl, "ScenarioError"),
    ("run.yaml", _run_config, "RunConfigError"),
]
IDS = [f"{fn.__name__.strip('_')}-{name}" for name, fn, _ in LOADERS]


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("name", "load", "error"), LOADERS, ids=IDS)
def test_a_fifo_is_a_one_line_error_not_a_hang(
    tmp_path: Path, name: str, load: Callable[[Path], Any], error: str
) -> None:
    fifo = _fifo(tmp_path / name)
    start = time.monotonic()
    with pytest.raises(Exception) as err:
        load(fifo)
    assert time.monotonic() - start < 2
    assert type(err.value).__name__ == error
    assert isinstance(err.value, EnvFactoryError)
    assert "not a regular file" in _one_line(err.value) and name in str(err.value)


def _deep_document(name: str) -> str:
    if name.endswith(".jsonl"):
        return _deep_json() + "\n"
    if name.endswith(".yaml"):
        return "key: " + _deep_json() + "\n"
    return '{"a": ' + _deep_json() + "}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "load", "error"), LOADERS, ids=IDS)
def test_a_100k_deep_document_is_a_one_line_error(
    tmp_path: Path, name: str, load: Callable[[Path], Any], error: str
) -> None:
    path = tmp_path / name
    path.write_text(_deep_document(name))
    with pytest.raises(Exception) as err:
        load(path)
    assert type(err.value).__name__ == error
    assert "nested" in _one_line(err.value) and name in str(err.value)


@pytest.mark.parametrize(("name", "load", "error"), LOADERS, ids=IDS)
def test_invalid_utf8_is_a_one_line_error(tmp_path: Path, name: str, load: Callable[[Path], Any], error: str) -> None:
    path = tmp_path / name
    path.write_bytes(b'{"name": "caf\xe9"}\n')
    with pytest.raises(Exception) as err:
        load(path)
    assert type(err.value).__name__ == error
    assert "UTF-8" in _one_line(err.value) and name in str(err.value)


def test_registry_messages_keep_their_advice(tmp_path: Path) -> None:
    from envfactory.env.registry import Registry, RegistryError, load_registry, save_registry

    path = tmp_path / "mcp_server.json"
    path.write_bytes(b'{"mcpServers": {"caf\xe9": {}}}')
    with pytest.raises(RegistryError, match=r"mcp_server\.json: not valid UTF-8 \(byte 20\); fix or delete it"):
        load_registry(path)
    path.write_text("{")
    with pytest.raises(RegistryError, match=r"invalid JSON at line 1.*; fix or delete it"):
        load_registry(path)
    path.write_text('{"mcpServers": {"hotels": {"command": 1}}}')
    with pytest.raises(
        RegistryError,
        match=r"mcp_server\.json: \d+ validation errors? for Registry: field 'mcpServers\.hotels\.command': .*; fix",
    ):
        load_registry(path)
    assert load_registry(tmp_path / "absent.json") == Registry()
    save_registry(path, Registry())
    assert load_registry(path) == Registry()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mcp_server.json"]


def test_a_deep_jsonl_line_names_its_line(tmp_path: Path) -> None:
    from envfactory.metatools import HubError, load_tasks
    from envfactory.tasks.plan import SynthConfigError, read_jsonl

    path = tmp_path / "conversations.jsonl"
    path.write_text("\n" + _deep_json() + "\n")  # blank lines are skipped, but counted
    with pytest.raises(SynthConfigError, match=r"conversations\.jsonl:2: JSON nested deeper than 100 levels; fix"):
        read_jsonl(path)
    with pytest.raises(HubError, match=r"conversations\.jsonl: line 2: JSON nested deeper") as err:
        load_tasks(path)
    assert err.value.code == "invalid_tasks_file"


def test_the_synth_jsonl_reader_still_repairs_a_torn_tail(tmp_path: Path) -> None:
    from envfactory.tasks.plan import read_jsonl

    path = tmp_path / "dropped.jsonl"
    path.write_bytes(b'{"key": "a"}\n{"key": "b", "co')
    assert read_jsonl(path) == [{"key": "a"}]
    assert path.read_bytes() == b'{"key": "a"}\n'
    assert read_jsonl(tmp_path / "absent.jsonl") == []


def test_a_torn_tail_is_cut_in_place_never_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reviewer killed a resume while it repaired a 1.4 GB log by rewriting it: the file was left empty, every
    finished unit lost, and the next run started over. The repair cuts the torn line off in place."""
    from envfactory.inputs import read_jsonl_log

    path = tmp_path / "conversations.jsonl"
    whole = b"".join(b'{"key": "%d"}\n' % i for i in range(1000))
    path.write_bytes(whole + b'{"key": "torn')
    inode = path.stat().st_ino

    def rewrite(*_: object, **__: object) -> None:
        raise AssertionError("the repair rewrote the whole file")

    monkeypatch.setattr(Path, "write_bytes", rewrite)
    monkeypatch.setattr(Path, "write_text", rewrite)
    assert len(read_jsonl_log(path)) == 1000
    assert path.read_bytes() == whole and path.stat().st_ino == inode


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_a_log_line_ends_at_a_newline_only(tmp_path: Path, separator: str) -> None:
    """pydantic writes U+2028, U+2029 and U+0085 inside a JSON string as they are (a real API spec's description
    holds them: bunq's): a log read with `splitlines()` cut such a line in two, and a resume stopped at "invalid
    JSON ...; fix or remove it to resume"."""
    from envfactory.inputs import iter_jsonl_log, read_jsonl_log

    path = tmp_path / "conversations.jsonl"
    rows = [{"id": "a", "text": f"one{separator}two"}, {"id": "b", "text": "plain"}]
    JsonlAppender(path).write(json.dumps(rows[0], ensure_ascii=False))
    JsonlAppender(path).write(json.dumps(rows[1], ensure_ascii=False))
    assert separator.encode() in path.read_bytes()
    assert read_jsonl_log(path) == rows == list(iter_jsonl_log(path))


def test_a_log_is_read_a_line_at_a_time(tmp_path: Path) -> None:
    """A large run's log (up to 2 GB) is never held whole to resume it: rows come as the file is read, and a bad
    line is named by its number and byte."""
    from envfactory.inputs import iter_jsonl_log

    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"n": 1}\n\n{"n": 2}\n{"n": "\xff"}\n')
    rows = iter_jsonl_log(path)
    assert next(rows) == {"n": 1} and next(rows) == {"n": 2}
    with pytest.raises(InputError, match=r"not valid UTF-8 \(byte 26\)"):
        next(rows)


def test_export_skips_a_last_line_torn_mid_character(tmp_path: Path) -> None:
    from envfactory.export.errors import ExportError
    from envfactory.export.files import load_conversations

    path = tmp_path / "conversations.jsonl"
    path.write_bytes(b'{"id": "caf' + "é".encode()[:1])  # killed halfway through a 2-byte character
    assert load_conversations(path) == []
    path.write_bytes(b'{"id": "caf\xe9"}\n')  # a whole line that is not UTF-8: an error, not a torn write
    with pytest.raises(ExportError, match=r"conversations\.jsonl: not valid UTF-8 \(byte 11\)"):
        load_conversations(path)


def test_prompt_folder_files_are_bounded(tmp_path: Path) -> None:
    from envfactory.config import Settings
    from envfactory.export.chat_template import tool_chat_template
    from envfactory.export.errors import ExportError
    from envfactory.export.turns import WORDING_FILE, load_wording
    from envfactory.tasks.template import TEMPLATE_FILE, TemplateError, load_template

    _fifo(tmp_path / TEMPLATE_FILE)
    _fifo(tmp_path / WORDING_FILE)
    _fifo(tmp_path / "chat_templates" / "tool_chat.jinja")
    with pytest.raises(TemplateError, match=r"query template .*en\.yaml: the file is not a regular file"):
        load_template(tmp_path)
    with pytest.raises(ExportError, match=r"export wording .*en\.yaml: the file is not a regular file"):
        load_wording(tmp_path)
    with pytest.raises(ExportError, match=r"chat template .*tool_chat\.jinja: the file is not a regular file"):
        tool_chat_template(Settings(root=ROOT, prompts_dir=tmp_path))


def test_prompt_folder_files_that_do_not_fit_their_model_name_the_file(tmp_path: Path) -> None:
    from envfactory.export.errors import ExportError
    from envfactory.export.turns import WORDING_FILE, load_wording
    from envfactory.tasks.conversation import PHRASINGS_FILE, WordingError
    from envfactory.tasks.conversation import WORDING_FILE as CONVERSATION_WORDING
    from envfactory.tasks.conversation import load_wording as conversation_wording
    from envfactory.tasks.template import TEMPLATE_FILE, TemplateError, load_template

    for rel in (TEMPLATE_FILE, WORDING_FILE, CONVERSATION_WORDING, PHRASINGS_FILE):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("unexpected: 1\n")
    with pytest.raises(TemplateError, match=r"query template .*\.yaml: \d+ validation errors? for QueryTemplate"):
        load_template(tmp_path)
    with pytest.raises(ExportError, match=r"export wording .*en\.yaml: \d+ validation errors? for ExportWording"):
        load_wording(tmp_path)
    with pytest.raises(WordingError, match=r"conversation wording .*\.yaml: \d+ validation errors? for Wording"):
        conversation_wording(tmp_path)
    with pytest.raises(TemplateError, match=r"\.yaml: .* for QueryTemplate: field '\w+': Field required"):
        load_template(tmp_path)  # the first problem, with its field


def test_a_yaml_alias_bomb_synth_config_is_refused(tmp_path: Path) -> None:
    from envfactory.tasks.plan import SynthConfigError, load_config

    path = tmp_path / "synth.yaml"
    path.write_text(_alias_bomb())
    start = time.monotonic()
    with pytest.raises(SynthConfigError, match=r"synth config .*synth\.yaml: YAML nested deeper"):
        load_config(path)
    assert time.monotonic() - start < 5


def test_sources_skip_a_fifo_and_a_deep_spec(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from envfactory.envgen.sources import read_source

    fifo = _fifo(tmp_path / "notes.md")
    deep = tmp_path / "api.json"
    deep.write_text(_deep_json())
    with caplog.at_level("WARNING"):
        assert read_source(fifo) is None
        assert read_source(deep) is None
    assert "not a regular file" in caplog.text and "nested deeper" in caplog.text


def test_run_table_bom_and_messages(tmp_path: Path) -> None:
    from envfactory.scaling.table import RunTableError, load_table

    path = tmp_path / "runs.csv"
    path.write_bytes("\ufeffA,T,S,D,score\n1,2,1,1,0.5\n".encode())
    assert len(load_table(path).runs) == 1  # a BOM is still not a column name
    path.write_bytes(b"A,T,S,D,score\n1,2,1,1,0\xff5\n")
    with pytest.raises(RunTableError, match=r"runs\.csv: not UTF-8 text \(byte \d+\)"):
        load_table(path)


def test_a_set_override_that_is_not_yaml_is_a_config_error() -> None:
    import argparse

    from training.runconfig import RunConfigError, add_common_arguments, overrides_from

    parser = argparse.ArgumentParser()
    add_common_arguments(parser, Path("config.yaml"))
    assert overrides_from(parser.parse_args(["--set", "trainer.lr=[1, 2]"]))["trainer"]["lr"] == [1, 2]
    with pytest.raises(RunConfigError, match=r"--set 'trainer\.lr=\[1, 2': invalid YAML") as err:
        overrides_from(parser.parse_args(["--set", "trainer.lr=[1, 2"]))
    _one_line(err.value)
    with pytest.raises(RunConfigError, match="YAML nested"):
        overrides_from(parser.parse_args(["--set", "x=" + _deep_json(1000)]))


@given(st.lists(st.dictionaries(st.text(max_size=5), st.text(max_size=12), max_size=3), max_size=6))
def test_json_lines_gives_back_every_document_whatever_its_strings_hold(docs: list[dict[str, str]]) -> None:
    """Any document written one a line (unescaped, as pydantic writes: U+2028, U+0085, a lone CR inside strings) is
    read back as one line; the readers of tasks files, BFCL data and scaling tables use it."""
    from envfactory.inputs import json_lines

    text = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
    assert [json.loads(line) for _, line in json_lines(text)] == docs


def test_a_bfcl_data_file_keeps_a_line_separator_inside_a_string(tmp_path: Path) -> None:
    from envfactory.suites.bfcl.suites import read_jsonl

    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"id": "a", "q": "x\u2028y"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_jsonl(path) == [{"id": "a", "q": "x\u2028y"}]


def test_a_log_that_is_a_directory_is_refused_in_words_and_keeps_no_descriptor(tmp_path: Path) -> None:
    from envfactory.inputs import read_jsonl_log

    folder = tmp_path / "conversations.jsonl"
    folder.mkdir()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(InputError, match="not a regular file"):
            read_jsonl_log(folder)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_log_that_grows_past_the_bound_while_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound holds for a tail without a newline too (it was read whole, then cut off as torn)."""
    import envfactory.inputs as inputs

    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a": 1}\n')
    real = os.fstat

    def grow(fd: int) -> os.stat_result:
        st = real(fd)
        with path.open("ab") as f:
            f.write(b"x" * 10_000)
        return st

    monkeypatch.setattr(inputs, "MAX_LOG_BYTES", 100)
    monkeypatch.setattr(inputs.os, "fstat", grow)
    with pytest.raises(InputError, match="over the 100-byte limit"):
        inputs.read_jsonl_log(path)
    monkeypatch.setattr(inputs.os, "fstat", real)
    assert path.stat().st_size == 10_009  # nothing cut
