"""Statistics of a synthesized dataset, like the EnvFactory paper's (turns per conversation, steps per
turn, tool-call distribution), as a table and a PNG."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel

from envfactory.records.models import Conversation
from envfactory.records.run_folder import in_id_order
from envfactory.terminal import Table, safe


class DatasetStats(BaseModel):
    conversations: int
    turns: int
    turns_per_conversation: list[int]
    steps_per_turn: list[int]  # tool calls + user interactions after the query + the closing answer
    calls_per_turn: list[int]
    tool_calls: dict[str, int]  # "env.tool" → calls, most frequent first
    by_generator: dict[str, int]
    envs: dict[str, int]

    @staticmethod
    def _mean(values: list[int]) -> float:
        return sum(values) / len(values) if values else 0.0

    @property
    def mean_turns(self) -> float:
        return self._mean(self.turns_per_conversation)

    @property
    def mean_steps(self) -> float:
        return self._mean(self.steps_per_turn)

    @property
    def mean_calls(self) -> float:
        return self._mean(self.calls_per_turn)


class ConversationFacts(NamedTuple):
    """What the statistics read of one conversation: a run keeps these while it writes (`plan.RunLog`), not the
    conversation, whose model holds ~370 KB in ~600 objects (7× its JSON line) that the cyclic collector walks
    again and again; these are a few strings and numbers, in tuples the collector stops tracking."""

    id: str
    generator: str
    servers: tuple[str, ...]
    turns: tuple[tuple[tuple[str, ...], int], ...]  # per turn: the tools called ("env.tool"), its steps


def facts_of(conv: Conversation) -> ConversationFacts:
    turns = []
    for node in conv.nodes:
        called = tuple(c.qualified for c in node.tool_calls())
        # a step, as the paper counts it: a tool call or a user interaction; the opening query is not one
        turns.append((called, len(called) + sum(s.role in ("user", "assistant") for s in node.steps[1:])))
    return ConversationFacts(conv.id, conv.provenance.generator, tuple(conv.servers), tuple(turns))


def dataset_stats(conversations: Sequence[Conversation | ConversationFacts]) -> DatasetStats:
    facts = [c if isinstance(c, ConversationFacts) else facts_of(c) for c in conversations]
    facts = in_id_order(facts)  # the lists in the plan's order, whatever order units finished in
    calls: Counter[str] = Counter()
    steps, per_turn = [], []
    for conv in facts:
        for called, n_steps in conv.turns:
            calls.update(called)
            per_turn.append(len(called))
            steps.append(n_steps)
    return DatasetStats(
        conversations=len(facts),
        turns=sum(len(c.turns) for c in facts),
        turns_per_conversation=[len(c.turns) for c in facts],
        steps_per_turn=steps,
        calls_per_turn=per_turn,
        tool_calls=dict(calls.most_common()),
        by_generator=dict(Counter(c.generator for c in facts)),
        envs=dict(Counter(e for c in facts for e in c.servers).most_common()),
    )


def stats_table(stats: DatasetStats) -> Table:
    """The statistics as a table; the names in it (environments, generators: a run's data) escaped."""
    table = Table("measure", "value", title="dataset")
    rows = [
        ("conversations", str(stats.conversations)),
        ("turns", str(stats.turns)),
        ("turns per conversation (mean)", f"{stats.mean_turns:.2f}"),
        ("steps per turn (mean)", f"{stats.mean_steps:.2f}"),
        ("tool calls per turn (mean)", f"{stats.mean_calls:.2f}"),
        ("distinct tools called", str(len(stats.tool_calls))),
        ("generators", ", ".join(f"{safe(k)}: {v}" for k, v in stats.by_generator.items())),
        ("environments", ", ".join(f"{safe(k)}: {v}" for k, v in stats.envs.items())),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def plot_stats(stats: DatasetStats, path: Path, top: int = 20) -> Path:
    """Three panels: turns per conversation, steps per turn, the `top` most called tools."""
    import matplotlib

    matplotlib.use("Agg")  # no display here; and never pick an interactive backend in a worker
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, values, title in (
        (axes[0], stats.turns_per_conversation, "turns per conversation"),
        (axes[1], stats.steps_per_turn, "steps per turn"),
    ):
        counts = Counter(values)
        xs = sorted(counts)
        ax.bar(xs, [counts[x] for x in xs], color="#4c72b0")
        ax.set_title(f"{title} (mean {sum(values) / max(len(values), 1):.2f})")
        ax.set_xlabel(title.split(" per ")[0])
        ax.set_ylabel("count")
        ax.set_xticks(xs)
    names = list(stats.tool_calls)[:top][::-1]
    axes[2].barh(names, [stats.tool_calls[n] for n in names], color="#55a868")
    axes[2].set_title(f"tool calls (top {min(top, len(stats.tool_calls))} of {len(stats.tool_calls)})")
    axes[2].tick_params(axis="y", labelsize=7)
    fig.suptitle(f"{stats.conversations} conversations, {stats.turns} turns")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
