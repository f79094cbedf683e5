"""Evaluation: models as agents on verified tasks and on BFCL, and the numbers a comparison needs.

- `items`: what is evaluated — verified turns (per-turn mode) or whole conversations, from a run's split;
- `toolset`, `agent`: the tool-use loop (direct tools or SynthAPI's meta-tools; native and text calls);
- `score`: an attempt's success (final state and ground-truth results) and composite reward;
- `metrics`: pass@k (at least one of k attempts succeeds) and pass^k (all k do, τ²-bench's reliability
  metric), both unbiased estimates from n ≥ k attempts per task, and their means over tasks;
- `run`: attempts appended to a resumable log, and the summary with its breakdowns;
- `bfcl`: BFCL multi-turn entries played by a model and judged by `envfactory.suites.bfcl.judge`;
- `contamination`: overlap between a run's data and BFCL multi-turn.
"""
