"""Reward benchmark: composite rewards/s for realistic completions on one core, beside a naive baseline.

    python benchmarks/reward.py [--seconds 2] [--repeats 3]

The dataset: RL records (the reference's JSON-string format) built by replaying 2–4-call chains on
the bundled environments' default scenarios (hotels, flights, restaurants, shop, helpdesk with a
masked free-text argument, banking, and a flights + hotels turn), with varied arguments. Each record
gets a GRPO group of Hermes-format completions (`<think>` + `<tool_call>` blocks): the ground truth,
the same with qualified names, one wrong argument, a redundant extra read, a missing last call,
two conflicting calls swapped, an unparseable block in front, an answer with no calls.

Measured in this run, in rewards per CPU-second of one process pinned to one core (CPU time, so
other work on a shared machine does not count), records cold at the start of every pass:
- **ours** — `CompositeReward` with its defaults: each record parsed once per group (LRU cache), its
  initial states validated once per (server, initial_config) — the records of a dataset share the
  scenarios their tasks start from — and a predicted call's ground-truth matches remembered by the call;
  only write calls replayed (reads cannot change state), memoized by the replayed calls alone (the
  completions that differ only in their reads or their format share one replay); a `<tool_call>` block
  read once per record, and a completion's whole sequence of calls scored once (its state and
  trajectory terms: the completions that differ only around their calls or in the names' form share
  them); a replay that misses rolls the record's kept sessions back to the calls it shares with the
  last one (the state's change log) instead of forking and replaying them; the final state compared
  with the goal through the records the calls touched, the full dump and canonical form only when
  they differ;
- **ours without the replay memo** — the same, every completion replayed (from the kept sessions), every
  block read and every completion's calls matched (`memoize_replays=False`);
- **uncached** — the same with `cache_size=0`: the record's JSON, states and ground truth re-parsed
  and re-validated for every completion, no memo;
- **naive** — uncached, and the state term done the straightforward way: `replay()` of every call
  over every server of the record (results built for every call), then the verifier's
  `state_differences` (both states canonicalized and diffed in full) per server.
The pool, the records and the completions are moved out of the cyclic garbage collector's view
(`gc.freeze()`) once loaded, for every method alike — what a training process does once its
environments and dataset are loaded (otherwise full collections walk the pool's ~70k objects again and
again: ~5–10 % of a reward here); `--no-freeze` leaves them in.
All four give the same rewards (checked before timing; tests/reward/test_fast_path.py checks whole
results bit for bit over random completions). Targets (issue 29): ≥ 10,000 rewards/s on one core and
≥ 8× the naive baseline of the same run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from figures import Figure, add_json_flag, write_figures
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envfactory.config import Settings  # noqa: E402
from envfactory.env.pool import EnvPool  # noqa: E402
from envfactory.records.episode import replay  # noqa: E402
from envfactory.records.models import States, ToolCall  # noqa: E402
from envfactory.records.verifier import state_differences  # noqa: E402
from envfactory.reward import CompositeReward, RewardResult, RewardSettings, apply_blanks  # noqa: E402
from envfactory.reward.tool_calls import parse_tool_calls  # noqa: E402

TARGET = 10_000.0  # rewards per CPU-second, one core
TARGET_RATIO = 8.0  # × the naive baseline of the same run
Step = tuple[str, str, dict[str, Any]]  # server, tool, arguments
GUESTS = ["Ana Costa", "Tom Becker", "Priya Raman", "Jonas Weber"]


def chains() -> list[tuple[list[Step], dict[int, list[str]]]]:
    """Ground-truth turns (calls, masked arguments by call index), with varied arguments."""
    out: list[tuple[list[Step], dict[int, list[str]]]] = []
    for k, guest in enumerate(GUESTS):
        hotel = ["HT-LIS-01", "HT-LIS-03"][k % 2]
        stay = {"hotel_id": hotel, "guest_name": guest, "check_in": f"2026-03-0{k + 2}", "nights": k + 1}
        turn: list[Step] = [("hotels", "search_hotels", {"city": "Lisbon"}), ("hotels", "book_room", stay)]
        if k % 2:
            check = {"hotel_id": hotel, "check_in": stay["check_in"], "nights": stay["nights"]}
            turn.insert(1, ("hotels", "check_availability", check))
            turn.append(("hotels", "cancel_booking", {"booking_id": "BK-0002"}))
        out.append((turn, {}))
        flight = ["FL-1001", "FL-1003"][k % 2]
        out.append(
            (
                [
                    ("flights", "search_flights", {"origin": "LIS", "destination": "MAD", "date": "2026-03-08"}),
                    ("flights", "book_flight", {"flight_id": flight, "passenger_name": guest}),
                    ("flights", "add_baggage", {"booking_id": "FB-0006", "bags": 1 + k % 2}),
                    *([("flights", "select_seat", {"booking_id": "FB-0006", "seat": f"1{k}C"})] if k % 2 else []),
                ],
                {},
            )
        )
        out.append(
            (
                [
                    ("restaurants", "search_restaurants", {"city": "Lisbon"}),
                    (
                        "restaurants",
                        "check_table",
                        {"restaurant_id": "RS-LIS-01", "date": "2026-03-21", "time": "20:00:00", "party_size": k + 2},
                    ),
                    (
                        "restaurants",
                        "reserve_table",
                        {
                            "restaurant_id": "RS-LIS-01",
                            "guest_name": guest,
                            "date": "2026-03-21",
                            "time": "20:00:00",
                            "party_size": k + 2,
                        },
                    ),
                ],
                {},
            )
        )
        out.append(
            (
                [
                    ("shop", "search_products", {"query": "speaker"}),
                    ("shop", "add_to_cart", {"customer_id": "CU-002", "product_id": "PR-1002", "quantity": k + 1}),
                    ("shop", "checkout", {"customer_id": "CU-002"}),
                ],
                {},
            )
        )
        ticket = {
            "customer_id": "CU-002",
            "subject": f"Invoice question {k}",
            "priority": "high",
            "description": f"Customer {guest} asks about the February invoice.",
        }
        out.append(
            (
                [
                    ("helpdesk", "search_customers", {"query": "Tom"}),
                    ("helpdesk", "create_ticket", ticket),
                    ("helpdesk", "assign_ticket", {"ticket_id": "TK-0007", "agent_id": "AG-02"}),
                ],
                {1: ["description"]},
            )
        )
        out.append(
            (
                [
                    ("banking", "list_accounts", {"owner": "Maria Silva"}),
                    (
                        "banking",
                        "transfer",
                        {"from_account_id": "AC-1001", "payee_id": "PY-0002", "amount": 20.5 * (k + 1)},
                    ),
                ],
                {},
            )
        )
        out.append(
            (
                [
                    ("flights", "search_flights", {"origin": "LIS", "destination": "MAD", "date": "2026-03-08"}),
                    ("flights", "book_flight", {"flight_id": flight, "passenger_name": guest}),
                    ("hotels", "book_room", stay),
                ],
                {},
            )
        )
    return out


def make_record(pool: EnvPool, steps: list[Step], masked: dict[int, list[str]]) -> dict[str, str]:
    servers = list(dict.fromkeys(s for s, _, _ in steps))
    initial: States = {s: pool.get(s).scenario("default") for s in servers}
    calls = [
        ToolCall(server=s, name=n, arguments=a, masked_arguments=masked.get(i, [])) for i, (s, n, a) in enumerate(steps)
    ]
    run = replay(pool, calls, initial)
    failed = [f"{c.qualified}: {r.result}" for c, r in zip(calls, run.results, strict=True) if not r.ok]
    if failed:
        raise SystemExit(f"benchmark chain does not replay: {failed}")
    gt = [{"name": c.name, "arguments": c.arguments, "masked_arguments": c.masked_arguments} for c in calls]
    return {
        "ground_truth": json.dumps(gt),
        "initial_config": json.dumps(initial),
        "final_config": json.dumps(run.final),
        "mcp_servers": json.dumps(servers),
    }


def hermes(steps: list[Step], qualified: bool = False) -> str:
    blocks = "".join(
        "<tool_call>\n"
        + json.dumps({"name": f"{s}.{n}" if qualified else n, "arguments": a}, ensure_ascii=False)
        + "\n</tool_call>\n"
        for s, n, a in steps
    )
    return "<think>\nThe user wants this done; I will look it up first, then act.\n</think>\n\n" + blocks


def wrong_argument(steps: list[Step]) -> list[Step]:
    """The last write call with one argument changed (a number + 1, else a text altered)."""
    out = list(steps)
    for i in range(len(out) - 1, -1, -1):
        s, n, a = out[i]
        for key, value in a.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                out[i] = (s, n, {**a, key: value + 1})
                return out
        for key, value in a.items():
            if isinstance(value, str) and not key.endswith("id"):
                out[i] = (s, n, {**a, key: value + " Jr"})
                return out
    return out


VARIANTS: dict[str, Callable[[list[Step]], str]] = {
    "ground truth": lambda st: hermes(st),
    "ground truth, qualified names": lambda st: hermes(st, qualified=True),
    "redundant extra read": lambda st: hermes([*st, st[0]]),
    "unparseable block + ground truth": lambda st: "<tool_call>{'name': oops}</tool_call>\n" + hermes(st),
    "first two calls swapped": lambda st: hermes([st[1], st[0], *st[2:]]),
    "missing last call": lambda st: hermes(st[:-1]),
    "wrong argument": lambda st: hermes(wrong_argument(st)),
    "answer, no calls": lambda st: "<think>\nNo tools needed.\n</think>\nIt is done.",
}


class Naive(CompositeReward):
    """The same reward, computed the straightforward way (no record cache, full replay and full diffs)."""

    def __init__(self, pool: EnvPool) -> None:
        super().__init__(pool, RewardSettings(cache_size=0, memoize_replays=False))

    def _state(
        self, t: Any, calls: list[ToolCall], keys: list[Any], reasons: list[str]
    ) -> tuple[float | None, list[int]]:
        run = replay(self.pool, calls, t.initial)  # every server of the record forked
        equal = considered = 0
        for srv in t.servers:
            if srv not in t.goal_dump:
                continue
            blank = t.blanks[srv]
            base = apply_blanks(t.initial[srv], blank)
            goal = apply_blanks(t.goal_dump[srv], blank)
            actual = apply_blanks(run.final[srv], blank)
            same = not state_differences(base, goal, actual, self.settings.mask)
            moved = bool(state_differences(base, base, actual, self.settings.mask))
            goal_moved = bool(state_differences(base, base, goal, self.settings.mask))
            if self.settings.state_scope == "all" or goal_moved or moved:
                considered += 1
                equal += same
        return (equal / considered if considered else None), [k for k, r in enumerate(run.results) if not r.ok]


def measure(
    make: Callable[[], CompositeReward], groups: list[tuple[dict[str, str], list[str]]], seconds: float
) -> float:
    """Rewards per CPU-second of this process: passes over all groups, each pass with a fresh scorer
    (records cold, as in training). CPU time, so that other work on a shared machine does not count."""
    n, start = 0, time.process_time()
    while time.process_time() - start < seconds:
        scorer = make()
        for rec, completions in groups:
            for c in completions:
                scorer.score(c, **rec)
            n += len(completions)
    return n / (time.process_time() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="CPU seconds per measurement")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of measurements, every method once a round (median)")
    ap.add_argument("--no-freeze", action="store_true", help="leave the pool and records to the cyclic GC")
    add_json_flag(ap)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core

    console = Console(width=120)
    pool = EnvPool(Settings(root=ROOT))
    turns = chains()
    groups = [(make_record(pool, steps, masked), [v(steps) for v in VARIANTS.values()]) for steps, masked in turns]
    if not args.no_freeze:  # what a trainer does once its pool and data are loaded: see the docstring
        gc.collect()
        gc.freeze()
    n_calls = [len(steps) for steps, _ in turns]
    sizes = [parse_tool_calls(c).n_calls for _, completions in groups for c in completions]

    # the same rewards by every method; the mean per variant is the sanity table
    ours, naive = CompositeReward(pool), Naive(pool)
    per_variant: dict[str, list[RewardResult]] = {name: [] for name in VARIANTS}
    for rec, completions in groups:
        for name, c in zip(VARIANTS, completions, strict=True):
            a, b = ours.score(c, **rec), naive.score(c, **rec)
            if abs(a.reward - b.reward) > 1e-12:
                raise SystemExit(f"methods disagree on {name!r}: {a.reward} vs {b.reward}: {a.reasons} / {b.reasons}")
            per_variant[name].append(a)

    sanity = Table(title=f"Rewards of the completion variants ({len(groups)} records, α = 0.5, defaults)")
    for col in ("completion", "mean R", "min R", "max R", "R_traj", "R_state"):
        sanity.add_column(col, justify="left" if col == "completion" else "right")
    for name, results in per_variant.items():
        rs = [r.reward for r in results]
        sanity.add_row(
            name,
            f"{statistics.mean(rs):.3f}",
            f"{min(rs):.3f}",
            f"{max(rs):.3f}",
            f"{statistics.mean(r.r_traj for r in results):.3f}",
            f"{statistics.mean(r.r_state for r in results):.3f}",
        )
    console.print(sanity)

    methods: dict[str, Callable[[], CompositeReward]] = {
        "ours: cached records, lazy replay": lambda: CompositeReward(pool),
        "ours without the replay memo": lambda: CompositeReward(pool, RewardSettings(memoize_replays=False)),
        "uncached: record re-parsed per reward": lambda: CompositeReward(
            pool, RewardSettings(cache_size=0, memoize_replays=False)
        ),
        "naive: full replay + full state diffs": lambda: Naive(pool),
    }
    # round after round, every method once a round: a machine whose speed drifts (it does here, by tens of per
    # cent within minutes) moves every method alike, and the median of each is the figure
    runs: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):
        for name, make in methods.items():
            runs[name].append(measure(make, groups, args.seconds))
    rates = {name: statistics.median(rs) for name, rs in runs.items()}
    base = rates["naive: full replay + full state diffs"]
    table = Table(
        title=(
            f"Composite reward throughput, one core: {len(groups)} records ({min(n_calls)}–{max(n_calls)} calls) × "
            f"{len(VARIANTS)} completions ({min(sizes)}–{max(sizes)} calls)"
        )
    )
    for col in ("method", "rewards/s", "µs/reward", "vs naive", f"≥ {TARGET:,.0f}/s", f"≥ {TARGET_RATIO:.0f}× naive"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for name, rate in rates.items():
        table.add_row(
            name,
            f"{rate:,.0f}",
            f"{1e6 / rate:.0f}",
            f"{rate / base:.1f}×",
            "yes" if rate >= TARGET else "no",
            "yes" if rate >= TARGET_RATIO * base else "no",
        )
    console.print(table)
    ours = rates["ours: cached records, lazy replay"]
    write_figures(
        args.json,
        [
            Figure(
                path="reward",
                measure="composite reward, one core (rewards per CPU-second)",
                value=ours,
                shown=f"{ours:,.0f} /s ({ours / base:.1f}× naive)",
                beside=f"naive: {base:,.0f} /s",
                target=f">= {TARGET:,.0f} /s and >= {TARGET_RATIO:.0f}× naive",
                met=ours >= TARGET and ours >= TARGET_RATIO * base,
            )
        ],
    )


if __name__ == "__main__":
    main()
