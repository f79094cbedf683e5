"""Untrusted text reaches the terminal escaped (issue 24): Rich markup printed as written, control characters
made visible, over-long or malformed environment names one-line errors.

Random strings with markup brackets, backslashes, ESC / C1 / other control characters and newlines go
through the helpers (`envfactory.terminal`), through the CLI in-process (`main()`, as the
`envfactory` script runs it) and, for what an environment folder holds, through the CLI as a subprocess
on environment folders in tmp_path (untrusted: loaded in the OS sandbox).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from rich.markup import render
from rich.table import Table
from rich.text import Text

from envfactory.cli.main import main
from envfactory.config import Settings
from envfactory.env.metadata import ENV_NAME, EnvMetadata, ToolSpec
from envfactory.envgen.register import GeneratedEnvironment, RegistrationError, register
from envfactory.terminal import SafeConsole, json_text, print_json, safe, visible
from tests.support.paths import ROOT

# what must never reach the terminal raw: C0 but \t and \n, DEL, C1
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# what must not reach it raw either: bidi marks and the invisible format characters (zero-width, tags...)
# (U+2060–206F whole: invisible operators, bidi isolates, the deprecated format controls U+206A–206F)
INVISIBLE = re.compile("[\xad\u061c\u180e\u200b-\u200f\u2060-\u206f\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]")
NASTY = "\x1b[2J \x1b]0;title\x07 \x9b31m [/x] [bold]"  # clear screen, set the title (OSC), C1 CSI, markup

# random text: markup brackets and tags, backslashes, escape sequences, C0 / C1 / DEL, bidi overrides,
# newlines, lone surrogates, and ordinary characters
_PIECES = [*"[]/\\ab #@=:\n\t\r\x00\x07\x1b\x7f\x85\x9b\u202e\ud800é", "[/x]", "[b]", "[/]", "\\[", "[red]", "\x1b[2J"]
_PIECES += [*"\u200b\u200d\u200f\u061c\ufeff\xad\u2060", "\U000e0041\U000e0042", "\U0001f600"]  # invisible; an emoji
texts = st.lists(st.sampled_from(_PIECES) | st.text(max_size=3), max_size=12).map("".join)


def assert_clean(output: str | bytes) -> None:
    """No raw control character (ESC included), no traceback."""
    text = output.decode("utf-8", "surrogateescape") if isinstance(output, bytes) else output
    found = RAW.search(text) or INVISIBLE.search(text)
    assert found is None, f"raw {found.group()!r} at {found.start()}: {text[max(0, found.start() - 40) :][:120]!r}"
    assert "Traceback" not in text, text


# ---------------------------------------------------------------------------------------------- the helpers


@settings(max_examples=800, deadline=None)
@given(texts)
@example("a\u206ab")  # a deprecated format control: escaped (the test's list had stopped at U+2064)
def test_visible_leaves_no_control_character_and_changes_nothing_else(text: str) -> None:
    shown = visible(text)
    assert RAW.search(shown) is None and "\u202e" not in shown
    assert not re.search("[\ud800-\udfff]", shown)  # encodable
    assert not INVISIBLE.search(shown)
    escaped = re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069\u2028\u2029]", text)
    if not escaped and not INVISIBLE.search(text):
        assert shown == text


@settings(max_examples=800, deadline=None)
@given(texts)
def test_safe_prints_the_text_as_written_wherever_it_is_put(text: str) -> None:
    """Escaped markup: `[/x]` is text, backslashes keep their number, and what follows the text is unaffected."""
    shown = visible(text)
    for before, after, plain_before, plain_after in [
        ("", "", "", ""),
        ("[red]error:[/red] ", "", "error: ", ""),
        ("[red]", "[/red]: more", "", ": more"),
        ("a ", "] b", "a ", "] b"),  # a `[x` at the end of the text is not closed into a tag by the `]`
        ("", "b] c", "", "b] c"),
        ("", "[bold]y[/bold]", "", "y"),  # trailing backslashes do not escape the tag after them
    ]:
        assert render(before + safe(text) + after, emoji=False).plain == plain_before + shown + plain_after


@settings(max_examples=300, deadline=None)
@given(texts, texts)
def test_a_console_renders_no_raw_control_character(cell: str, line: str) -> None:
    """Table cells, markup lines and JSON through `SafeConsole`, plain and with colours: only Rich's own codes."""
    for terminal in (False, True):
        buffer = io.StringIO()
        console = SafeConsole(file=buffer, width=100, force_terminal=terminal, color_system="standard")
        table = Table("name", "source")
        table.add_row(safe(cell), "[green]ok[/green]")
        console.print(table)
        console.print(f"[red]{safe(line)}[/red]: {safe(cell)}", highlight=False, soft_wrap=True)
        print_json(console, {"message": line, cell: [cell]}, is_text=False)
        console.print(Text(f"not escaped by the caller: {cell}"))  # the net under `safe`
        output = re.sub(r"\x1b\[[0-9;]*m", "", buffer.getvalue())  # Rich's styles
        assert_clean(output)


def test_invisible_characters_are_shown() -> None:
    """`hotels\u200b` must not pass for `hotels`, nor tag characters carry text no one sees."""
    assert visible("hotels\u200b") == "hotels\\u200b"
    assert visible("ok\U000e0041\U000e0042") == "ok\\U000e0041\\U000e0042"
    assert visible("a\u200fb\u061cc\ufeff") == "a\\u200fb\\u061cc\\ufeff"
    assert visible("\U0001f600 é") == "\U0001f600 é"  # an emoji and accents are text
    assert json.loads(json_text(json.dumps({"k": "x\U000e0041\u200b"}, ensure_ascii=False))) == {
        "k": "x\U000e0041\u200b"
    }
    assert INVISIBLE.search(json_text(json.dumps(["\U000e0041"], ensure_ascii=False))) is None


@settings(max_examples=300, deadline=None)
@given(texts)
def test_json_keeps_its_value_with_control_characters_as_escapes(text: str) -> None:
    data = {"k": text, text: [text, 1]}
    shown = json_text(json.dumps(data, ensure_ascii=False))
    assert RAW.search(shown) is None and INVISIBLE.search(shown) is None
    assert json.loads(shown) == data
    buffer = io.StringIO()
    print_json(SafeConsole(file=buffer, width=60), data, is_text=False)
    assert_clean(buffer.getvalue())
    assert json.loads(buffer.getvalue()) == data  # still the same JSON, printed


# ------------------------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["hotels\n", "a" * 65, "a" * 300, "ho tels", "1hotels", "ho/tels", "", "hotels\x1b"])
def test_an_environment_name_is_matched_whole_and_at_most_64_characters(name: str) -> None:
    meta = json.loads((ROOT / "envs" / "hotels" / "metadata.json").read_text())
    with pytest.raises(ValueError, match="not a valid environment name"):
        EnvMetadata.model_validate({**meta, "name": name})
    assert EnvMetadata.model_validate({**meta, "name": "a" * 64}).name == "a" * 64


def test_a_tool_name_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(ValueError, match="not a valid tool name"):
        ToolSpec(name="ping\n", description="d", kind="read")


def test_register_refuses_a_300_character_name_in_one_line(tmp_path: Path) -> None:
    """It reached the file system: OSError ENAMETOOLONG. Metadata built without validation, as a checkpoint could."""
    meta = json.loads((ROOT / "envs" / "hotels" / "metadata.json").read_text())
    valid = EnvMetadata.model_validate(meta)
    long_meta = EnvMetadata.model_construct(**{**dict(valid), "name": "a" * 300})
    env = GeneratedEnvironment.model_construct(metadata=long_meta, code="", scenarios=[], search=None, reports=[])
    with pytest.raises(RegistrationError, match="not a valid environment name") as caught:
        register(env, Settings(root=tmp_path, bfcl=False))
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200
    assert not (tmp_path / "envs").exists() or not any((tmp_path / "envs").iterdir())


# ------------------------------------------------------------------------------- the CLI, in-process


@contextlib.contextmanager
def _environ(project: Path) -> Iterator[None]:
    values = {
        "ENVFACTORY_ROOT": str(project),
        "ENVFACTORY_BFCL": "false",
        "ENVFACTORY_PROMPTS_DIR": str(ROOT / "prompts"),
        "COLUMNS": "200",
    }
    with mock.patch.dict(os.environ, values):
        yield


def run_main(project: Path, *args: str) -> tuple[int, str, str]:
    """`envfactory ARGS` as the script runs it (main(), which prints errors), in this process."""
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with (
        _environ(project),
        mock.patch.object(sys, "argv", ["envfactory", *args]),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            main()
        except SystemExit as e:
            code = e.code
    return (code if isinstance(code, int) else 1), out.getvalue(), err.getvalue()


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "envs" / "hotels", tmp_path / "envs" / "hotels")
    return tmp_path


# every command that takes an environment name: NAME stands for it
NAME_COMMANDS = [
    ["envs", "validate", "NAME"],
    ["envs", "health", "NAME"],
    ["envs", "trust", "NAME"],
    ["envs", "metadata", "NAME"],
    ["envs", "export", "NAME", "--out", "OUT"],
    ["serve", "NAME"],
    ["call", "NAME", "search_hotels"],
    ["hub", "serve", "--app", "NAME"],
    ["mcp", "config", "NAME"],
]


def _command(template: list[str], name: str, project: Path) -> list[str]:
    return [name if a == "NAME" else str(project / "export") if a == "OUT" else a for a in template]


def assert_one_line_error(code: int, out: str, err: str, needle: str = "") -> None:
    assert code == 1, (code, out, err)
    assert_clean(out + err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err


BAD_NAMES = {"300": "a" * 300, "nl": "hotels\n", "path": "hotels/../hotels", "esc": f"x{NASTY}"}


@pytest.mark.parametrize("template", NAME_COMMANDS, ids=lambda t: " ".join(t[:2]))
@pytest.mark.parametrize("name", list(BAD_NAMES.values()), ids=list(BAD_NAMES))
def test_every_command_taking_an_environment_name_refuses_a_bad_one_in_one_line(
    project: Path, template: list[str], name: str
) -> None:
    code, out, err = run_main(project, *_command(template, name, project))
    assert_one_line_error(code, out, err, "is not an environment name")
    assert len(err) < 400  # the name is cut


names = texts.filter(lambda n: not ENV_NAME.fullmatch(n) and not n.startswith("-"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=names, index=st.integers(0, len(NAME_COMMANDS) - 1))
def test_random_names_are_one_line_errors_with_nothing_raw(project: Path, name: str, index: int) -> None:
    code, out, err = run_main(project, *_command(NAME_COMMANDS[index], name, project))
    assert_one_line_error(code, out, err, "is not an environment name")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts)
def test_random_error_messages_print_one_error_with_nothing_raw(project: Path, text: str) -> None:
    """An error whose message holds the text (an unknown prompt), and a usage error (an unknown option)."""
    assume(not text.startswith("-") and "\x00" not in text)
    code, out, err = run_main(project, "prompts", "show", f"p{text}")
    assert code == 1 and err.startswith("error: unknown prompt 'p"), err
    assert_clean(out + err)
    code, out, err = run_main(project, "envs", "list", f"--bogus{text}")
    assert code == 2 and err.startswith("error: "), err
    assert_clean(out + err)


def test_an_error_message_with_escape_sequences_prints_them_visible(project: Path) -> None:
    """They were printed raw: an error naming a prompt that clears the screen cleared it."""
    code, out, err = run_main(project, "prompts", "show", f"p{NASTY}")
    assert_one_line_error(code, out, err, "unknown prompt 'p\\x1b[2J \\x1b]0;title\\x07 \\x9b31m [/x] [bold]'")
    code, out, err = run_main(project, "envs", "list", f"--x{NASTY}")
    assert code == 2 and "No such option: --x\\x1b[2J" in err, err
    assert_clean(out + err)


def test_a_bug_s_traceback_is_printed_with_its_message_made_visible(project: Path) -> None:
    with mock.patch("envfactory.cli.main._pool", side_effect=RuntimeError(f"boom {NASTY}")):
        code, _, err = run_main(project, "envs", "list")
    assert code == 1 and "Traceback" in err and "RuntimeError: boom \\x1b[2J" in err
    assert RAW.search(err) is None


# ------------------------------------------------------------------ the CLI as a subprocess, on env folders


def run(project: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "ENVFACTORY_ROOT": str(project), "ENVFACTORY_BFCL": "false", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "envfactory.cli", *args], env=env, capture_output=True, timeout=180)


def add_env(project: Path, name: str, *, metadata: dict[str, object] | None = None, code: str | None = None) -> Path:
    """A copy of the bundled hotels environment named NAME, with metadata fields or its code replaced."""
    folder = project / "envs" / name
    shutil.copytree(ROOT / "envs" / "hotels", folder)
    meta = json.loads((folder / "metadata.json").read_text())
    (folder / "metadata.json").write_text(json.dumps({**meta, "name": name, **(metadata or {})}))
    source = (folder / "env.py").read_text().replace('"hotels",', f'"{name}",', 1)
    (folder / "env.py").write_text(code if code is not None else source)
    return folder


def test_an_import_error_with_markup_and_escapes_is_a_validation_problem(project: Path) -> None:
    """`[/x]` in an import error ended `envs validate` in a MarkupError traceback; its ESC sequences went raw."""
    add_env(project, "loud", code=f"raise ImportError({NASTY!r})\n")
    res = run(project, "envs", "validate", "--no-health")
    assert_clean(res.stdout + res.stderr)
    assert res.returncode == 1
    assert res.stderr.decode().strip() == "error: 1 of 2 environments failed validation: loud"
    assert "ImportError: \\x1b[2J \\x1b]0;title\\x07 \\x9b31m [/x] [bold]" in res.stdout.decode()


def test_metadata_fields_with_markup_and_escapes_are_listed_as_written(project: Path) -> None:
    """`"source": "[/x]"` in an environment's metadata.json crashed `envs list`."""
    folder = add_env(project, "src", metadata={"source": "[/x] \x1b[2J", "description": f"d {NASTY}"})
    shutil.copy(folder / "scenarios" / "default.json", folder / "scenarios" / "[red]x\x1b[31m.json")
    res = run(project, "envs", "list")
    assert_clean(res.stdout + res.stderr)
    assert res.returncode == 0, res.stderr
    listing = res.stdout.decode()
    assert "[/x] \\x1b[2J" in listing and "[red]x\\x1b[31m" in listing
    res = run(project, "envs", "validate", "src", "--no-health")
    assert_clean(res.stdout + res.stderr)
    assert res.returncode == 0, res.stderr


def test_a_folder_name_with_escapes_and_markup_is_listed_visible(project: Path) -> None:
    """A folder name is the environment folder's too: it went into the table raw (ESC) and as markup."""
    shutil.copytree(ROOT / "envs" / "hotels", project / "envs" / "bad\x1b[2J\x9b31m[bold]x")
    res = run(project, "envs", "list")
    assert_clean(res.stdout + res.stderr)
    assert res.returncode == 0, res.stderr
    assert "bad\\x1b[2J\\x9b31m[bold]x" in res.stdout.decode() and "broken" in res.stdout.decode()


def test_over_long_and_newline_names_in_a_real_process(project: Path) -> None:
    for args in (
        ["envs", "trust", "a" * 300],
        ["envs", "metadata", "a" * 300],
        ["call", "hotels\n", "search_hotels"],
        ["graph", "show", "a" * 300],  # a sub-app, loaded when named
        ["graph", "build", "--env", "a" * 300],
    ):
        res = run(project, *args)
        assert res.returncode == 1, res
        assert_clean(res.stdout + res.stderr)
        lines = res.stderr.decode().splitlines()
        assert len(lines) == 1 and "is not an environment name" in lines[0], res.stderr


def test_an_over_long_scenario_name_is_a_one_line_error(project: Path) -> None:
    """`--scenario` tried it as a file first: Path.is_file raised ENAMETOOLONG."""
    res = run(project, "call", "hotels", "search_hotels", "--scenario", "a" * 300)
    assert res.returncode == 1, res
    assert_clean(res.stdout + res.stderr)
    lines = res.stderr.decode().splitlines()
    assert len(lines) == 1 and "has no scenario 'aaa" in lines[0], res.stderr


@settings(max_examples=6, deadline=None)
@given(source=texts, description=texts.filter(bool))
def test_random_metadata_text_never_reaches_the_terminal_raw(
    tmp_path_factory: pytest.TempPathFactory, source: str, description: str
) -> None:
    """Listed and validated (a lone surrogate or a bad value: a broken environment, listed as such)."""
    project = tmp_path_factory.mktemp("random-metadata")
    add_env(project, "rnd", metadata={"source": source, "description": description})
    for args in (["envs", "list"], ["envs", "validate", "--no-health"]):
        res = run(project, *args)
        assert_clean(res.stdout + res.stderr)
        assert res.returncode in (0, 1), res


# ---- tables: nothing the user types next is cut ---------------------------------------------------------------

_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=28)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_WORD, min_size=1, max_size=4),
    st.lists(st.lists(_WORD, min_size=1, max_size=3).map(" ".join), min_size=2, max_size=8),
    st.sampled_from([40, 80, 120]),
)
def test_a_table_keeps_its_names_whole_and_cuts_no_cell(names: list[str], cells: list[str], width: int) -> None:
    from envfactory.terminal import SafeConsole
    from envfactory.terminal import Table as CliTable

    def render(rows: list[list[str]]) -> list[list[str]]:
        """The body's lines of a table of `rows`, cut into cells."""
        table = CliTable("name", *(f"column {i}" for i in range(len(cells))))
        for row in rows:
            table.add_row(*row)
        buffer = io.StringIO()
        SafeConsole(file=buffer, width=width, color_system=None).print(table)
        assert "…" not in buffer.getvalue()
        return [line.split("│")[1:-1] for line in buffer.getvalue().splitlines() if line.startswith("│")]

    lines = render([[name, *cells] for name in names])
    if max(map(len, names)) + 4 <= width // (len(cells) + 1):  # room for every name on its line
        assert [row[0].strip() for row in lines if row[0].strip()] == names
    if max(map(len, names)) + 4 + 4 * len(cells) + 1 > width:
        return  # not a character's room for each column: a narrower terminal than any table here can fit
    for name in names:  # one row: every character of every cell is there, in order (folded, not cut)
        one = render([[name, *cells]])
        for j, cell in enumerate([name, *cells]):
            assert "".join(row[j].strip() for row in one).replace(" ", "") == cell.replace(" ", "")
