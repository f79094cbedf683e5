"""`envfactory eval` on verified turns: real environments, real rewards, the scripted model as the policy.

The ground truth played back as the model solves every turn and earns reward 1.0 (in native tool
calls and in Hermes text); wrong play fails with reasons; a model error is a recorded failed attempt;
a killed run resumes with no attempt lost or duplicated.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from envfactory.config import LLMSettings, Settings
from envfactory.env.pool import EnvPool
from envfactory.eval.agent import AgentLimits, run_agent
from envfactory.eval.items import EvalItem, EvalSourceError, items_from_conversations, load_conversations
from envfactory.eval.run import (
    ATTEMPTS,
    EvalRunError,
    EvalSettings,
    Runner,
    done_attempts,
    run_eval,
    turn_runner,
    unanswered,
)
from envfactory.eval.score import score_attempt
from envfactory.llm.openai_compat import openai_model
from envfactory.llm.scripted import ScriptedChatModel
from envfactory.reward import CompositeReward
from envfactory.tasks.plan import SynthConfig
from envfactory.tasks.run import run_batch
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("eval") / "run"
    settings = Settings(root=ROOT, bfcl=False, data_dir=tmp_path_factory.mktemp("data"))
    config = {"envs": ["hotels", "banking", "shop"], "T": 1, "S": 1, "D": 1, "seed": 3, "out": out, "plot": False}
    run_batch(SynthConfig.model_validate(config), settings, console=None)
    return out


@pytest.fixture(scope="module")
def pool() -> EnvPool:
    return EnvPool(Settings(root=ROOT, bfcl=False))


@pytest.fixture(scope="module")
def items(run_dir: Path, pool: EnvPool) -> list[EvalItem]:
    found = items_from_conversations(load_conversations(run_dir), pool)
    assert len(found) >= 6 and {i.kind for i in found} >= {"read", "write"}
    return found


def turns(pool: EnvPool) -> Runner[EvalItem]:
    return turn_runner(pool, AgentLimits())


def truth_play(item: EvalItem, *, text: bool = False) -> list[dict[str, Any]]:
    """The ground truth as scripted replies: its calls in one step, then an answer."""
    calls = [{"name": c.name, "args": dict(c.arguments)} for c in item.ground_truth]
    if text:
        blocks = "".join(
            f"<tool_call>{json.dumps({'name': c['name'], 'arguments': c['args']})}</tool_call>" for c in calls
        )
        first: dict[str, Any] = {"content": f"<think>the plan</think>{blocks}"}
    else:
        first = {"tool_calls": calls}
    return [first, {"content": "Done: here is what I found and did."}]


def play(items: list[EvalItem], attempts: int, **kw: Any) -> list[dict[str, Any]]:
    return [r for item in items for _ in range(attempts) for r in truth_play(item, **kw)]


def test_the_ground_truth_as_the_model_solves_every_turn(items: list[EvalItem], pool: EnvPool, tmp_path: Path) -> None:
    script = play(items, 2)
    summary = run_eval(
        items,
        lambda: ScriptedChatModel(script=script),
        turns(pool),
        tmp_path,
        EvalSettings(attempts=2),
    )
    records = done_attempts(tmp_path)
    assert len(records) == 2 * len(items) and all(r.success for r in records), [
        r.reasons for r in records if not r.success
    ]
    assert all(r.reward == pytest.approx(1.0) and r.r_state == 1.0 for r in records)
    assert (
        summary.success_rate == 1.0 and summary.pass_rates.pass_at[2] == 1.0 and summary.pass_rates.pass_hat[2] == 1.0
    )
    assert set(summary.by_env) == {i.env for i in items} and summary.errors == 0
    assert json.loads((tmp_path / "summary.json").read_text())["items"] == len(items)


def test_text_tool_calls_are_read_from_the_reply(items: list[EvalItem], pool: EnvPool) -> None:
    reward = CompositeReward(pool)
    for item in items[:4]:
        run = run_agent(ScriptedChatModel(script=truth_play(item, text=True)), pool, item, AgentLimits())
        score = score_attempt(pool, item, run, reward)
        assert score.success and run.text_calls == len(item.ground_truth), score.reasons


def test_wrong_play_fails_with_reasons(items: list[EvalItem], pool: EnvPool) -> None:
    reward = CompositeReward(pool)
    for item in items:
        idle = run_agent(ScriptedChatModel(script=["I would rather not."]), pool, item, AgentLimits())
        score = score_attempt(pool, item, idle, reward)
        assert not score.success and score.reasons and score.reward is not None and score.reward.reward < 1.0
        first = item.ground_truth[0]
        wrong = [{"tool_calls": [{"name": first.name, "args": {**first.arguments, "zz_unknown": 1}}]}, "done"]
        bad = run_agent(ScriptedChatModel(script=wrong), pool, item, AgentLimits())
        assert bad.results and not bad.results[0].ok and not score_attempt(pool, item, bad, reward).success


def test_a_reply_cut_at_the_token_cap_is_a_failure_that_says_so(items: list[EvalItem], pool: EnvPool) -> None:
    """A reply the server stopped at max_tokens (a call cut mid-JSON lands in no `tool_calls`) is not the model's
    final answer: the attempt fails saying which setting to raise, after running any calls made before it."""
    item = items[0]
    first = item.ground_truth[0]
    script = [
        {"tool_calls": [{"name": first.name, "args": first.arguments}]},
        {"content": '{"name": "book_room", "arguments": {"hotel_id": "H', "finish_reason": "length"},
    ]
    run = run_agent(ScriptedChatModel(script=script), pool, item, AgentLimits())
    assert run.error is not None and "max_tokens limit" in run.error and "MAX_TOKENS" in run.error, run.error
    assert not run.answer and len(run.results) == 1 and run.model_steps == 2
    whole = run_agent(ScriptedChatModel(script=["All done."]), pool, item, AgentLimits())  # stopped on its own
    assert whole.error is None and whole.answer == "All done."


def test_model_errors_and_spent_budgets_are_recorded_failures(
    items: list[EvalItem], pool: EnvPool, tmp_path: Path
) -> None:
    """A model whose server is not there is not a model that answered wrong: a run whose first attempts all end so
    stops in one line, and a resume tries them again (a server that was down scored 0.000 for ever). A request
    the server refused, or a scripted model with nothing left to say, is the model's failure: kept, not retried."""
    with socket.socket() as free:  # a real OpenAI-compatible client, its server down: nothing listens on the port
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    config = LLMSettings(
        provider="openai", model="m", base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0
    )
    with pytest.raises(
        EvalRunError, match=r"did not answer the first 3 attempt\(s\) \(model error: LLMCallError: cannot reach"
    ):
        run_eval(items[:3], lambda: openai_model("eval", config, []), turns(pool), tmp_path, EvalSettings())
    records = done_attempts(tmp_path)
    assert len(records) == 3 and all(unanswered(r) for r in records)
    summary = run_eval(
        items[:3], lambda: ScriptedChatModel(script=play(items[:3], 1)), turns(pool), tmp_path, EvalSettings()
    )
    assert summary.errors == 0 and summary.success_rate == 1.0 and summary.attempts == 3
    assert len(done_attempts(tmp_path)) == 3 and len((tmp_path / ATTEMPTS).read_text().splitlines()) == 6
    # the scripted model with nothing left: model errors of the model's own, recorded and kept on the next run
    spent = tmp_path / "spent"
    summary = run_eval(items[:3], lambda: ScriptedChatModel(script=[]), turns(pool), spent, EvalSettings())
    assert summary.errors == 3 and summary.success_rate == 0.0
    records = done_attempts(spent)
    assert all(r.error.startswith("model error: ScriptExhaustedError") and not unanswered(r) for r in records)  # type: ignore[union-attr]
    again = run_eval(
        items[:3], lambda: ScriptedChatModel(script=play(items[:3], 1)), turns(pool), spent, EvalSettings()
    )
    assert again.errors == 3 and len((spent / ATTEMPTS).read_text().splitlines()) == 3  # nothing rerun
    item = items[0]
    looping = [{"tool_calls": [{"name": item.ground_truth[0].name, "args": item.ground_truth[0].arguments}]}] * 3
    run = run_agent(ScriptedChatModel(script=looping), pool, item, AgentLimits(max_steps=3))
    assert run.error == "no final answer within 3 model steps" and run.model_steps == 3


def test_a_killed_run_resumes_with_no_attempt_lost_or_duplicated(
    items: list[EvalItem], pool: EnvPool, tmp_path: Path
) -> None:
    subset = items[:4]
    run_eval(
        subset,
        lambda: ScriptedChatModel(script=play(subset, 2)),
        turns(pool),
        tmp_path,
        EvalSettings(attempts=2),
    )
    log = tmp_path / ATTEMPTS
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:3]) + "\n" + lines[3][:25])  # three attempts survived, the fourth torn mid-line
    done = {(r.item, r.attempt) for r in done_attempts(tmp_path)}
    rest = [(i, k) for i in subset for k in range(2) if (i.id, k) not in done]
    script = [r for i, _ in rest for r in truth_play(i)]
    summary = run_eval(
        subset,
        lambda: ScriptedChatModel(script=script),
        turns(pool),
        tmp_path,
        EvalSettings(attempts=2),
    )
    keys = [(r.item, r.attempt) for r in done_attempts(tmp_path)]
    assert sorted(keys) == sorted({(i.id, k) for i in subset for k in range(2)}) and len(keys) == len(set(keys))
    assert summary.attempts == 8 and summary.success_rate == 1.0
    kept = json.loads((tmp_path / "summary.json").read_text())["pass_at_1_ci"]  # the interval the CLI prints, kept
    assert kept["estimate"] == 1.0 and kept["items"] == 4 and kept["level"] == 0.95
    log.write_text(log.read_text() + log.read_text().splitlines()[0] + "\n")  # a line written twice (two writers)
    assert len(done_attempts(tmp_path)) == 8  # counted once
    log.write_text(log.read_text() + '{"x": 1}\n')  # valid JSON, no attempt: one line naming it, not a traceback
    with pytest.raises(EvalRunError, match=r"attempts\.jsonl: row 10 is no attempt record \(item: Field required\)"):
        done_attempts(tmp_path)


def test_the_table_shows_one_k_for_every_row_when_items_had_unequal_attempts(
    items: list[EvalItem], pool: EnvPool, tmp_path: Path
) -> None:
    """An item whose later attempts could not run made the header say pass@1 while the other rows printed their own
    pass@2 under it."""
    from envfactory.cli.eval import summary_table

    short, half, good = items[0].id, items[1].id, turns(pool)

    def flaky(model: Any, item: EvalItem, k: int) -> Any:
        if item.id == short and k > 0:
            raise OSError("worker lost")
        return good(model, item, k)

    chosen = items[:3]
    script: list[Any] = []
    for i in chosen:
        for k in range(2):
            if i.id == short and k > 0:
                continue
            script += ["I cannot."] if (i.id == half and k == 1) else truth_play(i)  # `half` solves 1 of 2
    summary = run_eval(chosen, lambda: ScriptedChatModel(script=script), flaky, tmp_path, EvalSettings(attempts=2))
    assert list(summary.pass_rates.pass_at) == [1]
    table = summary_table(summary)
    assert table.columns[5].header == "pass@1"
    groups = [summary, *summary.by_env.values(), *summary.by_kind.values(), *summary.by_chain_length.values()]
    assert list(table.columns[5]._cells) == [f"{g.pass_rates.pass_at[1]:.3f}" for g in groups]
    assert any(g.pass_rates.pass_at.get(2, g.pass_rates.pass_at[1]) != g.pass_rates.pass_at[1] for g in groups)


def test_a_source_that_is_not_conversations_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EvalSourceError, match=r"has no conversations\.jsonl"):
        load_conversations(tmp_path)
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"id": "x"}\n')
    with pytest.raises(EvalSourceError, match=r"c\.jsonl:1: not a conversation"):
        load_conversations(bad)


def test_one_conversation_twice_or_one_turn_index_twice_is_refused(run_dir: Path, tmp_path: Path) -> None:
    """Two runs concatenated (both use ids hotels/t0/s0, ...) merged different turns into one item: 21 turns ran,
    reported as 12 items with 21 attempts at k=1, and a resume kept one record an (item, attempt) and reported
    12/12. A repeated turn index in one conversation did the same."""
    rows = (run_dir / "conversations.jsonl").read_text().splitlines()
    twice = tmp_path / "twice.jsonl"
    twice.write_text("\n".join([*rows, rows[0]]) + "\n")
    with pytest.raises(EvalSourceError, match=rf"is there twice \(conversations 1 and {len(rows) + 1}\)"):
        load_conversations(twice)
    row = json.loads(rows[0])
    row["nodes"] = [row["nodes"][0], {**row["nodes"][0]}]
    same_index = tmp_path / "index.jsonl"
    same_index.write_text(json.dumps(row) + "\n")
    with pytest.raises(EvalSourceError, match=r"turn index \d+ is given to two turns"):
        load_conversations(same_index)


def test_the_split_is_what_the_data_is(run_dir: Path, tmp_path: Path) -> None:
    """A run's heldout.jsonl given itself was evaluated and recorded as the train split; --split beside --suite was
    ignored (its split recorded as null); an attempt numbered below 0 was counted as one more attempt."""
    from envfactory.cli.eval import _data
    from envfactory.eval.run import AttemptRecord
    from envfactory.records.run_folder import HELDOUT

    held = tmp_path / HELDOUT
    held.write_text((run_dir / "conversations.jsonl").read_text())
    assert _data(held, None, None)[1] == "heldout"
    with pytest.raises(EvalRunError, match="held-out split: --split train contradicts it"):
        _data(held, None, "train")
    assert _data(run_dir / "conversations.jsonl", None, None)[1] == "train"
    with pytest.raises(EvalRunError, match="a --suite is evaluated whole"):
        _data(None, "bfcl-multi-turn-base", "heldout")
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        AttemptRecord.model_validate({"item": "x", "attempt": -5, "success": True})


def test_the_command_runs_resumes_and_prints_one_line_errors(
    run_dir: Path, items: list[EvalItem], tmp_path: Path
) -> None:
    """`envfactory eval` end to end in a subprocess, the scripted model set through the eval role's settings."""
    import subprocess
    import sys

    import yaml

    script = tmp_path / "script.yaml"
    script.write_text(yaml.safe_dump(play(items[:3], 1)))
    env = {
        **os.environ,
        "ENVFACTORY_ROOT": str(ROOT),
        "ENVFACTORY_BFCL": "false",
        "ENVFACTORY_LLM_ROLES__EVAL__PROVIDER": "scripted",
        "ENVFACTORY_LLM_ROLES__EVAL__SCRIPT": str(script),
        "COLUMNS": "200",
    }
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "envfactory.cli", "eval", str(run_dir), "--out", str(out), "--limit", "3"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "pass@1" in res.stdout and (out / "eval.png").stat().st_size > 1000
    assert "pass@1 1.000, 95% CI [1.000, 1.000] (bootstrap over 3 items, seed 0)" in res.stdout
    assert json.loads((out / "summary.json").read_text())["success_rate"] == 1.0
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)  # all done: nothing reruns
    assert again.returncode == 0 and len((out / ATTEMPTS).read_text().splitlines()) == 3
    missing = subprocess.run([*cmd[:4], str(tmp_path / "nowhere"), *cmd[5:]], env=env, capture_output=True, text=True)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and "does not exist" in missing.stderr

    def into(out: str, variables: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
        """The same command into `tmp_path / out`, with `variables` over the environment and `extra` options."""
        argv = [*cmd[:6], str(tmp_path / out), *cmd[7:], *extra]
        return subprocess.run(argv, env={**env, **variables}, capture_output=True, text=True, timeout=300)

    # a model that stops answering scores 0 like a wrong one: the console says how many attempts were errors
    short = tmp_path / "short.yaml"
    short.write_text(yaml.safe_dump(play(items[:1], 1)))
    cut = into("cut", {"ENVFACTORY_LLM_ROLES__EVAL__SCRIPT": str(short)})
    errors = json.loads((tmp_path / "cut" / "summary.json").read_text())["errors"]
    assert cut.returncode == 0 and errors >= 1, cut.stderr
    assert f"{errors} of 3 attempt(s) ended in an error, not an answer" in " ".join(cut.stderr.split())
    # a real OpenAI-compatible client whose server is down (a port nothing listens on): one line, exit 1
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    down = {
        "ENVFACTORY_LLM_ROLES__EVAL__PROVIDER": "openai",
        "ENVFACTORY_LLM_ROLES__EVAL__MODEL": "smollm2",
        "ENVFACTORY_LLM_ROLES__EVAL__BASE_URL": f"http://127.0.0.1:{port}/v1",
        "ENVFACTORY_LLM_ROLES__EVAL__API_KEY": "none",
        "ENVFACTORY_LLM_ROLES__EVAL__MAX_RETRIES": "0",
    }
    gone = into("down", down)
    last = gone.stderr.strip().splitlines()[-1]
    errors = [line for line in gone.stderr.splitlines() if line.startswith("error:")]
    assert gone.returncode == 1 and len(errors) == 1 and "Traceback" not in gone.stderr, gone.stderr
    assert last.startswith("error: the model did not answer the first 3 attempt(s) (model error: LLMCallError: cannot")
    # a model that answers nothing (a script with no reply: every attempt an error, none a transport one): the
    # scores say nothing, so the command does not end as a success either (it did: pass@1 0.000, exit 0)
    empty = tmp_path / "empty.yaml"
    empty.write_text("[]\n")
    none = into("none", {"ENVFACTORY_LLM_ROLES__EVAL__SCRIPT": str(empty)})
    errors = [line for line in none.stderr.splitlines() if line.startswith("error:")]
    assert none.returncode == 1 and len(errors) == 1 and "Traceback" not in none.stderr, none.stderr
    assert errors[0].startswith("error: every attempt's model call failed"), none.stderr
    summary = json.loads((tmp_path / "none" / "summary.json").read_text())
    assert summary["errors"] == summary["model_errors"] == 3  # what ran is kept
    # a model that answers but never finishes in its steps fails every attempt too: its own failure, scored (exit 0)
    steps = into("steps", {}, "--max-steps", "1")
    summary = json.loads((tmp_path / "steps" / "summary.json").read_text())
    assert steps.returncode == 0 and summary["errors"] >= 2 and summary["model_errors"] == 0, steps.stderr


def test_meta_tools_discovered_on_demand_solve_every_turn(items: list[EvalItem], pool: EnvPool) -> None:
    """SynthAPI's meta-tools: the model lists the apps, then calls each ground-truth tool through call_tool."""
    reward = CompositeReward(pool)
    limits = AgentLimits(tools="meta")
    for item in items:
        calls = [
            {
                "name": "call_tool",
                "args": {"app": c.server, "tool": c.tool, "arguments": dict(c.arguments)},
            }
            for c in item.ground_truth
        ]
        script = [{"tool_calls": [{"name": "list_apps", "args": {}}]}, {"tool_calls": calls}, "Done."]
        model = ScriptedChatModel(script=script)
        run = run_agent(model, pool, item, limits)
        score = score_attempt(pool, item, run, reward)
        assert score.success and score.reward is not None and score.reward.reward == pytest.approx(1.0), score
        assert model.bound_tools == ["list_apps", "list_tools", "get_tool_documentation", "call_tool"]
    wrong = [{"tool_calls": [{"name": "call_tool", "args": {"app": "nowhere", "tool": "x"}}]}, "Done."]
    run = run_agent(ScriptedChatModel(script=wrong), pool, items[0], limits)
    assert not score_attempt(pool, items[0], run, reward).success and run.results == []


def test_whole_conversations_carry_the_models_own_history(run_dir: Path, pool: EnvPool) -> None:
    """Conversation mode: one item per conversation, the later requests after the model's own answers."""
    conversations = load_conversations(run_dir)
    whole = items_from_conversations(conversations, pool, "conversation")
    turns = items_from_conversations(conversations, pool)
    assert len(whole) == len(conversations) and sum(1 + len(w.followups) for w in whole) == len(turns)
    reward = CompositeReward(pool)
    for item in whole:
        per_turn = [t for t in turns if t.conversation_id == item.id]
        script = [r for t in per_turn for r in truth_play(t)]
        model = ScriptedChatModel(script=script)
        run = run_agent(model, pool, item, AgentLimits())
        score = score_attempt(pool, item, run, reward)
        assert score.success and score.reward is not None and score.reward.reward == pytest.approx(1.0), score.reasons
        last_prompt = model.calls[-1].messages  # the model's own answers sit between the requests
        requests = [str(m.content) for m in last_prompt if m.type == "human"]
        assert requests[-len(item.followups) :] == item.followups
        assert [str(m.content) for m in last_prompt if m.type == "ai" and not m.tool_calls][: len(item.followups)]
        stop_early = run_agent(ScriptedChatModel(script=script[:2]), pool, item, AgentLimits())
        assert (
            item.followups
            and stop_early.error is not None
            and not score_attempt(pool, item, stop_early, reward).success
        )


def test_an_attempt_that_cannot_run_is_a_recorded_failure_retried_next_run(
    items: list[EvalItem], pool: EnvPool, tmp_path: Path
) -> None:
    """A runner that raises (not the model: the harness or its worker) writes failures.jsonl, not an attempt."""
    from envfactory.eval.run import FAILURES

    broken = items[1].id
    good = turns(pool)

    def flaky(model: Any, item: EvalItem, k: int) -> Any:
        if item.id == broken:
            raise OSError("disk gone")
        return good(model, item, k)

    chosen = items[:3]
    script = play([chosen[0], chosen[2]], 1)  # the broken one never reaches the model
    first = run_eval(chosen, lambda: ScriptedChatModel(script=script), flaky, tmp_path, EvalSettings())
    failures = [json.loads(x) for x in (tmp_path / FAILURES).read_text().splitlines()]
    assert failures == [{"item": broken, "attempt": 0, "reason": "OSError: disk gone"}]
    assert first.attempts == 2 and first.success_rate == 1.0 and broken not in {r.item for r in done_attempts(tmp_path)}
    again = run_eval(chosen, lambda: ScriptedChatModel(script=truth_play(items[1])), good, tmp_path, EvalSettings())
    assert again.attempts == 3 and again.success_rate == 1.0  # only the failed one ran again
