"""The `local` provider's conversion of llama.cpp's completions (`envfactory.llm.llamacpp`); the real GGUF run is
in tests/llm/test_local.py (external)."""

from __future__ import annotations

from langchain_core.messages import AIMessage

from envfactory.llm.llamacpp import _chat_result


def test_llama_cpp_response_conversion() -> None:
    """What `Llama.create_chat_completion` returns becomes a LangChain message with tools and usage."""
    result = _chat_result(
        {
            "model": "m.gguf",
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{bad"}},
                        ],
                    }
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    )
    message = result.generations[0].message
    assert isinstance(message, AIMessage)
    assert message.content == ""
    assert [(c["name"], c["args"], c["id"]) for c in message.tool_calls] == [("f", {"a": 1}, "c1")]
    assert [c["name"] for c in message.invalid_tool_calls] == ["g"]
    assert message.usage_metadata == {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}
