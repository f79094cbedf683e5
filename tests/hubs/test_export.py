"""`envfactory envs export --format openenv|verifiers`: packages the real libraries load and run.

A synth run's turns become the tasks; each export is loaded with the library's own loader and driven by its
own client (OpenEnv's MCP tool client over its WebSocket server; verifiers' evaluate against a scripted
OpenAI-compatible server), and the reward the library reports must equal our composite reward of the same
calls against the same record — for the ground truth and for wrong trajectories.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from envfactory.cli.main import app
from envfactory.config import Settings
from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.hubs.episode import Task, load_tasks
from envfactory.hubs.export import HubExportError
from envfactory.reward.scorer import CompositeReward
from envfactory.serve.net import free_port
from envfactory.tasks.plan import SynthConfig
from envfactory.tasks.run import run_batch
from tests.support.hub import scripted_chat_server
from tests.support.paths import ROOT
from tests.support.serve import wait_for_port


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "run"
    config = SynthConfig.model_validate({"envs": ["hotels", "banking"], "T": 3, "S": 1, "D": 2, "seed": 3, "out": out})
    with open(os.devnull, "w") as devnull:
        run_batch(
            config.model_copy(update={"plot": False}), Settings(root=ROOT, bfcl=False), console=Console(file=devnull)
        )
    return out


def _export(run: Path, out: Path, fmt: str, *names: str) -> Path:
    result = CliRunner().invoke(
        app, ["envs", "export", *names, "--format", fmt, "--tasks", str(run), "--out", str(out)]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    return out


def _calls(task: Task) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, dict(c.arguments)) for c in task.record.ground_truth_calls()]


def _wrong(task: Task) -> list[tuple[str, dict[str, Any]]]:
    """The ground truth less its last call, plus a call with a wrong argument and one to no tool at all."""
    calls = _calls(task)
    name, arguments = calls[-1]
    bad = {k: (v + "x" if isinstance(v, str) else v) for k, v in arguments.items()}
    return [*calls[:-1], (name, bad), ("no_such_tool", {})]


def ours(scorer: CompositeReward, task: Task, calls: list[tuple[str, dict[str, Any]]]) -> float:
    """Our reward of these calls, made as a model's OpenAI messages, against the task's record."""
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for n, a in calls],
    }
    kwargs = task.record.extra_info.mcp_factory_kwargs
    return scorer.score(
        [message], task.record.reward_model.ground_truth, kwargs.initial_config, kwargs.final_config, kwargs.mcp_servers
    ).reward


@pytest.fixture(scope="module")
def scorer() -> CompositeReward:
    return CompositeReward(EnvPool(Settings(root=ROOT, bfcl=False)))


# ---- OpenEnv -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openenv_package(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, list[Task]]]:
    """(the package's client class, its server's URL, its tasks): the server as OpenEnv runs it (uvicorn)."""
    out = _export(run, tmp_path_factory.mktemp("openenv") / "pkg", "openenv", "hotels", "banking")
    module = json.loads((out / "envfactory_pool_env" / "data" / "export.json").read_text())["module"]
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{out}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "uvicorn", f"{module}.server.app:app", "--port", str(port), "--log-level", "warning"]
    log = out.parent / "server.log"  # a file, not a pipe: OpenEnv logs a traceback per closed session
    with log.open("wb") as sink:
        server = subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.DEVNULL, stderr=sink)
    wait_for_port(port, server, "the OpenEnv server", log, timeout_s=60)
    sys.path.insert(0, str(out))
    try:
        package = importlib.import_module(module)
        yield package.EnvfactoryPoolEnv, f"http://127.0.0.1:{port}", package.tasks()
    finally:
        sys.path.remove(str(out))
        server.terminate()
        server.wait(10)


def test_openenv_export_reports_our_reward(
    openenv_package: tuple[Any, str, list[Task]], scorer: CompositeReward
) -> None:
    from openenv.core.env_server.mcp_types import CallToolAction

    client_cls, url, tasks = openenv_package
    assert tasks and len({t.id for t in tasks}) == len(tasks)

    async def episode(task: Task, calls: list[tuple[str, dict[str, Any]]]) -> tuple[float | None, list[str], Any]:
        async with client_cls(base_url=url) as env:
            reset = await env.reset(task_id=task.id)
            offered = [t.name for t in await env.list_tools()]
            reward = None
            for name, arguments in calls:
                step = await env.step(CallToolAction(tool_name=name, arguments=arguments))
                reward = step.reward
            return reward, offered, reset.observation

    checked = 0
    for task in tasks[:6]:
        for calls in (_calls(task), _wrong(task)):
            reported, offered, first = asyncio.run(episode(task, calls))
            assert offered == [t["function"]["name"] for t in task.tools]
            # reset() lists the same tools as list_tools(), schemas included (it listed empty names and schemas)
            assert [(t.name, t.input_schema) for t in first.tools] == [
                (t["function"]["name"], t["function"]["parameters"]) for t in task.tools
            ]
            assert reported == pytest.approx(ours(scorer, task, calls), abs=1e-9), (task.id, calls)
            checked += 1
        assert asyncio.run(episode(task, _calls(task)))[0] == 1.0
    assert checked >= 4


def _mutated(value: Any) -> Any:
    """A value of the same kind that is not the recorded one (a wrong argument a model might send)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    return None


@st.composite
def _episodes(
    draw: st.DrawFn, tasks: list[Task], among: list[Task] | None = None
) -> tuple[Task, list[tuple[str, dict[str, Any]]]]:
    """A task (of `among`, default all) and calls a policy might make on it: the recorded calls in any order,
    repeated or left out, with an argument changed, dropped or added, other tasks' tools, tools that exist
    nowhere."""
    task = draw(st.sampled_from(among or tasks))
    recorded = _calls(task) or [("no_such_tool", {})]
    foreign = [c for t in tasks if t is not task for c in _calls(t)]

    @st.composite
    def call(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
        name, arguments = draw(st.sampled_from(recorded))
        kind = draw(st.sampled_from(["as recorded", "changed", "dropped", "added", "foreign", "unknown"]))
        if kind == "changed" and arguments:
            key = draw(st.sampled_from(sorted(arguments)))
            return name, {**arguments, key: _mutated(arguments[key])}
        if kind == "dropped" and arguments:
            key = draw(st.sampled_from(sorted(arguments)))
            return name, {k: v for k, v in arguments.items() if k != key}
        if kind == "added":
            return name, {**arguments, "unexpected": draw(st.integers(0, 9))}
        if kind == "foreign" and foreign:
            return draw(st.sampled_from(foreign))
        if kind == "unknown":
            return draw(st.sampled_from(["no_such_tool", "", "../etc/passwd"])), {}
        return name, dict(arguments)

    return task, draw(st.lists(call(), min_size=1, max_size=7))


def test_openenv_reward_equals_ours_for_any_call_sequence(
    openenv_package: tuple[Any, str, list[Task]], scorer: CompositeReward
) -> None:
    """Property: whatever calls a policy makes (random sequences over every exported task), the reward OpenEnv's
    own client reports after the last step equals our composite reward of the same calls."""
    from openenv.core.env_server.mcp_types import CallToolAction

    client_cls, url, tasks = openenv_package

    async def episode(task: Task, calls: list[tuple[str, dict[str, Any]]]) -> float | None:
        async with client_cls(base_url=url) as env:
            await env.reset(task_id=task.id)
            reward = None
            for name, arguments in calls:
                reward = (await env.step(CallToolAction(tool_name=name, arguments=arguments))).reward
            return reward

    seen: set[float] = set()

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(_episodes(tasks))
    def check(drawn: tuple[Task, list[tuple[str, dict[str, Any]]]]) -> None:
        task, calls = drawn
        expected = ours(scorer, task, calls)
        assert asyncio.run(episode(task, calls)) == pytest.approx(expected, abs=1e-9), (task.id, calls)
        seen.add(round(expected, 6))

    check()
    assert len(seen) >= 3, seen  # the sequences reached different rewards, not one value every time


def test_openenv_sessions_are_isolated(openenv_package: tuple[Any, str, list[Task]]) -> None:
    from openenv.core.env_server.mcp_types import CallToolAction

    client_cls, url, tasks = openenv_package
    task = next(t for t in tasks if any(n == "book_room" for n, _ in _calls(t)))
    booking = next(a for n, a in _calls(task) if n == "book_room")

    async def book() -> Any:
        async with client_cls(base_url=url) as env:
            await env.reset(task_id=task.id)
            step = await env.step(CallToolAction(tool_name="book_room", arguments=booking))
            return step.observation.result["data"]

    async def both() -> list[Any]:
        return await asyncio.gather(book(), book(), book())

    results = asyncio.run(both())
    assert all(r == results[0] for r in results), results  # each session booked on its own fresh state
    assert "id" in results[0]


def test_openenv_unknown_task_is_an_error_not_a_crash(openenv_package: tuple[Any, str, list[Task]]) -> None:
    client_cls, url, _ = openenv_package

    async def reset() -> None:
        async with client_cls(base_url=url) as env:
            await env.reset(task_id="../../etc/passwd")

    with pytest.raises(Exception, match="no task"):
        asyncio.run(reset())


def test_openenv_runs_no_call_outside_an_episode(run: Path, tmp_path: Path) -> None:
    """A raw client that does not stop at `done` went on running (and scoring) calls, and a step before any
    reset silently started the first task: both are now an error observation, and nothing runs."""
    from openenv.core.env_server.mcp_types import CallToolAction

    from envfactory.hubs.openenv_env import EnvFactoryEnvironment

    out = _export(run, tmp_path / "pkg", "openenv", "hotels", "banking")

    class Env(EnvFactoryEnvironment):
        data_folder = out / "envfactory_pool_env" / "data"
        max_calls = 2

    env = Env()
    task = load_tasks(Env.data_folder / "tasks.jsonl")[0]
    name, arguments = _calls(task)[0]
    early = env.step(CallToolAction(tool_name=name, arguments=arguments))
    assert early.done and early.error is not None and "reset first" in early.error.message and env.episode is None
    env.reset(task_id=task.id)
    steps = [env.step(CallToolAction(tool_name=name, arguments=arguments)) for _ in range(3)]
    assert [o.done for o in steps] == [False, True, True] and len(env.episode.calls) == 2  # type: ignore[union-attr]
    assert steps[2].error is not None and "the episode is over" in steps[2].error.message
    assert steps[2].reward == steps[1].reward


# ---- verifiers -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def verifiers_package(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    # its own module name: the OpenEnv package above is already imported as envfactory_pool_env
    out = _export(run, tmp_path_factory.mktemp("verifiers") / "pkg", "verifiers", "--name", "pool_tasks")
    module = json.loads(next(out.glob("*/data/export.json")).read_text())["module"]
    sys.path.insert(0, str(out))
    try:
        yield out, module
    finally:
        sys.path.remove(str(out))


def test_verifiers_export_reports_our_reward(verifiers_package: tuple[Path, str], scorer: CompositeReward) -> None:
    import verifiers as vf
    from openai import AsyncOpenAI

    out, module = verifiers_package
    env = vf.load_environment(module)  # the library's own loader, by module name
    tasks = load_tasks(next(out.glob("*/data/tasks.jsonl")))
    first = tasks[0]  # evaluate's first example
    for calls in (_calls(first), _wrong(first)):
        with scripted_chat_server(calls) as base_url:
            client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key="x"))
            results = asyncio.run(
                env.evaluate(client, "scripted", num_examples=1, rollouts_per_example=2, on_progress=lambda *a: None)
            )
        rewards = [o["reward"] for o in results["outputs"]]
        assert rewards == pytest.approx([ours(scorer, first, calls)] * 2, abs=1e-9), calls
        for o in results["outputs"]:
            assert o["info"]["task_id"] == first.id
            assert {"verifier_state_match", "trajectory_match"} <= o["metrics"].keys()
    assert rewards[0] < 1.0


def test_verifiers_reward_equals_ours_for_any_call_sequence(
    verifiers_package: tuple[Path, str], scorer: CompositeReward
) -> None:
    """Property: random call sequences (as for OpenEnv above) made by a scripted model through verifiers' own
    rollout loop get the reward ours gives the same calls."""
    import verifiers as vf
    from openai import AsyncOpenAI

    out, module = verifiers_package
    env = vf.load_environment(module)
    tasks = load_tasks(next(out.glob("*/data/tasks.jsonl")))
    seen: set[float] = set()

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(_episodes(tasks, among=tasks[:1]))  # evaluate's first example
    def check(drawn: tuple[Task, list[tuple[str, dict[str, Any]]]]) -> None:
        task, calls = drawn
        with scripted_chat_server(calls) as base_url:
            client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key="x"))
            results = asyncio.run(
                env.evaluate(client, "scripted", num_examples=1, rollouts_per_example=1, on_progress=lambda *a: None)
            )
        [output] = results["outputs"]
        expected = ours(scorer, task, calls)
        assert output["reward"] == pytest.approx(expected, abs=1e-9), calls
        seen.add(round(expected, 6))

    check()
    assert len(seen) >= 2, seen


def test_verifiers_scores_only_the_calls_that_ran(verifiers_package: tuple[Path, str], scorer: CompositeReward) -> None:
    """verifiers runs a message's calls only to build the next prompt: at `max_turns` the last message's calls never
    run. A reviewer's rollout scored 1.0 for a ground truth whose last call never ran (0.4 for what ran)."""
    import verifiers as vf
    from openai import AsyncOpenAI

    out, module = verifiers_package
    first = load_tasks(next(out.glob("*/data/tasks.jsonl")))[0]  # evaluate's first example
    calls = _calls(first)
    env = vf.load_environment(module, max_turns=len(calls))  # the last call is made at the limit, never run
    with scripted_chat_server(calls) as base_url:
        client = vf.OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key="x"))
        results = asyncio.run(
            env.evaluate(client, "scripted", num_examples=1, rollouts_per_example=1, on_progress=lambda *a: None)
        )
    [output] = results["outputs"]
    assert output["reward"] == pytest.approx(ours(scorer, first, calls[:-1]), abs=1e-9)
    assert output["reward"] < ours(scorer, first, calls)


def test_a_call_counts_as_run_only_if_its_own_turn_answered_it() -> None:
    """Ids repeat across turns (`call_0` numbered per message) or are empty: an answer in an earlier turn does not
    make a later, unrun call count."""
    from envfactory.hubs.verifiers_env import _as_run

    ran = {"role": "assistant", "tool_calls": [{"id": "call_0", "name": "a"}, {"id": "", "name": "b"}]}
    answers = [{"role": "tool", "tool_call_id": "call_0"}, {"role": "tool", "tool_call_id": ""}]
    unrun = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "name": "c"}, {"id": "", "name": "d"}]}
    assert _as_run([ran, *answers, unrun]) == [ran, *answers, {"role": "assistant", "content": ""}]
    half = {"role": "assistant", "tool_calls": [{"id": "x", "name": "e"}, {"id": "y", "name": "f"}]}
    out = _as_run([half, {"role": "tool", "tool_call_id": "y"}])
    assert out[0]["tool_calls"] == [{"id": "y", "name": "f"}]


def test_export_errors_are_actionable(run: Path, tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    cases = [
        (["envs", "export", "hotels", "--out", str(tmp_path / "full")], "not empty"),
        (["envs", "export", "nope", "--out", str(tmp_path / "a")], "no environment folder"),
        (["envs", "export", "hotels", "--name", "Bad-Name", "--out", str(tmp_path / "b")], "package name"),
        (["envs", "export", "flights", "--tasks", str(run), "--out", str(tmp_path / "c")], "none of the"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(app, args)
        assert isinstance(result.exception, HubExportError) and message in str(result.exception), (args, result)
    for args, message in [  # refused by the CLI's --out check (envfactory.cli.args) before the export starts
        (["envs", "export", "hotels", "--out", str(tmp_path / "full" / "keep.txt")], "is a file"),
        (["envs", "export", "hotels", "--out", str(tmp_path / "full" / "keep.txt" / "under")], "is not a folder"),
    ]:
        result = CliRunner().invoke(app, args)
        assert isinstance(result.exception, EnvFactoryError) and message in str(result.exception), (args, result)
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_a_reexport_in_another_format_is_refused(run: Path, tmp_path: Path) -> None:
    """Exporting again into a folder replaces an export of the same format; one of the other format would leave
    the first one's files (OpenEnv's server, verifiers' environment) beside the new ones, so it is refused."""
    out = _export(run, tmp_path / "pkg", "openenv", "hotels")
    first = {f.relative_to(out): f.read_bytes() for f in sorted(out.rglob("*")) if f.is_file()}
    _export(run, out, "openenv", "hotels")  # the same format again: replaced in place
    # the same bytes (the package's trust pin carries the pool's own time; it was the export's, new each time)
    assert {f.relative_to(out): f.read_bytes() for f in sorted(out.rglob("*")) if f.is_file()} == first
    from envfactory.env.trust import load_trust

    [pins] = [load_trust(f).environments for f in out.rglob("trusted.json")]
    assert pins["hotels"].trusted_at == load_trust(ROOT / "configs" / "trusted.json").environments["hotels"].trusted_at
    result = CliRunner().invoke(app, ["envs", "export", "hotels", "--format", "verifiers", "--out", str(out)])
    assert isinstance(result.exception, HubExportError) and "earlier openenv export" in str(result.exception)
    assert not (out / "hotels_env" / "environment.py").exists()
    verifiers = _export(run, tmp_path / "vf", "verifiers", "hotels")
    assert '"verifiers>=0.3.1,<0.4"' in (verifiers / "pyproject.toml").read_text()  # 0.4 lacks the API it uses


def test_the_whole_pool_exports_with_its_trust_pins(tmp_path: Path) -> None:
    """`--all`: every environment folder of the pool, and exactly the copies of trusted folders pinned as trusted
    in the package (their code hash matches the original's)."""
    from envfactory.env.trust import is_trusted

    pool = EnvPool(Settings(root=ROOT, bfcl=False))
    out = tmp_path / "pool"
    result = CliRunner().invoke(app, ["envs", "export", "--all", "--format", "openenv", "--out", str(out)])
    assert result.exit_code == 0, (result.output, result.exception)
    data = out / "envfactory_pool_env" / "data"
    manifest = json.loads((data / "export.json").read_text())
    assert manifest["environments"] == pool.native_names() and manifest["tasks"] == 0
    for name in pool.native_names():
        assert is_trusted(data / "configs" / "trusted.json", name, data / "envs" / name) == pool.trusted(name)
