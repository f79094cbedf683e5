"""TRL post-training on EnvFactory data: `sft.py` (assistant-only SFT), `grpo.py` (GRPO with multi-turn tool
rollouts in isolated environment sessions and the composite reward). See training/README.md."""
