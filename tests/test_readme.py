"""The README is the front page: short, and its CLI table in step with the commands `--help` lists."""

from __future__ import annotations

import posixpath
import re
import subprocess
from pathlib import Path

from tests.test_cli_mistakes import command_paths

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def documented_commands() -> set[str]:
    """The command paths the README's CLI table names (`envfactory corpus fetch | list` is two)."""
    section = README.split("\n## The CLI\n", 1)[1]
    block = section.split("```", 2)[1]
    found: set[str] = set()
    for line in block.splitlines():
        if not line.startswith("envfactory "):
            continue
        words: list[str] = []
        command = re.split(r"\s{2,}", line)[0]  # the description starts after a run of spaces
        for token in command.split()[1:]:
            if not re.fullmatch(r"[a-z|][a-z|-]*", token):
                break  # an argument (NAME, [--option], --flag): the command path has ended
            words += [w for w in token.split("|") if w]
        first, rest = words[0], words[1:]
        found |= {f"{first} {w}" for w in rest} if rest else {first}
    return found


def test_the_cli_table_names_every_command_and_only_those() -> None:
    assert documented_commands() == set(command_paths())


def test_the_front_page_is_short_and_its_links_resolve() -> None:
    assert len(README.splitlines()) <= 250
    for target in re.findall(r"\]\(((?:docs|examples|training|prompts)/[^)#]*)", README):
        assert (ROOT / target).exists(), target


def _repo_paths() -> set[str]:
    """Every tracked file and folder (folders end in `/`), relative to the checkout."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    folders = {"/".join(f.split("/")[:i]) + "/" for f in files for i in range(1, f.count("/") + 1)}
    return set(files) | folders


def stale_pointers(text: str, paths: set[str]) -> list[str]:
    """The file and folder names (`a/b.py`, `c/`) a doc names that exist nowhere they could mean: from the
    checkout's root, from the library's (`env/pool.py`), inside an environment folder (`envs/<name>/env.py`), or
    under a folder the section names by its full path (`runner.py` in a section on `envfactory/env/sandbox/` must
    be there)."""
    inside_env = {p.split("/", 2)[2] for p in paths if p.startswith("envs/") and p.count("/") >= 2}
    stale: list[str] = []
    for section in re.split(r"\n(?=## )", text):
        named = set(re.findall(r"`([\w./-]+(?:\.py|/))`", section))
        full = {n for n in named if n in paths} | {f"envfactory/{n}" for n in named if f"envfactory/{n}" in paths}
        bases = {posixpath.dirname(f.rstrip("/")) + "/" for f in full} | {f for f in full if f.endswith("/")}
        for name in sorted(named):
            if name in paths or name in inside_env or f"envfactory/{name}" in paths:
                continue
            if any(b + name in paths for b in bases - {"/"}):
                continue
            stale.append(name)
    return stale


def test_the_stale_pointer_check_finds_a_name_that_is_not_where_its_section_says() -> None:
    paths = {"envfactory/", "envfactory/env/", "envfactory/env/pool.py", "training/", "training/runner.py"}
    doc = (
        "## Runtime (`envfactory/env/`)\n`pool.py`, `env/pool.py` and `runner.py`, `gone/`\n## Training\n`runner.py`\n"
    )
    assert stale_pointers(doc, paths) == ["gone/", "runner.py", "runner.py"]


# folders the code writes, not shipped: an environment EnvGen registers gets its test scenarios here (register.py)
WRITTEN = {"scenarios/tests/"}


def test_design_notes_name_only_files_and_folders_that_exist() -> None:
    notes = (ROOT / "docs" / "design-notes.md").read_text()
    assert stale_pointers(notes, _repo_paths() | WRITTEN) == []
