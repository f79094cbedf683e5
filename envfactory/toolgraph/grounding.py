"""Grounding of heuristic verdicts: an internal input must be producible, starting from what users say.

The id rule of `classify` calls `customer_id` internal because some shop tool outputs it. But every
such tool needs a `customer_id` or an `order_id` first, and orders come from `checkout(customer_id)`:
nothing in the environment can *first* produce it, so it must be what the user says (their customer
number). Grounding finds these by a fixpoint over the environment's tools:

- a tool is grounded when each of its required internal inputs is grounded;
- an internal input is grounded when some grounded tool of its environment outputs it.

Internal inputs left ungrounded are made user-provided in two rounds: first those that no producer
outputs as its own record id (a foreign reference like `Order.customer_id` is a field, while
`Order.id` → `order_id` is created by the tool), then — after grounding again — whatever still
cannot be produced. Only heuristic verdicts change; the LLM's decisions are taken as given.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from envfactory.toolgraph.classify import Verdict
from envfactory.toolgraph.params import ParamSpec


def _grounded(
    internal: set[str], required: dict[str, list[str]], producers: dict[str, set[str]], tools: set[str]
) -> set[str]:
    """Internal input ids producible from user-provided values (fixpoint)."""
    params: set[str] = set()
    ready = {t for t in tools if not any(p in internal for p in required[t])}
    changed = True
    while changed:
        changed = False
        for p in internal - params:
            if producers[p] & ready:
                params.add(p)
                changed = True
        for t in tools - ready:
            if all(p not in internal or p in params for p in required[t]):
                ready.add(t)
                changed = True
    return params


def ground_verdicts(
    verdicts: dict[str, Verdict],
    inputs: Sequence[ParamSpec],
    outputs: Sequence[ParamSpec],
    out_idx: np.ndarray,
    in_idx: np.ndarray,
) -> dict[str, Verdict]:
    """A copy of `verdicts` where heuristic internal inputs that cannot be produced are user-provided.

    `out_idx`/`in_idx` are the same-environment output → input pairs above the threshold."""
    result = dict(verdicts)
    tools = {p.tool for p in (*inputs, *outputs)}
    required: dict[str, list[str]] = defaultdict(list)
    for p in inputs:
        if p.required:
            required[p.tool].append(p.node_id)
    producers: dict[str, set[str]] = defaultdict(set)
    creators: dict[str, set[str]] = defaultdict(set)  # producers that output it as their own record id
    for o, i in zip(out_idx.tolist(), in_idx.tolist(), strict=True):
        out, inp = outputs[o], inputs[i]
        producers[inp.node_id].add(out.tool)
        if out.origin != "schema":
            creators[inp.node_id].add(out.tool)

    def internal() -> set[str]:
        return {k for k, v in result.items() if not v.user_provided}

    for only_foreign in (True, False):
        current = internal()
        stuck = current - _grounded(current, required, producers, tools)
        for node in sorted(stuck):
            v = result[node]
            if v.source != "heuristic" or (only_foreign and creators[node]):
                continue
            result[node] = Verdict(
                user_provided=True,
                source="heuristic",
                reason=f"{v.reason.split(':')[0]}, but no tool chain from user-given values produces it: "
                "the user must say it",
            )
    return result
