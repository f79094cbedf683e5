"""The composite reward's settings (`RewardSettings`, the α schedule), one completion's `RewardResult`,
and `RecordError` for an RL record that cannot be scored against."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from envfactory.errors import DataError
from envfactory.records.models import MaskSpec


class LinearSchedule(BaseModel):
    """α moving linearly from `start` to `end` over `steps` training steps (None: the trainer's max_steps)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start: float = Field(default=0.9, ge=0, le=1)
    end: float = Field(default=0.1, ge=0, le=1)
    steps: int | None = Field(default=None, ge=1)

    def value(self, step: int, total: int | None = None) -> float:
        n = self.steps or total
        if not n:
            return self.start
        return self.start + (self.end - self.start) * min(1.0, max(0.0, step / n))


class RewardSettings(BaseModel):
    """Weights, penalties and matching rules of the composite reward."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    alpha: float = Field(default=0.5, ge=0, le=1, description="weight of R_traj; 1 − α weighs R_state")
    alpha_schedule: LinearSchedule | None = Field(default=None, description="linear α over training steps")
    gamma: float = Field(default=0.05, ge=0, description="penalty per extra call (P_length)")
    length_penalty_cap: float = Field(default=0.5, ge=0)
    format_penalty: float = Field(default=0.05, ge=0, description="penalty per unparseable call attempt")
    format_penalty_cap: float = Field(default=0.5, ge=0)
    state_scope: Literal["changed", "all"] = Field(
        default="changed", description="changed: servers either side changed; all: every server (published)"
    )
    mask: MaskSpec = Field(default_factory=MaskSpec, description="volatile state parts ignored by R_state")
    mask_masked_values: bool = Field(default=True, description="also mask state fields holding masked arguments")
    case_sensitive: bool = Field(default=False, description="compare string arguments case-sensitively")
    rel_tol: float = Field(default=1e-6, ge=0)
    abs_tol: float = Field(default=1e-9, ge=0)
    replay_reads: bool = Field(
        default=False, description="also replay read calls (they cannot change state; only for n_failed)"
    )
    memoize_replays: bool = Field(
        default=True,
        description="completions of one record share what their calls give (deterministic tools): the same "
        "<tool_call> block is read once, the same calls are replayed and matched once",
    )
    max_calls: int = Field(default=64, ge=1, description="calls read from one completion; more are only counted")
    max_chars: int = Field(default=200_000, ge=1, description="characters of text read from one completion")
    max_match_states: int = Field(default=512, ge=1, description="beam of the order-tolerant matching")
    cache_size: int = Field(default=256, ge=0, description="records whose parsed form is kept")

    def alpha_at(self, step: int | None = None, total_steps: int | None = None) -> float:
        if self.alpha_schedule is None or step is None:
            return self.alpha
        return self.alpha_schedule.value(step, total_steps)


class RewardResult(BaseModel):
    """One completion's reward and its parts."""

    reward: float
    r_traj: float = 0.0
    r_state: float = 0.0
    p_length: int = Field(default=0, description="max(0, predicted calls − ground-truth calls)")
    length_penalty: float = 0.0
    format_penalty: float = 0.0
    alpha: float = 0.5
    n_pred: int = 0
    n_gt: int = 0
    matched: int = 0
    n_unparseable: int = 0
    n_failed: int = Field(
        default=0,
        description="calls outside the task, and replayed calls that returned an error (writes; reads too "
        "with replay_reads)",
    )
    reasons: list[str] = Field(default_factory=list)


class RecordError(DataError):
    """An RL record that cannot be scored against (bad JSON, unknown state shape): a data problem."""
