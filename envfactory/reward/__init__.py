"""The composite reward R = α·R_traj + (1−α)·R_state − γ·P_length (EnvFactory §3.5), and the TRL reward function.

One RL record (the reference's format) gives, per turn: `reward_model.ground_truth` — the turn's
tool calls (`name`, `arguments`, `masked_arguments`; `server` or a qualified name optional) — and
`extra_info.mcp_factory_kwargs` — `mcp_servers`, `initial_config`, `final_config` (JSON strings or
parsed objects; both are accepted). A completion is scored against it:

**Parsing** (`envfactory.reward.tool_calls`): the completion's calls in any common format. A completion
that is not text/messages at all, or that tried to call tools but none could be read, scores
**0.0** with the reason in `RewardResult.reasons`; nothing here raises for model output.

**R_traj ∈ [0, 1]** — a graded, order-tolerant masked match:
- a predicted call *matches* a ground-truth call when the tool is the same (server and name) and
  every argument not in the ground-truth call's `masked_arguments` is equal. Both sides are first
  normalized by the tool's own argument validator (so defaults are filled in and an omitted
  optional argument equals its default; dates compare as dates); a predicted call whose arguments
  the tool rejects matches nothing, and a call the environment refuses when run (a replayed write, or a
  read matched only leniently, run to find out) matches only a ground-truth call it repeats exactly (the
  leniency below is for calls the tool accepts). Values: numbers
  with `math.isclose` (rel 1e-6), booleans are
  not numbers, strings after stripping and case-folding (settable: `case_sensitive`), lists in
  order, objects key by key;
- order: ground-truth calls form a partial order — call i must stay before call j (i < j) when they
  *conflict*: same server and at least one of them is a `write` tool (an unknown tool counts as a
  write). Two reads of one server, and calls on different servers, may be reordered freely; a read and a
  write of one server keep their order (a search moved after the booking it found reads another state), as
  two writes on one server do (conservatively: a commuting swap of two creates loses trajectory credit but
  keeps full state credit, generated ids being masked);
- M = the largest set of one-to-one (ground truth, prediction) matches such that no conflicting
  pair appears in the opposite order (exact search over matched-set bitmasks, pred by pred; beam
  `max_match_states`, exact for the short lists of a turn);
- **R_traj = 2M / (|gt| + |pred|)** (the F1 of call precision M/|pred| and recall M/|gt|), and 1
  when both are empty. F1 rather than M / max(|gt|, |pred|): a missing and an extra call both cost
  credit, but the extra one is also charged by P_length, so the trajectory term need not be the
  harsher of the two; and F1 is the usual tool-call metric.

**R_state ∈ [0, 1]**: the predicted calls are replayed in fresh isolated sessions (an `Episode`,
what `envfactory.records.episode.replay` runs) forked from `initial_config` (a server missing there
starts from its default scenario), only for the servers the calls write to; read calls are not
replayed — a read tool cannot change a state (sessions enforce it) — unless `replay_reads`. A call
to a server outside `mcp_servers` or to an unknown tool is a failed call, never an exception. Each
server's final state is compared with `final_config` by the verifier's masked equivalence
(`canonical`: generated ids and counters masked; `mask.paths` globs masked); a server missing from
`final_config` is not scored (noted). With `mask_masked_values` (default), state fields whose
ground-truth value is a masked argument's value (the free-text `description` a masked argument
wrote) are masked too, so a different wording costs nothing in either term — but no wording is no
match: a masked argument the ground truth fills must be filled (not left out, "" or blank). R_state is the
fraction of *relevant* servers whose state is equivalent (`state_scope="changed"`, default): a
server is relevant when the ground truth or the prediction changed it — untouched servers give no
free credit. On a read-only turn with a read-only prediction (no relevant server) the state cannot
tell doing the reads from doing nothing, so R_state = R_traj there. `state_scope="all"` is the
published code's rule: the fraction of all `mcp_servers` whose state equals the ground truth's.

**Penalties**: P_length = max(0, |pred| − |gt|), charged γ = 0.05 per extra call, capped at 0.5;
format: 0.05 per unparseable call attempt, capped at 0.5 (as the published code). All settable in
`RewardSettings`. **The reward is clipped at ≥ 0** (as the published code), so R ∈ [0, 1].

α = 0.5 by default (the paper's best); `alpha_schedule` gives the published linear 0.9 → 0.1 over
training steps (TRL's `trainer_state.global_step` / `max_steps`).

With the defaults, on a search → book → cancel turn: ground truth 1.0 > the ground truth plus a
redundant read (≈ 0.88) > one wrong argument (≈ 0.33) > an empty completion (0.0).

Speed (`benchmarks/reward.py`): everything a record determines (parsed ground truth, normalized arguments,
the partial order, validated and canonical initial / goal states) is built once and cached (LRU, keyed by
the record's fields); an initial state once per (server, initial_config), which a dataset's records share; a
predicted call's ground-truth matches once per record and call. Only write calls are replayed, memoized by
those calls alone (`memoize_replays`: tools are deterministic), so the G completions of a GRPO group that
differ only in their reads, where their reads stand, or their format share one replay. With the same memo
switch, a `<tool_call>` block's text read cleanly once gives its calls again without being decoded, and a
completion's whole sequence of calls gives its state and trajectory terms again (`CallsOutcome`), so
completions that differ only in their text around the calls or in the names' form (qualified or not) share
them. A replay that misses continues the record's last one (`LiveReplay`: its native sessions rolled back
through the state's change log to the calls both share) instead of forking and replaying those calls again,
and a native session's final state is compared with the goal through the records its calls touched
(`touched_equal`); only a state that differs is dumped whole and put in canonical form (`fast_canonical`,
equal to the verifier's, keeping unchanged records as they are). The shortcuts rest on the environment
contract (every write through the state's CRUD helpers); `tests/reward/test_fast_path.py` checks whole
results bit for bit against the straightforward computation over random completions.

Modules, one concept each:

- `settings`: `RewardSettings` (with `LinearSchedule`, the α schedule), `RewardResult`, `RecordError`;
- `matching`: R_traj's matching — `same_value` (argument equality) and `best_match` (the largest
  order-respecting one-to-one matching);
- `state_masking`: where masked argument values landed in a state (`masked_value_blanks`,
  `apply_blanks`) and `fast_canonical`, the verifier's canonical form without walking unchanged records;
- `state_term`: R_state's shortcuts — a replay's memoized outcome (`Replayed`), what a completion's calls
  gave (`CallsOutcome`), a record's kept sessions (`LiveReplay`) and the comparison through what the
  calls touched (`dump_delta`, `touched_equal`);
- `record`: `Target`, an RL record parsed once, and the parsing of its fields; `first_differences`;
- `scorer`: `CompositeReward`, and the functional form `composite_reward` with its scorer cache;
- `trl`: the TRL reward function `ToolUseReward` and `record_columns` (per-sample record fields).
"""

from envfactory.reward.matching import best_match, same_value
from envfactory.reward.record import Target, first_differences
from envfactory.reward.scorer import CompositeReward, composite_reward, default_pool
from envfactory.reward.settings import LinearSchedule, RecordError, RewardResult, RewardSettings
from envfactory.reward.state_masking import Blank, apply_blanks, fast_canonical, masked_value_blanks
from envfactory.reward.trl import ToolUseReward, record_columns

__all__ = [
    "Blank",
    "CompositeReward",
    "LinearSchedule",
    "RecordError",
    "RewardResult",
    "RewardSettings",
    "Target",
    "ToolUseReward",
    "apply_blanks",
    "best_match",
    "composite_reward",
    "default_pool",
    "fast_canonical",
    "first_differences",
    "masked_value_blanks",
    "record_columns",
    "same_value",
]
