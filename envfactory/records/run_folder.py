"""A synth run folder's file names, in one place: the batch writes them, export, eval, the hub and resume read them.

Nothing here imports anything: every layer that reads a run folder can name its files without importing the
batch runner (`envfactory.tasks.plan`).
"""

from __future__ import annotations

CONVERSATIONS = "conversations.jsonl"  # the training split: what export reads
HELDOUT = "heldout.jsonl"  # the held-out split: for evaluation only, never exported
DROPPED = "dropped.jsonl"  # one line per dropped unit: its code and reason
SUMMARY = "summary.json"  # the run's counts and settings (and which units are held out)
