"""`envfactory prompts`: list and show the prompt files (of ENVFACTORY_PROMPTS_DIR, default <root>/prompts)."""

from __future__ import annotations

from typing import Annotated

import typer

from envfactory.config import get_settings
from envfactory.errors import EnvFactoryError
from envfactory.llm.prompts import PromptLibrary, library_from_settings
from envfactory.terminal import SafeConsole, Table, safe

app = typer.Typer(no_args_is_help=True, add_completion=False, help="The prompt files (prompts/<group>/<name>.yaml).")
out = SafeConsole()


def _library() -> PromptLibrary:
    return library_from_settings(get_settings())


@app.command("list")
def prompts_list() -> None:
    """List the prompts: name, description, variables."""
    library = _library()
    names = library.names()
    if not names:
        raise EnvFactoryError(
            f"no prompts in {library.folder}: point ENVFACTORY_PROMPTS_DIR at a prompt folder (the project's prompts/)"
        )
    table = Table("name", "description", "variables", title=f"prompts in {safe(library.folder)}")
    for name in names:
        prompt = library.get(name)
        table.add_row(safe(name), safe(prompt.description), safe(", ".join(prompt.variables) or "-"))
    out.print(table)


@app.command("show")
def prompts_show(
    name: str,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="fill a variable: --set name=value (repeatable); others stay as {name}"),
    ] = None,
) -> None:
    """Show a prompt's messages, with its variables listed (unfilled ones as {name} placeholders)."""
    prompt = _library().get(name)
    values: dict[str, str] = {}
    for item in set_ or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise EnvFactoryError(f"--set expects name=value, got '{item}'")
        values[key] = value
    unknown = [k for k in values if k not in prompt.variables]
    if unknown:
        known = ", ".join(prompt.variables) or "none"
        raise EnvFactoryError(f"--set {unknown[0]}: prompt '{name}' has no such variable (it has: {known})")
    text = prompt.text(**values)
    out.print(f"[bold]{safe(prompt.name)}[/bold] — {safe(prompt.description)}", highlight=False)
    out.print(f"source: {safe(prompt.source)}", highlight=False)
    out.print(f"variables: {safe(', '.join(prompt.variables) or 'none')}", highlight=False)
    out.print()
    out.print(safe(text), highlight=False, soft_wrap=True)
