"""The scripted chat model (`envfactory.llm.scripted`): replay in order or per prompt name, tool calls, script
files and their errors, one replay position per file, thread safety."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool

from envfactory.llm.errors import LLMConfigError
from envfactory.llm.models import chat_model
from envfactory.llm.prompts import PromptLibrary
from envfactory.llm.scripted import ScriptedChatModel, ScriptExhaustedError, reset_scripted_models
from tests.support.llm import named, settings_with


def test_scripted_in_order_then_exhausted() -> None:
    model = ScriptedChatModel(script=["one", "two"])
    assert model.invoke("a").content == "one"
    assert model.invoke([HumanMessage("b")]).content == "two"
    assert model.remaining() == {"*": 0}
    with pytest.raises(ScriptExhaustedError) as e:
        model.invoke("c")
    msg = str(e.value)
    assert "inline script" in msg and "2 scripted responses" in msg and "call 3" in msg
    assert [c.index for c in model.calls] == [0, 1]


def test_scripted_keyed_by_prompt_name(tmp_path: Path) -> None:
    folder = tmp_path / "prompts"
    for name in ("ask", "other"):
        (folder / "demo").mkdir(parents=True, exist_ok=True)
        (folder / "demo" / f"{name}.yaml").write_text(
            f"description: d\nvariables: [q]\nmessages:\n  - role: system\n    content: {name}\n"
            "  - role: user\n    content: '{q}'\n"
        )
    lib = PromptLibrary(folder)
    model = ScriptedChatModel(script={"demo/ask": ["ask-1", "ask-2"], "demo/other": ["other-1"], "*": ["any-1"]})
    assert model.invoke(lib.get("demo/ask").render(q="x")).content == "ask-1"
    assert model.invoke(lib.get("demo/other").render(q="x")).content == "other-1"
    assert model.invoke(lib.get("demo/ask").render(q="y")).content == "ask-2"
    assert model.invoke("no prompt name").content == "any-1"  # "*" serves unnamed calls
    assert [c.prompt for c in model.calls] == ["demo/ask", "demo/other", "demo/ask", None]
    with pytest.raises(ScriptExhaustedError, match=r"prompt 'demo/ask' has 2 scripted responses and call 3"):
        model.invoke(lib.get("demo/ask").render(q="z"))

    strict = ScriptedChatModel(script={"demo/ask": ["x"]})
    with pytest.raises(ScriptExhaustedError, match=r"no responses scripted for prompt 'demo/other'.*demo/ask"):
        strict.invoke(named("demo/other"))


def test_scripted_tool_calls_from_yaml_file(tmp_path: Path) -> None:
    script = tmp_path / "solver.yaml"
    script.write_text(
        """
solver/step:
  - content: Let me look that up.
    tool_calls:
      - {name: find_hotel, args: {city: Lisbon}, id: call_a}
      - {name: find_hotel, args: {city: Porto}}
  - The cheapest is in Porto.
"""
    )
    model = chat_model("solver", settings_with(tmp_path, provider="scripted", script=script))

    @tool
    def find_hotel(city: str) -> str:
        """Find hotels in a city."""
        return city

    bound = model.bind_tools([find_hotel])
    first = bound.invoke(named("solver/step"))
    assert isinstance(first, AIMessage)
    assert first.content == "Let me look that up."
    assert [(c["name"], c["args"], c["id"]) for c in first.tool_calls] == [
        ("find_hotel", {"city": "Lisbon"}, "call_a"),
        ("find_hotel", {"city": "Porto"}, "call_0_1"),  # generated ids are deterministic
    ]
    second = bound.invoke([*named("solver/step"), first])
    assert second.content == "The cheapest is in Porto." and second.tool_calls == []
    assert isinstance(model, ScriptedChatModel)
    assert model.bound_tools == ["find_hotel"]
    assert [c.tools for c in model.calls] == [["find_hotel"], ["find_hotel"]]


def test_script_file_json_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(["a", {"content": "b"}]))
    model = ScriptedChatModel.from_file(path)
    assert [model.invoke("x").content for _ in range(2)] == ["a", "b"]

    bad = tmp_path / "bad.yaml"
    bad.write_text("- content: x\n  tool_calls: [{args: {}}]\n")
    with pytest.raises(LLMConfigError, match=r"script file .*bad\.yaml: .*tool_calls"):
        chat_model("code", settings_with(tmp_path, provider="scripted", script=bad))
    with pytest.raises(LLMConfigError, match=r"script file .*nope\.yaml does not exist"):
        chat_model("code", settings_with(tmp_path, provider="scripted", script=tmp_path / "nope.yaml"))
    with pytest.raises(LLMConfigError, match=r"ENVFACTORY_LLM__SCRIPT"):
        chat_model("code", settings_with(tmp_path, provider="scripted"))


def test_models_from_one_script_file_share_its_position(tmp_path: Path) -> None:
    script = tmp_path / "s.yaml"
    script.write_text("- r1\n- r2\n- r3\n")
    settings = settings_with(tmp_path, provider="scripted", script=Path("s.yaml"))  # relative to the root
    assert chat_model("code", settings).invoke("x").content == "r1"
    assert chat_model("test", settings).invoke("x").content == "r2"  # a new model walks on, not back
    reset_scripted_models()
    assert chat_model("code", settings).invoke("x").content == "r1"


def test_scripted_is_thread_safe() -> None:
    n_threads, per_thread = 8, 25
    model = ScriptedChatModel(script=[f"r{i}" for i in range(n_threads * per_thread)])
    seen: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(per_thread):
            content = str(model.invoke("x").content)
            with lock:
                seen.append(content)

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == sorted(f"r{i}" for i in range(n_threads * per_thread))  # each exactly once
    assert model.remaining() == {"*": 0}
