"""One rule for "the same call": QueryGen's selection and the reward agree on every call an agent might make.

From each native environment's schema-valid calls (the schema checks' own arguments on the default
scenario), seeded variations a model produces — another letter case, surrounding spaces, an integer
written as a float, an optional argument left out or given its default, a wrong value — are judged by
the selection's rule (`envfactory.querygen.select.match_calls`) and scored by the reward as the only call of a
one-call record: a call the selection would keep scores R_traj 1.0, one it would turn away less (a call the tool
refuses among them: the selection counts only calls that ran, and the reward holds a refused call to exactness).
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from envfactory.env.pool import EnvPool
from envfactory.env.session import Session
from envfactory.envgen.checks import schema_checks
from envfactory.querygen.select import match_calls, matcher_for
from envfactory.records.models import ToolCall
from envfactory.reward import CompositeReward


def _variants(args: dict[str, Any], spec: Any, rng: random.Random) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _ in range(6):
        v = copy.deepcopy(args)
        for k, value in list(v.items()):
            roll = rng.random()
            if isinstance(value, str) and roll < 0.3:
                v[k] = value.upper() if rng.random() < 0.5 else f"  {value} "
            elif isinstance(value, int) and not isinstance(value, bool) and roll < 0.3:
                v[k] = float(value)
            elif roll < 0.4 and k not in spec.required:
                del v[k]  # an optional argument left out
            elif roll < 0.5:
                v[k] = "something else" if isinstance(value, str) else value  # a wrong value (strings)
        for k, schema in spec.parameters.items():
            if k not in v and k not in spec.required and "default" in schema and rng.random() < 0.5:
                v[k] = schema["default"]  # an optional argument given its default
        out.append(v)
    return out


def test_selection_and_reward_agree_on_the_same_call(pool: EnvPool) -> None:
    scorer = CompositeReward(pool)
    matcher = matcher_for(pool)
    rng = random.Random(0)
    checked = agreed_same = 0
    for name in pool.native_names():
        env = pool.get(name)
        initial = env.scenario("default")
        for scenario in schema_checks(env.metadata, initial):
            step = scenario.steps[0]
            spec = next((t for t in env.metadata.tools if t.name == step.tool), None)
            if spec is None or step.expect_ok is False:
                continue
            rec = Session.fork(env, initial).call(step.tool, step.args)
            if not rec.ok:
                continue
            final = Session.fork(env, initial)
            final.call(step.tool, step.args)
            truth = ToolCall(server=name, name=step.tool, arguments=step.args)
            record = {
                "ground_truth": json.dumps([{"name": step.tool, "arguments": step.args}]),
                "initial_config": json.dumps({name: initial}),
                "final_config": json.dumps({name: final.dump()}),
                "mcp_servers": json.dumps([name]),
            }
            for made_args in [step.args, *_variants(step.args, spec, rng)]:
                made = ToolCall(server=name, name=step.tool, arguments=made_args)
                # selection counts a made call only when it ran (`_made_calls`): a call the tool refuses is no match
                runs = Session.fork(env, initial).call(step.tool, made_args).ok
                kept = runs and match_calls([truth], [made], matcher) == (1, 0)
                completion = f"<tool_call>\n{json.dumps({'name': step.tool, 'arguments': made_args})}\n</tool_call>"
                r_traj = scorer.score(completion, **record).r_traj
                assert kept == (r_traj == 1.0), (name, step.tool, step.args, made_args, kept, r_traj)
                checked += 1
                agreed_same += kept
    assert checked > 300 and 0 < agreed_same < checked  # both kinds of cases were met
