"""The EnvGen graph end to end with the scripted model: real sandbox, real checkpoints on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envfactory.config import get_settings
from envfactory.env.pool import EnvPool
from graphs.envgen import EnvGenContext
from tests.support.envgen import (
    METADATA,
    SCENARIOS,
    code,
    fenced,
    metadata_request,
    run_graph,
    scripted_calls,
    setup_project,
)
from tests.support.paths import ROOT, TEST_DATA

FULL_LOOP = ["search", "code", "test", "revise", "test", "register"]


def _registry(root: Path) -> dict[str, object]:
    return json.loads((root / "configs" / "mcp_server.json").read_text())["mcpServers"]


def test_success_on_first_try(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = setup_project(
        tmp_path, monkeypatch, {"code/generate": [fenced(code("good"))], "test/scenarios": [SCENARIOS]}
    )
    values, ran = run_graph(metadata_request())
    assert values["status"] == "registered", values.get("failure")
    assert ran == ["search", "code", "test", "register"]
    assert values["report"]["scenarios_passed"] == values["report"]["scenarios_run"] > 3
    folder = root / "envs" / "notebook"
    assert (folder / "env.py").read_text() == code("good")
    assert {p.stem for p in (folder / "scenarios").glob("*.json")} >= {"default"}
    assert "notebook" in _registry(root)
    # the registered environment is a real pool member: it loads and runs
    session = EnvPool(get_settings()).get("notebook").session("default")
    assert session.call("create_note", {"title": "Hi", "body": "there"}).ok


def test_planted_bug_is_reported_revised_and_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup_project(
        tmp_path,
        monkeypatch,
        {"code/generate": [fenced(code("bug"))], "test/scenarios": [SCENARIOS], "code/revise": [fenced(code("good"))]},
    )
    values, ran = run_graph(metadata_request())
    assert ran == FULL_LOOP
    first, second = values["reports"]
    critical = [e for e in first["errors"] if e["severity"] == "critical"]
    assert critical and {e["dimension"] for e in critical} == {"interface"}
    assert any("delete_note" in (e["tool"] or "") + e["message"] for e in critical)
    assert not [e for e in second["errors"] if e["severity"] in ("critical", "high")]
    assert values["status"] == "registered" and values["revision"] == 1
    # the revise prompt carried the executed report, and the code it fixed
    (revise_prompt,) = scripted_calls("code/revise")
    assert "delete_note" in revise_prompt and "remove_note" in revise_prompt


def test_budget_spent_rejects_and_keeps_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = setup_project(
        tmp_path,
        monkeypatch,
        {
            "code/generate": [fenced(code("nodelete"))],
            "test/scenarios": [SCENARIOS],
            "code/revise": [fenced(code("nodelete"))],
        },
    )
    values, ran = run_graph(metadata_request(), EnvGenContext(revision_budget=1))
    assert ran == ["search", "code", "test", "revise", "test", "reject"]
    assert values["status"] == "rejected"
    kept = Path(values["output"])
    assert kept == root / ".envfactory" / "rejected" / "notebook"
    assert len(json.loads((kept / "envgen.json").read_text())["reports"]) == 2
    assert (kept / "env.py").read_text() == code("nodelete")
    assert not (root / "envs" / "notebook").exists()
    assert "notebook" not in _registry(root) if (root / "configs" / "mcp_server.json").exists() else True
    # the never-deleting code was caught by executed checks, not by the model's word
    errors = values["reports"][-1]["errors"]
    assert any(e["tool"] == "delete_note" or "delete" in e["message"] for e in errors)


def test_malformed_json_is_repaired_on_retry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup_project(
        tmp_path,
        monkeypatch,
        {
            "code/generate": [fenced(code("good"))],
            "test/scenarios": ['{"scenarios": [{"name": "broken", "steps": [', SCENARIOS],
        },
    )
    values, _ = run_graph(metadata_request())
    assert values["status"] == "registered"
    first, retry = scripted_calls("test/scenarios")
    assert "broken" not in first and '{"scenarios": [{"name": "broken"' in retry  # the bad answer went back
    assert retry.count("JSON") > first.count("JSON")  # with the repair instructions


def test_structured_failure_is_recorded_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup_project(
        tmp_path, monkeypatch, {"code/generate": [fenced(code("good"))], "test/scenarios": ["no", "nope", "never"]}
    )
    values, ran = run_graph(metadata_request())
    assert ran == ["search", "code", "test"]
    assert values["status"] == "failed" and values["failure"].startswith("test: scenarios:")


def test_untrusted_code_is_rejected_or_killed_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_project(
        tmp_path,
        monkeypatch,
        {
            "code/generate": [fenced(code("subprocess"))],
            "test/scenarios": [SCENARIOS],
            "code/revise": [fenced(code("loop")), fenced(code("alloc")), fenced(code("good"))],
        },
    )
    values, ran = run_graph(metadata_request())
    assert ran == ["search", "code", "test", "revise", "test", "revise", "test", "revise", "test", "register"]
    static, loop, alloc, good = values["reports"]
    assert static["sandbox_status"] == "static_rejected"
    assert any("subprocess" in e["message"] and e["severity"] == "critical" for e in static["errors"])
    assert loop["sandbox_status"] == "timeout"
    assert alloc["sandbox_status"] in ("memory", "crashed")
    assert good["sandbox_status"] == "ok" and values["status"] == "registered"


def test_prompt_swapped_by_config_changes_what_the_model_receives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_project(tmp_path, monkeypatch, {"code/generate": [fenced(code("good"))], "test/scenarios": [SCENARIOS]})
    swapped = "You are a SWAPPED-IN code agent. Write env.py as one python block."
    values, _ = run_graph(metadata_request(), EnvGenContext(prompt_overrides={"code/generate": swapped}))
    assert values["status"] == "registered"
    (received,) = scripted_calls("code/generate")
    assert "SWAPPED-IN code agent" in received
    assert "You are the Code Agent of EnvFactory" not in received


def test_openapi_start_converts_without_an_llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    setup_project(tmp_path, monkeypatch, {})
    spec = next((ROOT / "sources").glob("*pharmacy*"))
    request = {"openapi_path": str(spec), "domain": "lifestyle", "name": "pharmacy"}
    values, ran = run_graph(request, interrupt_before=["code"])
    assert ran == ["search"]
    meta = values["metadata"]
    assert meta["name"] == "pharmacy" and meta["domain"] == "lifestyle"
    assert {t["kind"] for t in meta["tools"]} == {"read", "write"}
    assert values["search"]["mode"] == "openapi"


def test_search_rejects_a_near_duplicate_and_grounds_the_next_proposal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    hotels = json.loads((ROOT / "envs" / "hotels" / "metadata.json").read_text())
    duplicate = {
        "name": "hotel_rooms",
        "domain": "office",
        "description": hotels["description"],
        "tools": [{"name": t["name"], "kind": t["kind"], "purpose": t["description"]} for t in hotels["tools"]],
    }
    notebook = json.loads((TEST_DATA / "envgen" / "notebook_metadata.json").read_text())
    fresh = {
        "name": "notebook",
        "domain": "office",
        "description": notebook["description"],
        "entities": ["note", "tag"],
        "tools": [{"name": t["name"], "kind": t["kind"], "purpose": t["description"]} for t in notebook["tools"]],
    }
    root = setup_project(
        tmp_path,
        monkeypatch,
        {
            "search/propose": [json.dumps(duplicate), json.dumps(fresh)],
            "search/metadata": [json.dumps(notebook)],
            "code/generate": [fenced(code("good"))],
            "test/scenarios": [SCENARIOS],
        },
    )
    shutil.copytree(ROOT / "sources", root / "sources")
    values, ran = run_graph({"domain": "office", "hint": "something for personal notes"})
    assert ran == ["search", "code", "test", "register"], values.get("failure")
    novelty = values["search"]["novelty"]
    assert [n["duplicate"] for n in novelty] == [True, False]
    assert novelty[0]["nearest"] == "hotels" and novelty[0]["similarity"] >= novelty[0]["threshold"]
    assert novelty[1]["similarity"] < novelty[1]["threshold"]
    assert values["search"]["sources"] and all(s.startswith(str(root / "sources")) for s in values["search"]["sources"])
    assert values["metadata"]["source"] == "envgen"
    _, second = scripted_calls("search/propose")
    assert "hotel_rooms" in second  # the rejected proposal and its similarity went back to the model


def test_a_request_key_it_does_not_know_is_refused_before_the_model_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`metadata_path_` (a typo in Studio's input form) was dropped and the run searched the pool's gaps instead,
    calling the model."""
    from pydantic import ValidationError

    setup_project(tmp_path, monkeypatch, {})  # no scripted answers: asking the model would fail differently
    with pytest.raises(ValidationError, match="metadata_path_"):
        run_graph({"metadata_path_": str(METADATA)})
    assert scripted_calls("search/propose") == []
