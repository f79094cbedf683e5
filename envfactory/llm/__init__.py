"""Talking to models: chat models per role, prompts, structured answers, thinking, embeddings.

- `models`: `chat_model(role)` (`openai`, `local` llama.cpp, `scripted`) and token accounting;
- `prompts`: the prompt library (`prompts/<group>/<name>.yaml`), checked when loaded;
- `structured`: the one ask-parse-check-repair loop (`ask`, `aask`, `Expect`, `Structured`);
- `thinking`: the one `<think>` rule (`split_thinking`, `strip_thinking`);
- `embeddings`: sentence embeddings, offline, with a persistent cache.
"""
