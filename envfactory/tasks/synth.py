"""The offline path (no LLM): one sampled chain → a verified task and a template conversation.

chain → initial databases (core batch + D−1 distractor batches, per environment) → π* executes the
chain → verifier (goal states; for a chain of reads only, the answer must state what the last
read returned) → SynthAPI's filter, v(Db⁰) = 0 and v(Exec(π*, Db⁰)) = 1, with Exec an independent
replay from Db⁰ → template queries and answers per turn → a `Conversation` marked `template`.
Every way a unit can fail is a `Dropped` record with a reason code, never an exception.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from envfactory.env.environment import Environment
from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.tasks.episode import replay
from envfactory.tasks.initial_state import generate_initial_state
from envfactory.tasks.models import (
    Assertion,
    Conversation,
    Node,
    Provenance,
    States,
    StateVerifier,
    Step,
    Task,
)
from envfactory.tasks.solver import SolverSettings, solve_chain, turn_spans
from envfactory.tasks.template import TemplateWriter, answer_fact, load_template
from envfactory.tasks.verifier import admissible
from envfactory.toolgraph.sampler import ToolChain

DropCode = Literal[
    "not_native",
    "state_generation",
    "unsolvable",
    "unverifiable",
    "goal_already_holds",
    "unsolved",
    "querygen",
    "error",
]


class Dropped(BaseModel):
    """A unit that produced no conversation, and why."""

    key: str
    code: DropCode
    reason: str
    tools: list[str] = []
    seed: int = 0


class UnitOutcome(BaseModel):
    key: str
    conversation: Conversation | None = None
    dropped: Dropped | None = None


def stable_seed(*parts: Any) -> int:
    """A seed from names and numbers that is the same in every process (Python's hash() is salted)."""
    return zlib.crc32("/".join(str(p) for p in parts).encode())


def initial_states(pool: EnvPool, servers: list[str], seed: int, depth: int) -> tuple[States, dict[str, Any]]:
    """Db⁰ for each environment of a chain and its core record ids."""
    states: States = {}
    core: dict[str, Any] = {}
    for name in servers:
        env = pool.get(name)
        if getattr(env, "blocking_io", False):  # a SandboxedEnvironment: its state model lives in a worker
            raise _NotNative(
                f"environment '{name}' is not trusted, so its state model only runs sandboxed; initial states are "
                f"generated in-process: review it and run `envfactory envs trust {name}`"
            )
        if not isinstance(env, Environment):
            raise _NotNative(f"environment '{name}' has no Pydantic state model to generate initial states from")
        made = generate_initial_state(env, seed=stable_seed(seed, name), depth=depth)
        states[name], core[name] = made.config, made.core_ids
    return states, core


class _NotNative(EnvFactoryError):
    pass


def synthesize_offline(
    pool: EnvPool,
    chain: ToolChain,
    *,
    key: str,
    seed: int,
    state_variant: int = 0,
    depth: int = 1,
    prompts_dir: Path,
    solver: SolverSettings | None = None,
) -> UnitOutcome:
    """One unit of a batch: a kept conversation or a drop with its reason."""

    def drop(code: DropCode, reason: str) -> UnitOutcome:
        return UnitOutcome(key=key, dropped=Dropped(key=key, code=code, reason=reason, tools=chain.tools, seed=seed))

    try:
        initial, core = initial_states(pool, chain.servers, seed, depth)
    except _NotNative as e:
        return drop("not_native", str(e))
    except EnvFactoryError as e:
        return drop("state_generation", str(e))
    outcome = solve_chain(pool, chain, initial, core, seed=seed, settings=solver)
    if not outcome.ok:
        return drop("unsolvable", outcome.failure or "the privileged solver failed")
    metadata = {name: pool.get(name).metadata for name in chain.servers}
    writer = TemplateWriter(load_template(prompts_dir), metadata, random.Random(seed))
    spans = turn_spans(chain)
    answers: list[str] = []
    for start, end in spans:
        turn = outcome.planned[start:end]
        last = turn[-1]
        fact = answer_fact(outcome.results[end - 1].result, last.call.arguments) if last.kind == "read" else None
        answers.append(writer.answer(turn, fact))
    assertions: list[Assertion] = []
    if not any(p.kind == "write" for p in outcome.planned):
        fact = answer_fact(outcome.results[-1].result, outcome.planned[-1].call.arguments)
        if fact is None:
            return drop("unverifiable", "a chain of reads whose last result has nothing to report back")
        assertions.append(Assertion(kind="answer_contains", value=fact[1]))
    verifier = StateVerifier(goal={n: outcome.final[n] for n in chain.servers}, assertions=assertions)
    executed = replay(pool, [p.call for p in outcome.planned], initial)  # Exec(π*, Db⁰), independently
    kept, why = admissible(verifier, initial, executed.final, answers[-1])
    if not kept:
        code: DropCode = "goal_already_holds" if (why or "").startswith("goal_already_holds") else "unsolved"
        return drop(code, why or "")
    nodes: list[Node] = []
    before = initial
    for i, (start, end) in enumerate(spans):
        turn = outcome.planned[start:end]
        steps = [Step(role="user", content=writer.query(turn))]
        for p, r in zip(turn, outcome.results[start:end], strict=True):
            steps += [Step(role="tool_call", content=[p.call]), Step(role="tool_result", content=[r])]
        steps.append(Step(role="assistant", content=answers[i]))
        after = outcome.turn_final[i]
        nodes.append(
            Node(
                index=i,
                query=str(steps[0].content),
                user_intent=writer.intent(turn),
                steps=steps,
                mcp_servers=list(dict.fromkeys(p.call.server for p in turn)),
                initial_scenario=before,
                final_scenario=after,
                raw_tool_call=[p.call for p in turn],
                generator="template",
            )
        )
        before = after
    task = Task(
        id=key,
        instruction="\n".join(n.query for n in nodes),
        servers=chain.servers,
        initial_state=initial,
        verifier=verifier,
        solver=outcome.planned,
    )
    conversation = Conversation(
        id=key,
        servers=chain.servers,
        tools=chain.tools,
        nodes=nodes,
        task=task,
        provenance=Provenance(
            generator="template", seed=seed, chain_seed=chain.seed, state_variant=state_variant, depth=depth
        ),
    )
    return UnitOutcome(key=key, conversation=conversation)
