"""Template queries (no model): a turn's request written from the tools' descriptions and bound arguments.

Each call becomes a clause — the first phrase of the tool's description ("Book one room at a hotel
for a stay") and its user-visible arguments (`guest name "Ana Costa", nights 2`); arguments that
came from an earlier call are said implicitly ("the hotel from before"), as a user would. Wording
lives in `prompts/template/query/en.yaml` (overridable with the prompts folder). Records made this
way are marked `generator: template`.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from envfactory.env.metadata import EnvMetadata
from envfactory.errors import InputError
from envfactory.inputs import read_yaml_model
from envfactory.records.models import PlannedCall
from envfactory.records.spoken import unsayable
from envfactory.words import is_bookkeeping, spoken_name

TEMPLATE_FILE = Path("template") / "query" / "en.yaml"


class TemplateError(InputError):
    """The query template file is missing or malformed."""


class QueryTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    openings: list[str]
    connectives: list[str]
    closings: list[str]
    clause: str
    details: str
    argument: str
    from_earlier: str
    from_first_result: str
    answer_fact: str
    answer_done: str


@lru_cache(maxsize=8)
def load_template(prompts_dir: Path) -> QueryTemplate:
    return read_yaml_model(
        prompts_dir / TEMPLATE_FILE, QueryTemplate, error=lambda m: TemplateError(f"query template {m}")
    )


def _action(description: str) -> str:
    """The first phrase of a description: up to the first period, comma, colon or semicolon; lower-cased start."""
    first = re.split(r"(?<=[a-z0-9\)])[.;:,](\s|$)|\n", description.strip(), maxsplit=1)[0].strip()
    return first[:1].lower() + first[1:] if first else "do this"


def _value(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(_value(v) for v in value) or "none"
    return str(value)


def _noun(parameter: str) -> str:
    return spoken_name(parameter.removesuffix("_id").removesuffix("_ids")) or "one"


class TemplateWriter:
    """Writes the query of each turn and the closing answer; seeded for the choice of wording."""

    def __init__(self, template: QueryTemplate, metadata: dict[str, EnvMetadata], rng: random.Random) -> None:
        self.t, self.metadata, self.rng = template, metadata, rng

    def clause(self, planned: PlannedCall) -> str:
        call = planned.call
        spec = self.metadata[call.server].tool(call.name)
        parts: list[str] = []
        for b in planned.bindings:
            if b.source == "output":
                phrase = self.t.from_first_result if (b.path or "").startswith("[0]") else self.t.from_earlier
                parts.append(
                    self.t.argument.format(name=spoken_name(b.parameter), value=phrase.format(noun=_noun(b.parameter)))
                )
            else:
                parts.append(self.t.argument.format(name=spoken_name(b.parameter), value=_value(b.value)))
        details = self.t.details.format(arguments=", ".join(parts)) if parts else ""
        return self.t.clause.format(action=_action(spec.description), details=details)

    def query(self, calls: list[PlannedCall]) -> str:
        clauses = [self.clause(c) for c in calls]
        text = clauses[0][:1].upper() + clauses[0][1:]
        for clause in clauses[1:]:
            text += f" {self.rng.choice(self.t.connectives)}, {clause}"
        return f"{self.rng.choice(self.t.openings)}{text}{self.rng.choice(self.t.closings)}".strip()

    def intent(self, calls: list[PlannedCall]) -> str:
        return "; ".join(_action(self.metadata[c.call.server].tool(c.call.name).description) for c in calls)

    def answer(self, calls: list[PlannedCall], fact: tuple[str, Any] | None) -> str:
        if fact is not None:
            return self.t.answer_fact.format(field=spoken_name(fact[0]), value=fact[1])
        actions = ", ".join(spoken_name(c.call.name) for c in calls)
        return self.t.answer_done.format(actions=actions)


# Fields worth reporting back from a read, most telling first.
_FACT_KEYS = re.compile(r"(total|price|balance|amount|status|available|free|count|rating|seats|score|due|cost)")


def answer_fact(result: Any, arguments: dict[str, Any]) -> tuple[str, Any] | None:
    """A scalar the user asked for, from a read result: (field, value), or None if there is nothing to report."""
    if isinstance(result, list):
        result = result[0] if result else None
    if not isinstance(result, dict):
        return ("result", result) if isinstance(result, int | float | str) and result != "" else None
    said = {str(v) for v in arguments.values()}
    scalars = [
        (k, v)
        for k, v in result.items()
        if isinstance(v, int | float | str)
        and not isinstance(v, bool)
        and k != "id"
        and not k.endswith("_id")
        and str(v) not in said
        and str(v) != ""
        and not is_bookkeeping(k)  # a page token is no answer to a question
        and not unsayable(v)
    ]
    for k, v in scalars:
        if _FACT_KEYS.search(k):
            return k, v
    return scalars[0] if scalars else None
