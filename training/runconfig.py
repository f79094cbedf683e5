"""Run configs of the training entry points: a YAML file, an optional profile in it, command-line overrides.

A config file holds the run's own keys (`model`, `data`, `output`, `dtype`, `chat_template`, ...) and a
`trainer:` mapping passed as is to TRL's `SFTConfig` / `GRPOConfig` (so every TRL option is available and TRL
validates it). `profiles:` maps a name to overrides merged over the file (mappings merge key by key), e.g. the
`cpu` profile of the smoke test: `--profile cpu`. Command-line flags override both. Relative paths are taken
from the current folder (run from the project root).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envfactory.errors import ConfigError, first_error
from envfactory.inputs import InputError, parse_yaml, read_yaml
from training.loading import ChatTemplateMode, Dtype

C = TypeVar("C", bound="RunConfig")


class RunConfigError(ConfigError, ValueError):
    """A config file that cannot be read or does not validate: the message says where."""


class RunConfig(BaseModel):
    """What SFT and GRPO runs share."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="HF folder / hub id, a .gguf file, gemma3-270m-gguf or tiny-gemma3")
    data: Path = Field(description="exported TRL dataset: a folder with train.jsonl, or a JSONL file")
    output: Path = Field(description="checkpoint folder (TRL's output_dir); the final model goes here")
    dtype: Dtype = "auto"
    chat_template: ChatTemplateMode = Field(
        default="auto", description="auto: install EnvFactory's tool template when the tokenizer has none"
    )
    max_samples: int | None = Field(default=None, ge=1, description="use only the first N rows")
    seed: int = 0
    trainer: dict[str, Any] = Field(default_factory=dict, description="TRL SFTConfig / GRPOConfig arguments")


class _Unset:
    """`--set KEY=null` of a run's own key (`max_samples`): taken away, its default applies, where a None override
    means "not given"; a trainer argument's null stays None (what TRL reads as none: no truncation)."""

    def __repr__(self) -> str:
        return "null"


UNSET = _Unset()


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if value is UNSET:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = _without_unset(value)
    return out


def _without_unset(value: Any) -> Any:
    """A mapping set whole, less its `UNSET` keys (nothing to take them from)."""
    if isinstance(value, dict):
        return {k: _without_unset(v) for k, v in value.items() if v is not UNSET}
    return value


def read_config_file(path: Path, profile: str | None = None) -> dict[str, Any]:
    """The file's mapping with `profile` merged in (and `profiles` removed)."""
    try:
        raw = read_yaml(path, what="run config")
    except InputError as e:
        raise RunConfigError(str(e)) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RunConfigError(f"{path}: must hold a mapping")
    profiles = raw.pop("profiles", None) or {}
    if not isinstance(profiles, dict):
        raise RunConfigError(f"{path}: profiles must map names to overrides")
    if profile is not None:
        if profile not in profiles:
            known = ", ".join(sorted(profiles)) or "none"
            raise RunConfigError(f"{path}: no profile '{profile}' (profiles: {known})")
        if not isinstance(profiles[profile], dict):
            raise RunConfigError(f"{path}: profile '{profile}' must be a mapping")
        raw = deep_merge(raw, profiles[profile])
    return raw


def load_run_config(
    cls: type[C], path: Path | None, profile: str | None = None, overrides: dict[str, Any] | None = None
) -> C:
    """`cls` from the file (and profile) with `overrides` (None values ignored; `UNSET`, a `--set KEY=null`, takes the
    key away so its default applies) merged over it."""
    raw = read_config_file(path, profile) if path is not None else {}
    raw = deep_merge(raw, {k: v for k, v in (overrides or {}).items() if v is not None})
    trainer = raw.get("trainer")
    if isinstance(trainer, dict) and "seed" in trainer and "seed" in raw and trainer["seed"] != raw["seed"]:
        raise RunConfigError(  # the trainer's would win in silence
            f"seed {raw['seed']} ({path or 'config'} or --set) and trainer.seed {trainer['seed']} differ: set `seed` "
            "alone (--set seed=N), the trainer takes it"
        )
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        where, msg = first_error(e, "<root>")
        raise RunConfigError(f"{path or 'config'}: {where}: {msg}") from None


def dataset_file(data: Path) -> Path:
    """`train.jsonl` of an export folder, or the file itself."""
    path = data / "train.jsonl" if data.is_dir() else data
    if not path.is_file():
        raise RunConfigError(f"{data}: no exported dataset there (run `envfactory export RUN --format ... --out DIR`)")
    return path


def trainer_arguments(config: RunConfig, **forced: Any) -> dict[str, Any]:
    """The `trainer:` mapping with the run's output folder and seed, and offline-safe defaults."""
    args = dict(config.trainer)
    args.setdefault("report_to", "none")
    args.setdefault("seed", config.seed)
    args["output_dir"] = str(config.output)
    args.update(forced)
    return args


def add_common_arguments(parser: argparse.ArgumentParser, default_config: Path) -> None:
    parser.add_argument("--config", type=Path, default=default_config, help="YAML run config")
    parser.add_argument("--profile", default=None, help="a profile of the config file (e.g. cpu)")
    parser.add_argument("--data", type=Path, default=None, help="exported dataset folder or JSONL file")
    parser.add_argument("--model", default=None, help="HF folder / hub id, .gguf, gemma3-270m-gguf, tiny-gemma3")
    parser.add_argument("--output", type=Path, default=None, help="checkpoint folder")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after N optimizer steps")
    parser.add_argument("--max-samples", type=int, default=None, help="use only the first N rows")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, dotted, value read as YAML (e.g. trainer.vllm_mode=server; KEY=null takes the "
        "key away, its default applies; a quoted value stays text); repeatable",
    )


def _number(value: Any) -> Any:
    """YAML 1.1 reads `5e-05` or `1e6` (no dot) as a string; on the command line they are numbers."""
    if isinstance(value, str):
        try:
            return float(value) if value.strip().lower() not in ("nan", "inf", "-inf", "infinity") else value
        except ValueError:
            return value
    return value


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as a config mapping (None: not given)."""
    out: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise RunConfigError(f"--set {item!r}: expected KEY=VALUE")
        node = out
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise RunConfigError(f"--set {item!r}: '{part}' is set to a value and a mapping")
        try:
            parsed = parse_yaml(value, f"--set {item!r}")
        except InputError as e:
            raise RunConfigError(str(e)) from None
        quoted = value.strip()[:1] in ("'", '"')  # `--set 'trainer.run_name="1e3"'`: the text, as given
        if parsed is None:  # a run's own key: taken away (its default); a trainer argument: None, which TRL reads
            node[leaf] = None if parents else UNSET  # (`trainer.max_length=null`: no truncation)
        else:
            node[leaf] = parsed if quoted else _number(parsed)
    flags: dict[str, Any] = {
        "data": args.data,
        "model": args.model,
        "output": args.output,
        "max_samples": args.max_samples,
        "trainer": {"max_steps": args.max_steps} if args.max_steps is not None else None,
    }
    return deep_merge(out, {k: v for k, v in flags.items() if v is not None})


def trainer_error(e: Exception) -> str:
    """A trainer config's error as one line, with the fix when it is the usual one (bf16 asked of a CPU)."""
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "bf16" in first:
        first += " (on a machine without a GPU, add --profile cpu)"
    return first
