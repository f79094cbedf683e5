"""Tests of training/: the SFT and GRPO entry points, run for real on CPU."""
