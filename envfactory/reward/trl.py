"""The composite reward as a TRL reward function (`ToolUseReward`), and `record_columns`, the per-sample
record fields read from TRL's dataset columns."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from envfactory.config import Settings, get_settings
from envfactory.env.pool import EnvPool
from envfactory.reward.record import _load_json
from envfactory.reward.scorer import CompositeReward
from envfactory.reward.settings import RecordError, RewardResult, RewardSettings

log = logging.getLogger("envfactory.reward")  # the package's logger: records keep the name they had

_FIELDS = ("ground_truth", "initial_config", "final_config", "mcp_servers")


def record_columns(kwargs: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """Per-sample record fields from TRL's dataset columns: flat `ground_truth`, `initial_config`,
    `final_config`, `mcp_servers`, or the reference's nesting (`reward_model.ground_truth`,
    `extra_info.mcp_factory_kwargs.*`, or a `mcp_factory_kwargs` column). Raises ValueError when the
    dataset lacks them (a configuration error, not model output)."""
    rows: list[dict[str, Any]] = [{} for _ in range(n)]

    def column(name: str) -> list[Any] | None:
        value = kwargs.get(name)
        if value is None:
            return None
        if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != n:
            raise ValueError(f"reward column '{name}' must be a list with one value per completion ({n})")
        return list(value)

    for name in _FIELDS:
        col = column(name)
        if col is not None:
            for row, v in zip(rows, col, strict=True):
                if v is not None:  # a row's null leaves the field to the nested columns (a mixed dataset's gaps)
                    row[name] = v
    nested = column("mcp_factory_kwargs")
    extra = column("extra_info")
    model = column("reward_model")
    for i, row in enumerate(rows):
        # the nested columns as objects or as JSON strings (a dataset saved with them serialized)
        info = _nested(extra[i], "extra_info") if extra is not None else None
        mfk = nested[i] if nested is not None else None
        if mfk is None and isinstance(info, Mapping):
            mfk = info.get("mcp_factory_kwargs")
        mfk = _nested(mfk, "mcp_factory_kwargs")
        if isinstance(mfk, Mapping):
            for name in _FIELDS[1:]:
                if row.get(name) is None and mfk.get(name) is not None:
                    row[name] = mfk.get(name)
        judged = _nested(model[i], "reward_model") if model is not None else None
        if "ground_truth" not in row and isinstance(judged, Mapping):
            row["ground_truth"] = judged.get("ground_truth")
    # a column the dataset has counts, whatever its cells hold (a mixed dataset's nulls are rows without the field)
    missing = [f for f in ("ground_truth", "final_config") if f not in kwargs and all(f not in r for r in rows)]
    if n and missing:
        raise ValueError(
            f"the dataset gives no {' or '.join(missing)}: pass columns {', '.join(_FIELDS)} "
            "or the RL record's reward_model / extra_info"
        )
    return rows


def _nested(value: Any, what: str) -> Any:
    """A nested record column's value, read from JSON when it is text; unreadable, None: that row's record lacks
    the fields, and its reward is 0 with the reason (one bad row does not stop a training step)."""
    if value is None:
        return None
    try:
        return _load_json(value, what)
    except RecordError as e:
        log.warning("reward: %s", e)
        return None


class ToolUseReward:
    """The composite reward as a TRL reward function: `reward(prompts, completions, **columns) -> list[float]`.

    `GRPOTrainer(reward_funcs=[ToolUseReward()], ...)`. Columns are read per sample (see
    `record_columns`); α follows `settings.alpha_schedule` from `trainer_state` when one is set. Model
    output never raises (0.0, the reason kept in `last_results`); components go to TRL's `log_metric`
    (`<name>/r_traj`, `/r_state`, `/length_penalty`, `/format_penalty`, `/unparseable`) and the first
    reasons to the completions table (`log_extra`). Picklable (caches are rebuilt after unpickling).
    """

    def __init__(
        self,
        pool: EnvPool | None = None,
        settings: RewardSettings | None = None,
        *,
        name: str = "tool_use_reward",
        log_reasons: bool = True,
    ) -> None:
        self.__name__ = name
        self.settings = settings or RewardSettings()
        self.log_reasons = log_reasons
        self._pool_settings: Settings = (pool.settings if pool is not None else get_settings()).model_copy()
        self._scorer: CompositeReward | None = CompositeReward(pool, self.settings) if pool is not None else None
        self.last_results: list[RewardResult] = []

    @property
    def scorer(self) -> CompositeReward:
        if self._scorer is None:
            self._scorer = CompositeReward(EnvPool(self._pool_settings), self.settings)
        return self._scorer

    def __getstate__(self) -> dict[str, Any]:
        return {
            "__name__": self.__name__,
            "settings": self.settings,
            "log_reasons": self.log_reasons,
            "_pool_settings": self._pool_settings,
            "_scorer": None,
            "last_results": [],
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        n = len(completions)
        rows = record_columns(kwargs, n)
        trainer_state = kwargs.get("trainer_state")
        step = getattr(trainer_state, "global_step", None)
        total = getattr(trainer_state, "max_steps", None)
        scorer = self.scorer
        results = [
            scorer.score(
                completions[i],
                rows[i].get("ground_truth"),
                rows[i].get("initial_config"),
                rows[i].get("final_config"),
                rows[i].get("mcp_servers"),
                step=step if isinstance(step, int) else None,
                total_steps=total if isinstance(total, int) else None,
            )
            for i in range(n)
        ]
        self.last_results = results
        self._log(results, kwargs)
        return [r.reward for r in results]

    def _log(self, results: list[RewardResult], kwargs: Mapping[str, Any]) -> None:
        if not results:
            return
        log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
        n = len(results)
        try:
            if callable(log_metric):
                log_metric(f"{self.__name__}/r_traj", sum(r.r_traj for r in results) / n)
                log_metric(f"{self.__name__}/r_state", sum(r.r_state for r in results) / n)
                log_metric(f"{self.__name__}/length_penalty", sum(r.length_penalty for r in results) / n)
                log_metric(f"{self.__name__}/format_penalty", sum(r.format_penalty for r in results) / n)
                log_metric(f"{self.__name__}/unparseable", sum(r.n_unparseable > 0 for r in results) / n)
                log_metric(f"{self.__name__}/alpha", results[0].alpha)
            if callable(log_extra) and self.log_reasons:
                log_extra(f"{self.__name__}_why", ["; ".join(r.reasons[:3]) for r in results])
        except Exception:  # logging must never cost a training step
            log.debug("reward: TRL logging failed", exc_info=True)
