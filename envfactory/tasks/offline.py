"""The offline path (no LLM): one sampled chain → a verified task and a template conversation.

chain → initial databases (core batch + D−1 distractor batches, per environment) → π* executes the
chain → verifier (goal states; for a chain of reads only, the answer must state what the last
read returned) → SynthAPI's filter, v(Db⁰) = 0 and v(Exec(π*, Db⁰)) = 1, with Exec an independent
replay from Db⁰ → template queries and answers per turn → a `Conversation` marked `template`.
Every way a unit can fail is a `Dropped` record with a reason code, never an exception.
"""

from __future__ import annotations

import json
import logging
import random
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel

from envfactory.env.compiled import CompiledEnvironment
from envfactory.env.environment import Environment
from envfactory.env.pool import EnvPool
from envfactory.env.state_template import StateTemplates, templates_of
from envfactory.errors import EnvError, EnvFactoryError
from envfactory.records.episode import replay
from envfactory.records.models import (
    Assertion,
    Conversation,
    Node,
    PlannedCall,
    Provenance,
    States,
    StateVerifier,
    Step,
    Task,
    ToolResult,
)
from envfactory.records.verifier import admissible, answer_budget, verify
from envfactory.tasks.compose import join
from envfactory.tasks.conversation import ConversationWriter, Turn, spec_tools
from envfactory.tasks.initial_state import generate_initial_state
from envfactory.tasks.pi_star import CoreIds, PiStarOutcome, PiStarSettings, solve_chain
from envfactory.tasks.template import TemplateWriter, answer_fact, load_template
from envfactory.toolgraph.sampler import ToolChain

log = logging.getLogger(__name__)

DropCode = Literal[
    "not_native",
    "state_generation",
    "unsolvable",
    "incoherent",
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
        if not isinstance(env, Environment | CompiledEnvironment):
            raise _NotNative(
                f"environment '{name}' has no state model or compiled plan to generate initial states from"
            )
        made = generate_initial_state(env, seed=stable_seed(seed, name), depth=depth)
        states[name], core[name] = made.config, made.core_ids
    return states, core


class _NotNative(EnvError):
    pass


def _kind(pool: EnvPool, qualified: str) -> str:
    env, name = qualified.split(".", 1)
    return pool.get(env).metadata.tool(name).kind


def _grow(
    pool: EnvPool,
    chain: ToolChain,
    more: list[ToolChain],
    turns: tuple[int, int],
    seed: int,
    solve: Callable[[ToolChain], PiStarOutcome],
) -> tuple[ToolChain, PiStarOutcome]:
    """The chain in goal turns, joined by candidates from `more` while the whole still solves."""
    kind = partial(_kind, pool)
    want = random.Random(stable_seed(seed, "turns")).randint(*turns)
    joined = [chain]
    best = join(joined, kind)
    outcome = solve(best)
    if not outcome.ok:
        return best, outcome
    for candidate in more:
        if len(best.turns) >= want:
            break
        trial = join([*joined, candidate], kind)
        if len(trial.turns) > turns[1]:
            continue
        tried = solve(trial)
        if tried.ok and _repeated_writes(tried) <= _repeated_writes(outcome):
            joined, best, outcome = [*joined, candidate], trial, tried
    return best, outcome


def _repeated_writes(outcome: PiStarOutcome) -> int:
    """How many writes repeat one the conversation made before, to the same tool with the same arguments. A join that
    adds one is not taken: a user asking again for what was just done ("set up a build job with ..." a second
    time) reads as a repeated turn."""
    seen: set[tuple[str, str, str]] = set()
    repeated = 0
    for p in outcome.planned:
        key = (p.call.server, p.call.name, _canonical(p.call.arguments))
        repeated += p.kind == "write" and key in seen
        seen.add(key)
    return repeated


def _canonical(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, sort_keys=True, default=str)


def _fact(planned: list[PlannedCall], results: list[ToolResult]) -> tuple[str, Any] | None:
    """What a read-only turn must report (its last read's telling value); None for a turn with a write."""
    if any(p.kind == "write" for p in planned) or not planned:
        return None
    return answer_fact(results[-1].result, planned[-1].call.arguments)


def _prune_empty_reads(outcome: PiStarOutcome) -> PiStarOutcome:
    """Reads that found nothing and that nothing later uses are taken out (a read changes no state, so
    every state stays right): a user hears "there are none" without a call after it depending on it,
    and no turn is left asking for nothing. Bindings are renumbered; emptied turns go."""
    used = {b.call for p in outcome.planned for b in p.bindings if b.source in ("output", "repeated")}
    keep = [
        i
        for i, (p, r) in enumerate(zip(outcome.planned, outcome.results, strict=True))
        if not (p.kind == "read" and r.ok and r.result in ([], {}, None, "") and i not in used)
    ]
    if len(keep) == len(outcome.planned):
        return outcome
    new_index = {old: new for new, old in enumerate(keep)}
    planned = []
    for i in keep:
        p = outcome.planned[i]
        bindings = [
            b.model_copy(update={"call": new_index.get(b.call)}) if b.call is not None else b for b in p.bindings
        ]
        call = p.call.model_copy(update={"id": f"call_{new_index[i]}"})
        planned.append(p.model_copy(update={"bindings": bindings, "call": call}))
    results = [outcome.results[i].model_copy(update={"call_id": f"call_{new_index[i]}"}) for i in keep]
    spans: list[tuple[int, int]] = []
    finals: list[States] = []
    for (a, b), final in zip(outcome.spans, outcome.turn_final, strict=True):
        kept = [new_index[i] for i in range(a, b) if i in new_index]
        if kept:
            spans.append((kept[0], kept[-1] + 1))
            finals.append(final)
        elif finals:
            finals[-1] = final  # (reads only: the same state as before)
    return outcome.model_copy(update={"planned": planned, "results": results, "spans": spans, "turn_final": finals})


def _verifiable_turns(outcome: PiStarOutcome) -> tuple[list[tuple[int, int]], list[States]]:
    """The solver's turns, a read-only turn with nothing to report merged into the next one (its reads
    become that turn's lookups); a trailing one is dropped with its calls' states unchanged."""
    spans: list[tuple[int, int]] = []
    finals: list[States] = []
    start = None
    for (a, b), final in zip(outcome.spans, outcome.turn_final, strict=True):
        a = a if start is None else start
        if _fact(outcome.planned[a:b], outcome.results[a:b]) is None and not any(
            p.kind == "write" for p in outcome.planned[a:b]
        ):
            start = a
            continue
        spans.append((a, b))
        finals.append(final)
        start = None
    return spans, finals


def _turn_admissible(
    pool: EnvPool,
    planned: list[PlannedCall],
    before: States,
    after: States,
    answer: str,
    fact: tuple[str, Any] | None,
    templates: StateTemplates,
) -> tuple[bool, str | None]:
    """One turn as a task: its goal state (or, read-only, the fact its answer must state) must not hold
    before it, and must hold after replaying its calls from the state before it (forked from `templates`
    where it is the initial state)."""
    servers = list(dict.fromkeys(p.call.server for p in planned))
    assertions = (
        [Assertion(kind="answer_contains", value=fact[1], max_chars=answer_budget(answer))] if fact is not None else []
    )
    if fact is None:
        verifier = StateVerifier(goal={n: after[n] for n in servers})
    else:
        verifier = StateVerifier(goal={}, assertions=assertions)
    executed = replay(pool, [p.call for p in planned], before, templates=templates)
    if fact is not None:  # a read changes nothing: v(before) is 0 because no answer was given yet
        return (
            (True, None)
            if executed.failures == 0 and verify(verifier, before, executed.final, answer).ok
            else (
                False,
                "unsolved: the answer does not state what the turn asked",
            )
        )
    return admissible(verifier, {n: before[n] for n in servers}, {n: executed.final[n] for n in servers}, answer)


def synthesize_offline(
    pool: EnvPool,
    chain: ToolChain,
    *,
    key: str,
    seed: int,
    state_variant: int = 0,
    depth: int = 1,
    prompts_dir: Path,
    solver: PiStarSettings | None = None,
    more: list[ToolChain] | None = None,
    turns: tuple[int, int] = (3, 5),
    ambiguity: float = 0.0,
) -> UnitOutcome:
    """One unit of a batch: a kept conversation or a drop with its reason.

    With `more` (the batch's offline mode), the chain is cut into goal turns and other chains join it
    while the joined chain still solves, until the conversation has a number of turns drawn from
    `turns` (`compose.join`); without, the chain is used with its own turns. `ambiguity`: the chance that
    a request leaves out the detail telling look-alike candidates apart, so the assistant asks."""

    servers = list(dict.fromkeys([*chain.servers, *(s for c in more or [] for s in c.servers)]))
    try:
        initial, core = initial_states(pool, servers, seed, depth)
    except _NotNative as e:
        return _drop(key, chain, seed, "not_native", str(e))
    except EnvFactoryError as e:
        return _drop(key, chain, seed, "state_generation", str(e))
    unit = _Unit(key, seed, state_variant, depth, prompts_dir, solver, more, turns, ambiguity)
    templates = templates_of(pool, initial)
    made = _synthesize(pool, chain, initial, core, unit, templates)
    broken = sorted(name for name, t in templates.items() if not t.intact())
    if broken:  # a tool changed a record in place: every session forked from the template saw it
        log.warning(
            "offline synthesis: a tool of %s changed a record in place (not through the state's "
            "create/update/delete/set): unit %s is made again with sessions forked from JSON",
            ", ".join(broken),
            key,
        )
        made = _synthesize(pool, chain, initial, core, unit, {})
    return made


class _Unit(NamedTuple):
    """What `synthesize_offline` was asked besides the chain and its states."""

    key: str
    seed: int
    state_variant: int
    depth: int
    prompts_dir: Path
    solver: PiStarSettings | None
    more: list[ToolChain] | None
    turns: tuple[int, int]
    ambiguity: float


def _drop(key: str, chain: ToolChain, seed: int, code: DropCode, reason: str) -> UnitOutcome:
    return UnitOutcome(key=key, dropped=Dropped(key=key, code=code, reason=reason, tools=chain.tools, seed=seed))


def _synthesize(
    pool: EnvPool, chain: ToolChain, initial: States, core: CoreIds, unit: _Unit, templates: StateTemplates
) -> UnitOutcome:
    """`synthesize_offline` from the unit's initial states, with sessions forked from `templates` where they
    were validated from those very states."""
    key, seed, state_variant, depth, prompts_dir, solver, more, turns, ambiguity = unit

    def drop(code: DropCode, reason: str) -> UnitOutcome:
        return _drop(key, chain, seed, code, reason)

    solve = partial(solve_chain, pool, initial=initial, core=core, seed=seed, settings=solver, templates=templates)
    if more is not None:
        chain, outcome = _grow(pool, chain, more, turns, seed, solve)
        initial = {name: initial[name] for name in chain.servers}
    else:
        outcome = solve(chain)
    if not outcome.ok:
        return drop(outcome.code or "unsolvable", outcome.failure or "the privileged solver failed")
    metadata = {name: pool.get(name).metadata for name in chain.servers}
    outcome = _prune_empty_reads(outcome)
    if not outcome.planned:
        return drop("unverifiable", "every call was a read that found nothing")
    spans, turn_final = _verifiable_turns(outcome)
    if not spans:
        return drop("unverifiable", "a chain of reads whose last result has nothing to report back")
    original = TemplateWriter(load_template(prompts_dir), metadata, random.Random(seed))
    rules = {name: spec_tools(pool.get(name)) for name in chain.servers}
    writer = ConversationWriter(
        prompts_dir,
        metadata,
        random.Random(stable_seed(seed, "words")),
        ambiguity,
        {k: v for k, v in rules.items() if v},
    )
    nodes: list[Node] = []
    answers: list[str] = []
    before = initial
    for i, (start, end) in enumerate(spans):
        planned, results = outcome.planned[start:end], outcome.results[start:end]
        after = turn_final[i]
        turn = Turn(calls=planned, results=results, start=start, before=before)
        fact = _fact(planned, results)
        query = writer.request(turn)
        answer = writer.answer(turn, after, fact)
        answers.append(answer)
        # every turn is a verified task of its own: v(Db before) = 0 and v(Exec(π*, Db before)) = 1
        kept, why = _turn_admissible(pool, planned, before, after, answer, fact, templates)
        if not kept:
            code: DropCode = "goal_already_holds" if (why or "").startswith("goal_already_holds") else "unsolved"
            return drop(code, f"turn {i + 1}: {why}")
        steps = [Step(role="user", content=query)]
        asked = writer.clarification
        for k, (p, r) in enumerate(zip(planned, results, strict=True)):
            steps += [Step(role="tool_call", content=[p.call]), Step(role="tool_result", content=[r])]
            if asked is not None and k == asked[0]:  # which of the candidates: asked, and answered
                steps += [Step(role="assistant", content=asked[1]), Step(role="user", content=asked[2])]
        steps.append(Step(role="assistant", content=answer))
        nodes.append(
            Node(
                index=i,
                query=query,
                user_intent=original.intent(planned),
                steps=steps,
                mcp_servers=list(dict.fromkeys(p.call.server for p in planned)),
                initial_scenario=before,
                final_scenario=after,
                raw_tool_call=[p.call for p in planned],
                generator="template",
                refined=True,
                original_query=original.query(planned),
            )
        )
        before = after
    assertions: list[Assertion] = []
    last_fact = _fact(outcome.planned[spans[-1][0] : spans[-1][1]], outcome.results[spans[-1][0] : spans[-1][1]])
    if not any(p.kind == "write" for p in outcome.planned):
        if last_fact is None:
            return drop("unverifiable", "a chain of reads whose last result has nothing to report back")
        assertions.append(Assertion(kind="answer_contains", value=last_fact[1], max_chars=answer_budget(answers[-1])))
    verifier = StateVerifier(goal={n: outcome.final[n] for n in chain.servers}, assertions=assertions)
    executed = replay(pool, [p.call for p in outcome.planned], initial, templates=templates)  # Exec(π*, Db⁰)
    kept, why = admissible(verifier, initial, executed.final, answers[-1])
    if not kept:
        code = "goal_already_holds" if (why or "").startswith("goal_already_holds") else "unsolved"
        return drop(code, why or "")
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
