"""Initial states for a compiled environment: records with realistic values and consistent references.

Each scenario fills every resource, parents first: a few records per collection (per parent record
for a nested one), each field's value made from its schema and name (`envfactory.tasks.values`: names,
emails, dates relative to the clock...), the spec's own examples where it gives some, enums from their
values, ids from the same counters the tools use, and every child pointing at a parent that exists.
A value that does not validate against its field's schema is left out (an optional field) or made
again; a required field that cannot be made valid rejects the environment with that reason.
"""

from __future__ import annotations

import random
from typing import Any

from envfactory.env.compiled import CompiledEnvironment, CompiledPlan
from envfactory.tasks.compiled_state import ScenarioGenerationError, ScenarioSettings, fill_state

__all__ = ["ScenarioGenerationError", "ScenarioSettings", "generate_scenarios"]


def generate_scenarios(plan: CompiledPlan, settings: ScenarioSettings | None = None) -> dict[str, dict[str, Any]]:
    """`settings.count` initial states, named `default`, `scenario_2`, ... (each loads into the environment).
    The records are made by `envfactory.tasks.compiled_state` (the offline synthesis makes its initial
    databases there too)."""
    s = settings or ScenarioSettings()
    env = CompiledEnvironment(plan)
    out: dict[str, dict[str, Any]] = {}
    for i in range(s.count):
        state, _ = fill_state(env, random.Random(f"{plan.name}:{s.seed}:{i}"), s)
        env.new_state(state, f"scenario {i}")  # the same checks a scenario file gets when it loads
        out["default" if i == 0 else f"scenario_{i + 1}"] = state
    return out
