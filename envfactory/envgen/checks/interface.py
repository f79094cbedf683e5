"""Interface errors: where the metadata and the metadata derived from the code disagree."""

from __future__ import annotations

from envfactory.env.environment import contract_problems
from envfactory.env.metadata import EnvMetadata
from envfactory.envgen.checks.matching import _short
from envfactory.envgen.checks.report import ErrorItem, Severity


def _interface_errors(metadata: EnvMetadata, derived: EnvMetadata) -> list[ErrorItem]:
    out: list[ErrorItem] = []

    def add(severity: Severity, message: str, tool: str | None = None) -> None:
        out.append(ErrorItem(dimension="interface", severity=severity, tool=tool, message=message))

    if metadata.name != derived.name:
        add("high", f"the metadata names the environment '{metadata.name}' but env.py names it '{derived.name}'")
    meta_tools = {t.name: t for t in metadata.tools}
    code_tools = {t.name: t for t in derived.tools}
    for name in sorted(meta_tools.keys() - code_tools.keys()):
        add("critical", "the metadata defines this tool but env.py does not register it", name)
    for name in sorted(code_tools.keys() - meta_tools.keys()):
        add("high", "env.py registers this tool but the metadata does not define it (agents cannot see it)", name)
    for name in sorted(meta_tools.keys() & code_tools.keys()):
        m, c = meta_tools[name], code_tools[name]
        one_m = metadata.model_copy(update={"tools": [m]})
        one_c = derived.model_copy(update={"tools": [c], "name": metadata.name})
        for problem in contract_problems(one_m, one_c, "the metadata"):
            add("high", problem.removeprefix(f"tool '{name}': "), name)
        if m.description.strip() != c.description.strip():
            add(
                "low",
                f"the docstring says {_short(c.description, 80)}; the metadata says {_short(m.description, 80)}",
                name,
            )
        if m.output_schema and c.output_schema and m.output_schema.get("type") != c.output_schema.get("type"):
            add(
                "medium",
                f"returns type {c.output_schema.get('type')!r} but the metadata's output schema says "
                f"{m.output_schema.get('type')!r}",
                name,
            )
    return out
