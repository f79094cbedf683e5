"""Prompt files: `prompts/<group>/<name>.yaml`, named `<group>/<name>`, checked when loaded.

A file declares its `variables`; every `{placeholder}` in its messages must be declared and every
declared variable must be used, so a typo fails when the library loads, not mid-run. Templates are
`str.format` templates: literal braces (JSON examples) are written `{{` and `}}`.

Overrides (per run, `PromptLibrary(folder, overrides={name: value})`) follow one rule on `value`:
- a `Path`, or a one-line string ending in `.yaml`/`.yml`: a prompt file that replaces the prompt;
- a string that parses as a YAML mapping with a `messages` key: an inline prompt that replaces it;
- any other string: the new text of the prompt's system message (a template, checked the same way).
A replacement may omit `description`/`variables` (they are inherited) but may not change the
variables, because the calling code passes the original ones.
"""

from __future__ import annotations

import difflib
import json
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envfactory.config import Settings
from envfactory.errors import ConfigError, first_error
from envfactory.inputs import InputError, parse_yaml, read_yaml

PROMPT_KEY = "prompt"  # additional_kwargs key of the first rendered message; the scripted model keys on it
SUFFIX = ".yaml"
_PATH_SUFFIXES = (".yaml", ".yml")


class PromptError(ConfigError):
    """A prompt file is malformed, a variable is wrong, or a prompt name is unknown."""


class PromptMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str


class PromptFile(BaseModel):
    """The YAML shape of one prompt file."""

    model_config = ConfigDict(extra="forbid")

    description: str
    variables: list[str] = Field(default_factory=list)
    messages: list[PromptMessage] = Field(min_length=1)


def template_fields(prompt: str, template: str, where: str, source: str | None = None) -> set[str]:
    """The `{placeholder}` names in a template; only plain identifiers are allowed. `source`: the prompt's file,
    named in the error (an override's, not the library's)."""
    if source is not None:
        where = f"{source}: {where}"
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise PromptError(
            f"prompt '{prompt}': {where}: bad template ({e}); write literal braces as {{{{ }}}}"
        ) from None
    fields: set[str] = set()
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field.isidentifier():
            # `{}`, `{0}`, `{a.b}`, `{a[0]}` and JSON like `{"k": 1}` all land here
            raise PromptError(
                f"prompt '{prompt}': {where}: placeholder '{{{field}}}' is not a variable name; "
                "write literal braces as {{ }}"
            )
        if spec or conversion:
            raise PromptError(f"prompt '{prompt}': {where}: placeholder '{field}' has a format spec or conversion")
        fields.add(field)
    return fields


def _as_text(value: Any) -> str:
    """Variables may be strings or data; data is shown to the model as indented JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json(indent=2)
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return str(value)


_MESSAGE_CLASSES: dict[str, type[BaseMessage]] = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}


class Prompt:
    """One checked prompt. `render(**variables)` gives the LangChain messages."""

    def __init__(self, name: str, spec: PromptFile, source: str) -> None:
        self.name, self.source = name, source
        self.description = spec.description
        self.variables: tuple[str, ...] = tuple(spec.variables)
        self.messages: tuple[PromptMessage, ...] = tuple(spec.messages)
        self._check()

    def _check(self) -> None:
        declared = set(self.variables)
        if len(declared) != len(self.variables):
            dupes = sorted({v for v in self.variables if self.variables.count(v) > 1})
            raise PromptError(f"prompt '{self.name}' ({self.source}): variable '{dupes[0]}' is declared twice")
        used: set[str] = set()
        for i, message in enumerate(self.messages):
            fields = template_fields(self.name, message.content, f"message {i} ({message.role})", self.source)
            undeclared = sorted(fields - declared)
            if undeclared:
                raise PromptError(
                    f"prompt '{self.name}' ({self.source}): message {i} ({message.role}) uses undeclared "
                    f"variable '{undeclared[0]}' (declared: {', '.join(self.variables) or 'none'})"
                )
            used |= fields
        for var in self.variables:
            if var not in used:
                raise PromptError(f"prompt '{self.name}' ({self.source}): declared variable '{var}' is never used")

    def render(self, **variables: Any) -> list[BaseMessage]:
        """The messages with variables filled in; the first one carries the prompt name."""
        for var in self.variables:
            if var not in variables:
                raise PromptError(f"prompt '{self.name}': missing variable '{var}'")
        for var in variables:
            if var not in self.variables:
                raise PromptError(
                    f"prompt '{self.name}': unknown variable '{var}' (declared: {', '.join(self.variables) or 'none'})"
                )
        values = {k: _as_text(v) for k, v in variables.items()}
        out: list[BaseMessage] = []
        for i, message in enumerate(self.messages):
            extra = {PROMPT_KEY: self.name} if i == 0 else {}
            out.append(
                _MESSAGE_CLASSES[message.role](content=message.content.format(**values), additional_kwargs=extra)
            )
        return out

    def text(self, **variables: Any) -> str:
        """Readable text of the messages; variables not given stay as `{name}` placeholders."""
        filled = {v: variables.get(v, f"{{{v}}}") for v in self.variables}
        rendered = self.render(**filled)
        return "\n\n".join(f"[{spec.role}]\n{m.content}" for spec, m in zip(self.messages, rendered, strict=True))

    def __repr__(self) -> str:
        return f"Prompt({self.name!r}, variables={list(self.variables)!r})"


def _parse(name: str, raw: object, source: str, inherit: Prompt | None = None) -> Prompt:
    if not isinstance(raw, dict):
        raise PromptError(f"prompt '{name}' ({source}): expected a YAML mapping with description/variables/messages")
    if inherit is not None:
        raw = {"description": inherit.description, "variables": list(inherit.variables), **raw}
    try:
        spec = PromptFile.model_validate(raw)
    except ValidationError as e:
        loc, msg = first_error(e, "(file)")
        raise PromptError(f"prompt '{name}' ({source}): field '{loc}': {msg}") from None
    prompt = Prompt(name, spec, source)
    if inherit is not None and set(prompt.variables) != set(inherit.variables):
        raise PromptError(
            f"prompt '{name}' ({source}): an override must keep the variables "
            f"{sorted(inherit.variables)}, it declares {sorted(prompt.variables)}"
        )
    return prompt


def load_prompt_file(name: str, path: Path, inherit: Prompt | None = None) -> Prompt:
    raw = read_yaml(path, what="prompt file", error=lambda m: PromptError(f"prompt '{name}': {m}"))
    return _parse(name, raw, str(path), inherit)


def _apply_override(base: Prompt, value: str | Path) -> Prompt:
    name = base.name
    if isinstance(value, Path) or ("\n" not in value and value.strip().endswith(_PATH_SUFFIXES)):
        path = Path(value).expanduser()
        if not path.is_file():
            raise PromptError(f"prompt '{name}': override file {path} does not exist")
        return load_prompt_file(name, path, inherit=base)
    try:
        raw = parse_yaml(value, "inline override")
    except InputError:
        raw = None  # not YAML (or hostile YAML): plain system text
    if isinstance(raw, dict) and "messages" in raw:
        return _parse(name, raw, "inline override", inherit=base)
    systems = [i for i, m in enumerate(base.messages) if m.role == "system"]
    if not systems:
        raise PromptError(
            f"prompt '{name}' has no system message to replace; override it with a YAML prompt (file or inline)"
        )
    messages = [m.model_copy(update={"content": value}) if i == systems[0] else m for i, m in enumerate(base.messages)]
    spec = PromptFile(description=base.description, variables=list(base.variables), messages=messages)
    return Prompt(name, spec, f"{base.source} with system text override")


def _suggest(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    if close:
        return f"did you mean {', '.join(repr(c) for c in close)}?"
    shown = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
    return f"known prompts: {shown or 'none'}"


class PromptLibrary:
    """All prompts of a folder, loaded and checked at construction, with per-run overrides applied."""

    def __init__(self, folder: Path, overrides: Mapping[str, str | Path] | None = None) -> None:
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise PromptError(f"prompt folder {self.folder} does not exist (set ENVFACTORY_PROMPTS_DIR)")
        self._prompts: dict[str, Prompt] = {}
        for path in sorted(self.folder.glob(f"*/*{SUFFIX}")):
            name = f"{path.parent.name}/{path.stem}"
            self._prompts[name] = load_prompt_file(name, path)
        for name, value in (overrides or {}).items():
            if name not in self._prompts:
                raise PromptError(f"override for unknown prompt '{name}': {_suggest(name, self.names())}")
            self._prompts[name] = _apply_override(self._prompts[name], value)

    def names(self) -> list[str]:
        return sorted(self._prompts)

    def get(self, name: str) -> Prompt:
        try:
            return self._prompts[name]
        except KeyError:
            raise PromptError(f"unknown prompt '{name}' in {self.folder}: {_suggest(name, self.names())}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._prompts

    def render(self, name: str, **variables: Any) -> list[BaseMessage]:
        return self.get(name).render(**variables)


def library_from_settings(settings: Settings, overrides: Mapping[str, str | Path] | None = None) -> PromptLibrary:
    """The library of `settings.prompts_path` (ENVFACTORY_PROMPTS_DIR, default <root>/prompts)."""
    return PromptLibrary(settings.prompts_path, overrides)
