"""The OpenEnv and verifiers exports against a real OpenAI-compatible server: llama.cpp's, on SmolLM2-135M.

What a package sends a model — a task's prompt with its history (earlier turns: calls, tool results, answers) and
its tools — must be a request the server takes. Before, every verifiers row carried `"tool_calls": null` (Arrow's
padding), verifiers' own chat client added more, and OpenEnv's prompts carried arguments as objects: llama.cpp's
server answered each with HTTP 500, and verifiers recorded every prompt with history as an aborted rollout with
reward 0, as if the model had failed. Asserted: HTTP 200 for every task's prompt as each package sends it, and a
verifiers `evaluate` with no aborted rollout; OpenEnv's `reset()` lists the task's tools by name. Not the score.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from envfactory.cli.main import app
from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.records.run_folder import CONVERSATIONS
from envfactory.tasks.plan import Unit, run_units
from envfactory.tasks.run import offline_runner
from tests.chains import hotel_chain

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.external]  # llama.cpp's server with SmolLM2 (`make test-external`)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two hotel conversations of two turns: the second turn's prompt holds the first's calls, results, answer."""
    out = tmp_path_factory.mktemp("llama-export") / "run"
    settings = Settings(root=ROOT, bfcl=False)
    units = [
        Unit(key=f"u{i}", env="hotels", task=i, state_variant=0, depth=1, seed=seed, chain=hotel_chain())
        for i, seed in enumerate((4, 5))
    ]
    run_units(units, offline_runner(EnvPool(settings), settings), out, concurrency=1)
    assert len((out / CONVERSATIONS).read_text().splitlines()) == 2
    return out


def _export(run: Path, out: Path, fmt: str, name: str) -> Path:
    result = CliRunner().invoke(
        app, ["envs", "export", "hotels", "--format", fmt, "--tasks", str(run), "--out", str(out), "--name", name]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    return out / f"{name}_env" / "data"


def _post(base: str, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> httpx.Response:
    body = {"model": model, "messages": messages, "tools": tools, "max_tokens": 8, "temperature": 0}
    return httpx.post(f"{base}/chat/completions", json=body, timeout=300)


def _openai_tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def test_openenv_prompts_with_history_are_taken_by_the_server(
    run_dir: Path, tmp_path: Path, llama_server: tuple[str, str]
) -> None:
    """Each task as OpenEnv's `reset()` gives it — its prompt and its tools — sent as one request: HTTP 200."""
    from envfactory.hubs.openenv_env import EnvFactoryEnvironment

    base, model = llama_server
    data = _export(run_dir, tmp_path / "openenv", "openenv", "llama_oe")
    environment = type("LlamaEnvironment", (EnvFactoryEnvironment,), {"data_folder": data})()
    tasks = environment.data.tasks
    with_history = [t for t in tasks if any(m["role"] == "tool" for m in t.prompt)]
    assert with_history, "the export holds no task whose prompt has tool calls and results"
    for task in tasks:
        observation = environment.reset(task_id=task.id)
        assert [t.name for t in observation.tools] == [t["function"]["name"] for t in task.tools]  # real tools
        tools = [_openai_tool(t.name, t.description, t.input_schema) for t in observation.tools]
        reply = _post(base, model, observation.prompt, tools)
        assert reply.status_code == 200, (task.id, reply.text[:600])
    environment.close()


@pytest.fixture(scope="module")
def verifiers_module(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = _export(run_dir, tmp_path_factory.mktemp("verifiers"), "verifiers", "llama_vf")
    package = data.parent.parent
    sys.path.insert(0, str(package))
    try:
        yield "llama_vf_env"
    finally:
        sys.path.remove(str(package))


def test_verifiers_prompts_with_history_are_taken_by_the_server(
    verifiers_module: str, llama_server: tuple[str, str]
) -> None:
    """Each dataset row as the package's environment asks the model (verifiers' client, our null-free requests):
    HTTP 200, tools included."""
    import verifiers as vf
    from openai import AsyncOpenAI
    from verifiers.legacy.utils.message_utils import normalize_messages

    from envfactory.hubs.verifiers_env import NullFreeClient

    base, model = llama_server
    env = vf.load_environment(verifiers_module)
    client = NullFreeClient(vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base, api_key="EMPTY")))
    rows = list(env.get_dataset())
    assert any(any(m["role"] == "tool" for m in row["prompt"]) for row in rows)
    for row in rows:
        messages, _ = asyncio.run(client.to_native_prompt(normalize_messages(row["prompt"])))
        tools = [_openai_tool(t["name"], t["description"], t["parameters"]) for t in row["info"]["tool_defs"]]
        reply = _post(base, model, messages, tools)
        assert reply.status_code == 200, (row["info"]["task_id"], reply.text[:600])


def test_verifiers_evaluate_runs_every_prompt_with_history(
    verifiers_module: str, llama_server: tuple[str, str]
) -> None:
    """verifiers' own `evaluate` against the server: no rollout is aborted by a server error (each was, with
    reward 0, on every prompt with history)."""
    import verifiers as vf
    from openai import AsyncOpenAI

    base, model = llama_server
    env = vf.load_environment(verifiers_module, max_turns=2)
    client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base, api_key="EMPTY", max_retries=0))
    results = asyncio.run(
        env.evaluate(
            client,
            model,
            sampling_args={"max_tokens": 24, "temperature": 0},
            rollouts_per_example=1,
            on_progress=lambda *a: None,
        )
    )
    outputs = results["outputs"]
    assert len(outputs) == len(env.get_dataset()) and any(len(o["prompt"]) > 1 for o in outputs)
    for o in outputs:
        assert o["error"] is None, (o["info"], str(o["error"])[:600])
        assert 0.0 <= o["reward"] <= 1.0
