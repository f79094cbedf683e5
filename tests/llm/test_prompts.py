"""Prompt files: loading, checks at load and render time, overrides, the folder setting, the CLI."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from typer.testing import CliRunner

from envfactory.cli.prompts import app
from envfactory.config import Settings
from envfactory.llm.prompts import PROMPT_KEY, PromptError, PromptLibrary, library_from_settings
from tests.support.paths import ROOT

GREET = """\
description: Greets someone and shows a JSON example.
variables: [name, place]
messages:
  - role: system
    content: |
      You greet people. Answer as JSON: {{"greeting": "..."}}
  - role: user
    content: Greet {name} from {place}.
  - role: assistant
    content: Sure.
"""


def write(folder: Path, rel: str, text: str) -> Path:
    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    d = tmp_path / "prompts"
    write(d, "demo/greet.yaml", GREET)
    write(d, "demo/plain.yaml", "description: no variables\nmessages:\n  - role: user\n    content: Hello.\n")
    write(d, "README.md", "not a prompt")
    return d


def test_load_names_and_render(folder: Path) -> None:
    lib = PromptLibrary(folder)
    assert lib.names() == ["demo/greet", "demo/plain"]
    prompt = lib.get("demo/greet")
    assert prompt.variables == ("name", "place")
    messages = prompt.render(name="Ada", place="London")
    assert [type(m) for m in messages] == [SystemMessage, HumanMessage, AIMessage]
    assert messages[0].content == 'You greet people. Answer as JSON: {"greeting": "..."}\n'  # braces unescaped
    assert messages[1].content == "Greet Ada from London."
    assert messages[0].additional_kwargs[PROMPT_KEY] == "demo/greet"
    assert PROMPT_KEY not in messages[1].additional_kwargs


def test_data_variables_render_as_json(folder: Path) -> None:
    messages = PromptLibrary(folder).get("demo/greet").render(name={"first": "Ada"}, place=["a", "b"])
    assert '"first": "Ada"' in str(messages[1].content)
    assert '[\n  "a",\n  "b"\n]' in str(messages[1].content)


def test_the_project_prompts_load() -> None:
    lib = PromptLibrary(ROOT / "prompts")
    repair = lib.get("common/repair")
    assert set(repair.variables) == {"error", "schema"}
    text = str(repair.render(error="E-MARK", schema="S-MARK")[-1].content)
    assert "E-MARK" in text and "S-MARK" in text


@pytest.mark.parametrize(
    ("content", "variables", "needle"),
    [
        ("Hi {name} at {plcae}", "[name, place]", "undeclared variable 'plcae'"),
        ("Hi {name}", "[name, place]", "declared variable 'place' is never used"),
        ('JSON: {"a": 1}', "[]", "placeholder '{\"a\"}' is not a variable name"),
        ("Hi {0}", "[]", "placeholder '{0}' is not a variable name"),
        ("Hi {name", "[name]", "bad template"),
        ("Hi {name!r}", "[name]", "placeholder 'name' has a format spec"),
    ],
)
def test_template_errors_at_load_name_prompt_and_variable(
    tmp_path: Path, content: str, variables: str, needle: str
) -> None:
    write(
        tmp_path,
        "grp/bad.yaml",
        f"description: d\nvariables: {variables}\nmessages:\n  - role: user\n    content: '{content}'\n",
    )
    with pytest.raises(PromptError) as e:
        PromptLibrary(tmp_path)
    assert "prompt 'grp/bad'" in str(e.value) and str(tmp_path / "grp" / "bad.yaml") in str(e.value)  # the file too
    assert needle in str(e.value)


def test_malformed_file_names_the_field(tmp_path: Path) -> None:
    write(tmp_path, "grp/bad.yaml", "description: d\nmessages:\n  - role: robot\n    content: x\n")
    with pytest.raises(PromptError, match=r"prompt 'grp/bad'.*messages\.0\.role"):
        PromptLibrary(tmp_path)


def test_render_missing_and_unknown_variable(folder: Path) -> None:
    prompt = PromptLibrary(folder).get("demo/greet")
    with pytest.raises(PromptError, match=r"prompt 'demo/greet': missing variable 'place'"):
        prompt.render(name="Ada")
    with pytest.raises(PromptError, match=r"prompt 'demo/greet': unknown variable 'planet'"):
        prompt.render(name="Ada", place="x", planet="Mars")


def test_unknown_name_suggests_close_matches(folder: Path) -> None:
    lib = PromptLibrary(folder)
    with pytest.raises(PromptError, match=r"unknown prompt 'demo/gret'.*did you mean 'demo/greet'"):
        lib.get("demo/gret")
    with pytest.raises(PromptError, match=r"known prompts: demo/greet, demo/plain"):
        lib.get("zzzzzzzz")


def test_override_by_file(folder: Path, tmp_path: Path) -> None:
    alt = write(
        tmp_path,
        "alt.yaml",
        "messages:\n  - role: system\n    content: Be terse.\n  - role: user\n    content: Hi {name} of {place}\n",
    )
    for value in (alt, str(alt)):  # a Path, or a one-line string ending in .yaml
        prompt = PromptLibrary(folder, overrides={"demo/greet": value}).get("demo/greet")
        messages = prompt.render(name="Ada", place="Paris")
        assert [m.content for m in messages] == ["Be terse.", "Hi Ada of Paris"]
        assert prompt.description == "Greets someone and shows a JSON example."  # inherited
        assert messages[0].additional_kwargs[PROMPT_KEY] == "demo/greet"
    with pytest.raises(PromptError, match=r"override file .*missing\.yaml does not exist"):
        PromptLibrary(folder, overrides={"demo/greet": str(tmp_path / "missing.yaml")})


def test_override_inline_yaml_and_system_text(folder: Path) -> None:
    inline = "description: inline\nmessages:\n  - role: user\n    content: 'Yo {name} ({place})'\n"
    prompt = PromptLibrary(folder, overrides={"demo/greet": inline}).get("demo/greet")
    assert [m.content for m in prompt.render(name="A", place="B")] == ["Yo A (B)"]
    assert prompt.description == "inline"

    system = PromptLibrary(folder, overrides={"demo/greet": "You are a pirate. Say ahoy."}).get("demo/greet")
    messages = system.render(name="A", place="B")
    assert messages[0].content == "You are a pirate. Say ahoy."
    assert messages[1].content == "Greet A from B."  # the rest of the prompt is kept


def test_override_errors(folder: Path) -> None:
    with pytest.raises(PromptError, match=r"override for unknown prompt 'demo/greeet'.*did you mean 'demo/greet'"):
        PromptLibrary(folder, overrides={"demo/greeet": "x"})
    changed = "variables: [name]\nmessages:\n  - role: user\n    content: 'Hi {name}'\n"
    with pytest.raises(PromptError, match=r"prompt 'demo/greet'.*must keep the variables"):
        PromptLibrary(folder, overrides={"demo/greet": changed})
    with pytest.raises(PromptError, match=r"prompt 'demo/greet'.*undeclared variable 'who'"):
        PromptLibrary(folder, overrides={"demo/greet": "Hello {who}"})
    with pytest.raises(PromptError, match=r"prompt 'demo/plain' has no system message"):
        PromptLibrary(folder, overrides={"demo/plain": "Be nice."})


def test_folder_from_env_var(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVFACTORY_PROMPTS_DIR", str(folder))
    lib = library_from_settings(Settings())
    assert lib.folder == folder
    assert lib.names() == ["demo/greet", "demo/plain"]
    monkeypatch.setenv("ENVFACTORY_PROMPTS_DIR", str(folder / "nope"))
    with pytest.raises(PromptError, match="does not exist"):
        library_from_settings(Settings())


def test_cli_list_and_show(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVFACTORY_PROMPTS_DIR", str(folder))
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    res = runner.invoke(app, ["list"])
    assert res.exit_code == 0, res.output
    assert "demo/greet" in res.output and "Greets someone" in res.output and "name, place" in res.output

    res = runner.invoke(app, ["show", "demo/greet", "--set", "name=Ada"])
    assert res.exit_code == 0, res.output
    assert "variables: name, place" in res.output
    assert "Greet Ada from {place}." in res.output
    assert '{"greeting": "..."}' in res.output

    res = runner.invoke(app, ["show", "demo/gret"])
    assert isinstance(res.exception, PromptError)
    assert "did you mean 'demo/greet'" in str(res.exception)
