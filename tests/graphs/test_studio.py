"""`langgraph dev` serves the EnvGen graph (as LangGraph Studio uses it), driven through the SDK client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.envgen import METADATA, SCENARIOS, code, fenced, setup_project
from tests.support.studio import langgraph_dev


@pytest.fixture()
def dev_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    setup_project(
        tmp_path,
        monkeypatch,
        {"code/generate": [fenced(code("bug"))], "test/scenarios": [SCENARIOS], "code/revise": [fenced(code("good"))]},
    )
    with langgraph_dev(tmp_path, "envgen") as url:
        yield url


async def test_sdk_run_interrupt_read_state_resume(dev_server: str) -> None:
    from langgraph_sdk import get_client

    client = get_client(url=dev_server)
    thread = await client.threads.create()
    request = {"request": {"metadata_path": str(METADATA)}}
    await client.runs.wait(thread["thread_id"], "envgen", input=request, interrupt_before=["revise"])

    state = await client.threads.get_state(thread["thread_id"])
    assert state["next"] == ["revise"]
    report = state["values"]["report"]
    assert any(e["severity"] == "critical" for e in report["errors"])  # the planted bug, seen before revising

    final = await client.runs.wait(thread["thread_id"], "envgen", input=None)
    assert isinstance(final, dict) and final["status"] == "registered"
    state = await client.threads.get_state(thread["thread_id"])
    assert state["next"] == [] and state["values"]["revision"] == 1
    history = await client.threads.get_history(thread["thread_id"], limit=50)
    assert len(history) >= 7  # input, search, code, test, revise, test, register


@pytest.mark.parametrize("name", ["envgen", "querygen"])
def test_every_graph_of_langgraph_json_gives_studio_its_schemas(name: str) -> None:
    """Studio builds its input form from the graph's input schema: on Python 3.11 a `typing.TypedDict` state made
    pydantic refuse it (EnvGen's), and Studio showed no form."""
    import importlib.util
    import json

    from tests.support.paths import ROOT

    graphs = json.loads((ROOT / "langgraph.json").read_text())["graphs"]
    assert set(graphs) == {"envgen", "querygen"}
    path, attr = graphs[name].split(":")
    spec = importlib.util.spec_from_file_location(f"studio_{name}", ROOT / path)  # by file, as `langgraph dev` loads it
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    graph = getattr(module, attr)
    assert graph.get_input_jsonschema()["properties"] and graph.get_output_jsonschema()["properties"]


def test_studio_shows_a_failed_runs_own_message() -> None:
    """LangGraph's server answers a failed run with `{"error": class, "message": ...}` through this encoder, which
    hid the message of every class but the builtin errors ("An internal error occurred"): Studio showed a
    QueryGen run with an unknown preset failing without saying why. Every envfactory error is a RuntimeError."""
    import inspect

    from langgraph_api.serde import default

    import envfactory.errors as errors
    from envfactory.querygen.records import QueryGenError

    message = "unknown QueryGen preset 'NOPE' (known: SFT_NON_CONV, SFT_CONV, RL_NON_CONV)"
    assert default(QueryGenError(message)) == {"error": "QueryGenError", "message": message}
    for name, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, errors.EnvFactoryError):
            error = cls.__new__(cls)  # (some take more than a message)
            Exception.__init__(error, "why")
            assert default(error) == {"error": name, "message": "why"}, name
