"""Every tool of `papers`: results, error cases, state transitions."""

from __future__ import annotations

import pytest

from envfactory.env import Session
from envfactory.env.pool import EnvPool
from tests.envs.helpers import fails, ok


@pytest.fixture()
def s(pool: EnvPool) -> Session:
    # strict: every call also diffs full dumps, proving the tools write only through CRUD helpers
    return pool.get("papers").session("default", strict=True)


def _ids(items: list[dict]) -> list[str]:
    return [i["id"] for i in items]


def test_scenarios_load(pool: EnvPool) -> None:
    env = pool.get("papers")
    assert env.scenario_names() == ["default", "systems"]
    sys_ = env.session("systems", strict=True)
    assert _ids(ok(sys_, "search_papers", query="consensus")) == ["PAP-104", "PAP-105", "PAP-106"]
    assert _ids(ok(sys_, "get_citations", paper_id="PAP-106")) == ["PAP-104", "PAP-105"]


def test_search_papers(s: Session) -> None:
    # newest first, ties by id; words match title, abstract or keywords ("transformers" contains "transformer")
    assert _ids(ok(s, "search_papers", query="Transformer")) == ["PAP-006", "PAP-008", "PAP-004", "PAP-002", "PAP-001"]
    assert _ids(ok(s, "search_papers", query="transformer", year_from=2020)) == ["PAP-006", "PAP-008", "PAP-004"]
    assert _ids(ok(s, "search_papers", query="transformer", year_to=2019)) == ["PAP-002", "PAP-001"]
    assert _ids(ok(s, "search_papers", query="transformer", year_from=2021, year_to=2021)) == ["PAP-004"]
    assert _ids(ok(s, "search_papers", query="vision transformer")) == ["PAP-006", "PAP-004"]  # every word must appear
    assert _ids(ok(s, "search_papers", query="language model")) == ["PAP-008", "PAP-005", "PAP-002", "PAP-007"]
    assert _ids(ok(s, "search_papers", query="image classification")) == ["PAP-004", "PAP-003"]
    hit = ok(s, "search_papers", query="MIXTURE of experts")
    assert _ids(hit) == ["PAP-008", "PAP-007"]
    assert set(hit[0]) == {"id", "title", "year", "venue", "author_ids"}
    assert ok(s, "search_papers", query="quantum") == []
    fails(s, "search_papers", "tool_error", query="   ")
    fails(s, "search_papers", "tool_error", query="transformer", year_from=2022, year_to=2017)
    fails(s, "search_papers", "invalid_arguments", query="transformer", year_from="2020")
    fails(s, "search_papers", "invalid_arguments")


def test_get_paper(s: Session) -> None:
    p = ok(s, "get_paper", paper_id="PAP-001")
    assert p["title"] == "Attention Is All You Need" and p["author_ids"] == ["AU-01", "AU-02"]
    assert p["cited_by_count"] == 4  # PAP-002, PAP-004, PAP-005, PAP-008
    assert [n["id"] for n in p["notes"]] == ["NT-0001", "NT-0003"]
    p6 = ok(s, "get_paper", paper_id="PAP-006")
    assert p6["cited_by_count"] == 0 and p6["notes"] == [] and p6["references"] == ["PAP-002", "PAP-003", "PAP-004"]
    fails(s, "get_paper", "not_found", paper_id="PAP-999")


def test_get_citations(s: Session) -> None:
    assert _ids(ok(s, "get_citations", paper_id="PAP-001")) == ["PAP-008", "PAP-004", "PAP-005", "PAP-002"]
    assert _ids(ok(s, "get_citations", paper_id="PAP-003", direction="cited_by")) == ["PAP-006", "PAP-004"]
    assert _ids(ok(s, "get_citations", paper_id="PAP-006", direction="references")) == ["PAP-004", "PAP-002", "PAP-003"]
    assert ok(s, "get_citations", paper_id="PAP-006") == []
    assert ok(s, "get_citations", paper_id="PAP-001", direction="references") == []
    fails(s, "get_citations", "not_found", paper_id="PAP-999")
    fails(s, "get_citations", "invalid_arguments", paper_id="PAP-001", direction="cites")


def test_get_author(s: Session) -> None:
    a = ok(s, "get_author", author_id="AU-02")
    assert a == {
        "id": "AU-02",
        "name": "Noam Shazeer",
        "affiliation": "Google Brain",
        "h_index": 45,
        "paper_ids": ["PAP-008", "PAP-001", "PAP-007"],
    }
    assert ok(s, "get_author", author_id="AU-05")["paper_ids"] == ["PAP-006", "PAP-003"]
    fails(s, "get_author", "not_found", author_id="AU-99")


def test_list_reading_lists(s: Session) -> None:
    lists = ok(s, "list_reading_lists")
    assert [(rl["id"], rl["name"], rl["paper_ids"]) for rl in lists] == [
        ("RL-0001", "Thesis background", ["PAP-001", "PAP-003"]),
        ("RL-0002", "Efficient LLMs", ["PAP-007", "PAP-008"]),
    ]
    fails(s, "list_reading_lists", "invalid_arguments", owner="me")


def test_create_reading_list(s: Session) -> None:
    rec = s.call("create_reading_list", {"name": "  Vision papers "})
    assert rec.ok and rec.result == {
        "id": "RL-0003",
        "name": "Vision papers",
        "paper_ids": [],
        "created_at": "2026-03-04T14:00:00",
    }
    assert rec.diff.added == ["reading_lists.RL-0003"] and rec.diff.changed == ["counters.RL"]
    assert [c.op for c in rec.changes] == ["counter", "create"]
    assert _ids(ok(s, "list_reading_lists")) == ["RL-0001", "RL-0002", "RL-0003"]
    fails(s, "create_reading_list", "conflict", name="thesis BACKGROUND")
    fails(s, "create_reading_list", "conflict", name="vision papers")
    fails(s, "create_reading_list", "tool_error", name="  ")
    fails(s, "create_reading_list", "invalid_arguments")


def test_add_to_reading_list(s: Session) -> None:
    rec = s.call("add_to_reading_list", {"list_id": "RL-0001", "paper_id": "PAP-004"})
    assert rec.ok and rec.result["paper_ids"] == ["PAP-001", "PAP-003", "PAP-004"]
    assert rec.diff.added == ["reading_lists.RL-0001.paper_ids[2]"] and not rec.diff.changed
    fails(s, "add_to_reading_list", "conflict", list_id="RL-0001", paper_id="PAP-004")
    fails(s, "add_to_reading_list", "not_found", list_id="RL-0099", paper_id="PAP-004")
    fails(s, "add_to_reading_list", "not_found", list_id="RL-0001", paper_id="PAP-999")
    fails(s, "add_to_reading_list", "invalid_arguments", list_id="RL-0001")


def test_remove_from_reading_list(s: Session) -> None:
    rec = s.call("remove_from_reading_list", {"list_id": "RL-0001", "paper_id": "PAP-001"})
    assert rec.ok and rec.result["paper_ids"] == ["PAP-003"]
    # the list shifted: index 0 now holds PAP-003, index 1 is gone
    assert rec.diff.changed == ["reading_lists.RL-0001.paper_ids[0]"]
    assert rec.diff.removed == ["reading_lists.RL-0001.paper_ids[1]"]
    fails(s, "remove_from_reading_list", "conflict", list_id="RL-0001", paper_id="PAP-001")
    fails(s, "remove_from_reading_list", "conflict", list_id="RL-0002", paper_id="PAP-999")  # never on it
    fails(s, "remove_from_reading_list", "not_found", list_id="RL-0099", paper_id="PAP-003")
    assert s.dump()["reading_lists"]["RL-0002"]["paper_ids"] == ["PAP-007", "PAP-008"]


def test_add_note(s: Session) -> None:
    rec = s.call("add_note", {"paper_id": "PAP-004", "text": " Patch size 16 works best at 224px. "})
    assert rec.ok and rec.result == {
        "id": "NT-0004",
        "paper_id": "PAP-004",
        "text": "Patch size 16 works best at 224px.",
        "created_at": "2026-03-04T14:00:00",
    }
    assert rec.diff.added == ["notes.NT-0004"] and rec.diff.changed == ["counters.NT"]
    assert [n["id"] for n in ok(s, "get_paper", paper_id="PAP-004")["notes"]] == ["NT-0004"]
    assert ok(s, "add_note", paper_id="PAP-004", text="x" * 2000)["id"] == "NT-0005"  # the limit itself is fine
    fails(s, "add_note", "tool_error", paper_id="PAP-004", text="x" * 2001)
    fails(s, "add_note", "tool_error", paper_id="PAP-004", text="  ")
    fails(s, "add_note", "not_found", paper_id="PAP-999", text="hello")
    fails(s, "add_note", "invalid_arguments", paper_id="PAP-004")


def test_delete_note(s: Session) -> None:
    rec = s.call("delete_note", {"note_id": "NT-0001"})
    assert rec.ok and rec.result["text"] == "Re-read section 3.2 on scaled dot-product attention."
    assert rec.diff.removed == ["notes.NT-0001"] and not rec.diff.added and not rec.diff.changed
    assert [c.op for c in rec.changes] == ["delete"]
    assert [n["id"] for n in ok(s, "get_paper", paper_id="PAP-001")["notes"]] == ["NT-0003"]
    fails(s, "delete_note", "not_found", note_id="NT-0001")
    fails(s, "delete_note", "invalid_arguments", note_id=1)


def test_citation_chain_into_a_reading_list(s: Session) -> None:
    top = ok(s, "search_papers", query="mixture of experts")[0]
    paper = ok(s, "get_paper", paper_id=top["id"])
    assert paper["id"] == "PAP-008"
    first_author = ok(s, "get_author", author_id=paper["author_ids"][0])
    assert first_author["name"] == "William Fedus" and first_author["paper_ids"] == ["PAP-008"]
    refs = ok(s, "get_citations", paper_id=paper["id"], direction="references")
    assert _ids(refs) == ["PAP-005", "PAP-001", "PAP-007"]
    rl = ok(s, "create_reading_list", name="MoE background")
    for r in refs:
        ok(s, "add_to_reading_list", list_id=rl["id"], paper_id=r["id"])
    ok(s, "remove_from_reading_list", list_id=rl["id"], paper_id="PAP-001")
    assert s.dump()["reading_lists"]["RL-0003"]["paper_ids"] == ["PAP-005", "PAP-007"]


def test_note_chain(s: Session) -> None:
    note = ok(s, "add_note", paper_id="PAP-007", text="Noisy top-k gating, section 2.1.")
    assert [n["id"] for n in ok(s, "get_paper", paper_id="PAP-007")["notes"]] == [note["id"]]
    ok(s, "delete_note", note_id=note["id"])
    assert ok(s, "get_paper", paper_id="PAP-007")["notes"] == []
    assert sorted(s.dump()["notes"]) == ["NT-0001", "NT-0002", "NT-0003"]
    assert s.dump()["counters"]["NT"] == 4  # ids are never reused
