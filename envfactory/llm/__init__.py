"""Talking to models: chat models per role, prompts, structured answers, thinking, embeddings.

- `models`: the factory, `chat_model(role)` and `check_configured` (providers `openai`, `local`, `scripted`, and
  `envfactory.chat_models` entry points);
- `openai_compat` (any OpenAI-compatible endpoint), `llamacpp` (a local GGUF), `scripted` (the fake of tests and
  its script file format): the providers;
- `usage`: token accounting per role (`UsageTracker`, `process_usage`, `usage_table`);
- `messages`: a message's text, its prompt name, a reply cut at the token cap; `errors`: the layer's errors;
- `prompts`: the prompt library (`prompts/<group>/<name>.yaml`), checked when loaded;
- `structured`: the one ask-parse-check-repair loop (`ask`, `aask`, `Expect`, `Structured`);
- `thinking`: the one `<think>` rule (`split_thinking`, `strip_thinking`);
- `embeddings`: sentence embeddings, offline, with a persistent cache.
"""
