"""The README is the front page: short, and its CLI table in step with the commands `--help` lists."""

from __future__ import annotations

import re
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
