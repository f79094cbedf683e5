"""Evaluation: models as agents on verified tasks and on BFCL, and the numbers a comparison needs.

- `metrics`: pass@k (at least one of k attempts succeeds) and pass^k (all k do, τ²-bench's reliability
  metric), both unbiased estimates from n ≥ k attempts per task, and their means over tasks.

BFCL's own multi-turn criterion, on our environments, is `envfactory.suites.bfcl.judge`.
"""
