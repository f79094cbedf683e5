"""Statistics of a synthesized dataset, like the EnvFactory paper's (turns per conversation, steps per
turn, tool-call distribution), as a table and a PNG."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

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


def dataset_stats(conversations: list[Conversation]) -> DatasetStats:
    calls: Counter[str] = Counter()
    steps, per_turn = [], []
    conversations = in_id_order(conversations)  # the lists in the plan's order, whatever order units finished in
    for conv in conversations:
        for node in conv.nodes:
            node_calls = node.tool_calls()
            calls.update(c.qualified for c in node_calls)
            per_turn.append(len(node_calls))
            # a step, as the paper counts it: a tool call or a user interaction; the opening query is not one
            steps.append(len(node_calls) + sum(s.role in ("user", "assistant") for s in node.steps[1:]))
    return DatasetStats(
        conversations=len(conversations),
        turns=sum(len(c.nodes) for c in conversations),
        turns_per_conversation=[len(c.nodes) for c in conversations],
        steps_per_turn=steps,
        calls_per_turn=per_turn,
        tool_calls=dict(calls.most_common()),
        by_generator=dict(Counter(c.provenance.generator for c in conversations)),
        envs=dict(Counter(e for c in conversations for e in c.servers).most_common()),
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
