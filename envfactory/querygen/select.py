"""Select and filter: which of the k solver branches becomes the turn, and the redundancy it sheds.

Calls are "the same" by the reward's own rule (`CallMatcher`: arguments normalized by the tool's
validator, strings case-folded, numbers `isclose`, a missing optional argument equal to its default),
so a kept turn scores 1.0 against its own ground truth and no turn that would is turned away.

**select**: a branch qualifies when it ended with an answer, its final states verify against the
turn's expected state (`verify`, generated ids masked) and — for a read-only turn, whose state cannot
tell — its answer mentions what π*'s last read returned or it made that read itself. Among those, the
best match to the chain wins: most of the turn's raw calls matched (the same call, unmasked
arguments), then fewest failed calls, then fewest extra calls, then the lowest branch number.

**filter**: failed calls and exact repeats of an earlier successful read (same call, same result) are
dropped; the remaining calls are REPLAYED from the turn's initial state, and the filtered steps are
kept only if the replayed final state is equivalent to the branch's; kept results are the replayed ones.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from envfactory.env.environment import BaseEnvironment
from envfactory.env.pool import EnvPool
from envfactory.errors import EnvFactoryError
from envfactory.querygen.records import Branch, SolveTask, TurnDraft, UserCall
from envfactory.records.episode import replay
from envfactory.records.models import MaskSpec, PlannedCall, States, StateVerifier, Step, ToolCall, ToolResult
from envfactory.records.verifier import answer_states, state_differences, verify
from envfactory.reward.matching import CallMatcher

# ---- matching calls: the reward's own rule (envfactory.reward.matching.CallMatcher) ----------------


def matcher_for(pool: EnvPool | None) -> CallMatcher:
    """The one rule for "the same call", over the pool's environments (their validators normalize)."""

    def env_of(server: str) -> BaseEnvironment | None:
        if pool is None:
            return None
        try:
            return pool.get(server)
        except EnvFactoryError:
            return None

    return CallMatcher(env_of)


def match_calls(raw: list[ToolCall], made: list[ToolCall], matcher: CallMatcher) -> tuple[int, int]:
    """(raw calls matched by a made call, made calls left unmatched); each made call matches at most once."""
    used: set[int] = set()
    for r in raw:
        for i, m in enumerate(made):
            if i not in used and matcher.same_call(r, m):
                used.add(i)
                break
    return len(used), len(made) - len(used)


def turn_goal_reached(task: SolveTask, states: States, made: list[ToolCall], matcher: CallMatcher) -> bool:
    """Has a branch done what the turn asks (so a question now is not a clarification)?"""
    if task.read_only:
        return bool(task.raw_calls) and any(matcher.same_call(task.raw_calls[-1].call, m) for m in made)
    return verify(StateVerifier(goal=task.expected), task.initial, states).ok


# ---- select -----------------------------------------------------------------------------------------


class BranchReport(BaseModel):
    branch: int
    verified: bool
    reasons: list[str] = Field(default_factory=list)
    matched: int = 0
    raw: int = 0
    failed: int = 0
    extra: int = 0

    @property
    def match(self) -> float:
        return self.matched / self.raw if self.raw else 1.0


class Selection(BaseModel):
    turn: int
    selected: int | None
    reports: list[BranchReport]

    @property
    def failure(self) -> str:
        parts = [f"branch {r.branch}: {'; '.join(r.reasons) or 'not verified'}" for r in self.reports]
        return f"turn {self.turn + 1}: no branch verifies ({' | '.join(parts) or 'no branches'})"


def _made_calls(branch: Branch) -> tuple[list[ToolCall], int]:
    """(successful calls of the assistant and of the simulated user, failed assistant calls)."""
    pairs = branch.calls()
    ok = [c for c, r in pairs if r.ok] + [u.call for u in branch.user_calls if u.result.ok]
    return ok, sum(not r.ok for _, r in pairs)


def judge(
    branch: Branch, draft: TurnDraft, initial: States, raw: list[PlannedCall], matcher: CallMatcher
) -> BranchReport:
    made, failed = _made_calls(branch)
    raw_calls = [p.call for p in raw]
    matched, extra = match_calls(raw_calls, made, matcher)
    report = BranchReport(
        branch=branch.branch, verified=False, matched=matched, raw=len(raw), failed=failed, extra=extra
    )
    if branch.error:
        report.reasons.append(branch.error)
        return report
    verdict = verify(StateVerifier(goal=draft.expected), initial, branch.final)
    report.reasons.extend(verdict.reasons)
    told = draft.fact is not None and answer_states(branch.answer, draft.fact[1])
    made_last_read = bool(raw_calls) and any(matcher.same_call(raw_calls[-1], m) for m in made)
    if draft.answer_required and draft.fact is not None and not told:
        report.reasons.append(f"the answer does not report {draft.fact[0]} = {draft.fact[1]!r}")
    elif draft.read_only and raw_calls and not told and not made_last_read:
        what = f"{draft.fact[0]} = {draft.fact[1]!r}" if draft.fact else "the last read's result"
        report.reasons.append(
            f"read-only turn: the answer does not report {what} and {raw_calls[-1].name} was not called "
            "with the chain's arguments"
        )
    report.verified = not report.reasons
    return report


def select_branch(
    branches: list[Branch], draft: TurnDraft, initial: States, raw: list[PlannedCall], matcher: CallMatcher
) -> Selection:
    reports = [judge(b, draft, initial, raw, matcher) for b in sorted(branches, key=lambda b: b.branch)]
    ok = [r for r in reports if r.verified]
    best = min(ok, key=lambda r: (-r.matched, r.failed, r.extra, r.branch)) if ok else None
    return Selection(turn=draft.turn, selected=best.branch if best else None, reports=reports)


# ---- filter -----------------------------------------------------------------------------------------


class FilterReport(BaseModel):
    turn: int
    dropped_failed: int = 0
    dropped_duplicates: int = 0
    kept_filtered: bool = True
    reason: str | None = None


def _kind(pool: EnvPool, call: ToolCall) -> str | None:
    try:
        return pool.get(call.server).metadata.tool(call.name).kind
    except (EnvFactoryError, KeyError):
        return None


def filter_branch(pool: EnvPool, branch: Branch, initial: States, servers: list[str]) -> tuple[Branch, FilterReport]:
    """The branch without failed and repeated-read calls, re-executed; or the branch as it was, with why."""
    report = FilterReport(turn=branch.turn)
    matcher = matcher_for(pool)
    by_step: dict[int, list[UserCall]] = {}
    for u in branch.user_calls:
        by_step.setdefault(u.step, []).append(u)
    steps: list[Step] = []
    order: list[ToolCall | UserCall] = []  # what replay executes, in the order it happened
    reads: list[tuple[ToolCall, Any]] = []
    last_kept_from: int | None = None  # index in branch.steps of the step appended last
    pending: tuple[int, list[ToolCall]] | None = None
    for i, step in enumerate(branch.steps):
        if step.role == "tool_call":
            pending = (i, step.calls())
            continue
        if step.role == "tool_result" and pending is not None:
            call_index, calls = pending
            pending = None
            kept: list[tuple[ToolCall, ToolResult]] = []
            for call, result in zip(calls, step.results(), strict=False):
                if not result.ok:
                    report.dropped_failed += 1
                    continue
                if _kind(pool, call) == "read":
                    if any(matcher.same_call(c, call) and r == result.result for c, r in reads):  # the one rule
                        report.dropped_duplicates += 1
                        continue
                    reads.append((call, result.result))
                kept.append((call, result))
            if kept:
                steps += [
                    Step(role="tool_call", content=[c for c, _ in kept]),
                    Step(role="tool_result", content=[r for _, r in kept]),
                ]
                order += [c for c, _ in kept]
                last_kept_from = i
            elif last_kept_from == call_index - 1 and steps and steps[-1].role == "assistant":
                steps.pop()  # the words that only announced the dropped calls
                last_kept_from = None
            continue
        steps.append(step)
        last_kept_from = i
        for u in by_step.get(i, []):
            order.append(u.model_copy(update={"step": len(steps) - 1}))
    calls = [o.call if isinstance(o, UserCall) else o for o in order]
    again = replay(pool, calls, initial, servers)
    failed = [f"{c.name}: {r.result}" for c, r in zip(calls, again.results, strict=True) if not r.ok]
    diffs = state_differences(initial, branch.final, again.final, MaskSpec())
    if failed or diffs:
        why = f"replayed calls failed ({'; '.join(failed[:3])})" if failed else f"state differs: {'; '.join(diffs[:5])}"
        report.kept_filtered = False
        report.reason = f"the filtered calls do not reproduce the turn: {why}"
        return branch, report
    user_calls: list[UserCall] = []
    assistant_results: list[ToolResult] = []
    for o, r in zip(order, again.results, strict=True):
        if isinstance(o, UserCall):
            user_calls.append(o.model_copy(update={"result": r}))
        else:
            assistant_results.append(r)
    results = iter(assistant_results)
    for j, step in enumerate(steps):
        if step.role == "tool_result":
            steps[j] = Step(role="tool_result", content=[next(results) for _ in steps[j - 1].calls()])
    filtered = branch.model_copy(update={"steps": steps, "final": again.final, "user_calls": user_calls})
    return filtered, report
