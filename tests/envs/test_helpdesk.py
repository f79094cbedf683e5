"""Every tool of `helpdesk`: results, error cases, state transitions."""

from __future__ import annotations

import pytest

from envfactory.env import Session
from envfactory.env.pool import EnvPool
from tests.envs.helpers import fails, ok

NOW = "2026-03-09T10:00:00"  # the default scenario's clock


@pytest.fixture()
def s(pool: EnvPool) -> Session:
    # strict: every call also diffs full dumps, proving the tools write only through CRUD helpers
    return pool.get("helpdesk").session("default", strict=True)


def _ids(items: list[dict]) -> list[str]:
    return [i["id"] for i in items]


def test_scenarios_load(pool: EnvPool) -> None:
    env = pool.get("helpdesk")
    assert env.scenario_names() == ["default", "onboarding_week"]
    week = env.session("onboarding_week", strict=True)
    assert _ids(ok(week, "search_customers", query="amelia")) == ["CU-101", "CU-104"]
    assert _ids(ok(week, "list_tickets")) == ["TK-0001", "TK-0003", "TK-0004", "TK-0002"]
    fails(week, "assign_ticket", "conflict", ticket_id="TK-0002", agent_id="AG-13")  # Ravi is away


def test_search_customers(s: Session) -> None:
    assert _ids(ok(s, "search_customers", query="priya")) == ["CU-001", "CU-005"]
    assert _ids(ok(s, "search_customers", query="@northwind.de")) == ["CU-002"]
    assert _ids(ok(s, "search_customers", query="BRIGHTPATH")) == ["CU-004"]  # company and email
    assert ok(s, "search_customers", query=" Lund ")[0] == {
        "id": "CU-006",
        "name": "Erik Lund",
        "email": "erik.lund@fjordtech.no",
        "company": "Fjordtech",
        "plan": "free",
    }
    assert ok(s, "search_customers", query="zzz") == []
    fails(s, "search_customers", "tool_error", query="p")
    fails(s, "search_customers", "tool_error", query="   ")
    fails(s, "search_customers", "invalid_arguments")


def test_list_agents(s: Session) -> None:
    assert _ids(ok(s, "list_agents")) == ["AG-01", "AG-02", "AG-03", "AG-04", "AG-05"]
    assert _ids(ok(s, "list_agents", team="technical")) == ["AG-01", "AG-03"]
    assert _ids(ok(s, "list_agents", available_only=True)) == ["AG-01", "AG-02", "AG-03", "AG-05"]
    assert ok(s, "list_agents", team="accounts", available_only=True) == []  # Lukas is away
    fails(s, "list_agents", "invalid_arguments", team="sales")
    fails(s, "list_agents", "invalid_arguments", available_only="yes")


def test_create_ticket(s: Session) -> None:
    rec = s.call(
        "create_ticket",
        {
            "customer_id": "CU-006",
            "subject": " Cannot reset my password ",
            "priority": "high",
            "description": "The reset email never arrives.",
        },
    )
    assert rec.ok and rec.result == {
        "id": "TK-0007",
        "customer_id": "CU-006",
        "subject": "Cannot reset my password",
        "description": "The reset email never arrives.",
        "priority": "high",
        "status": "open",
        "assignee_id": None,
        "created_at": NOW,
        "updated_at": NOW,
        "resolved_at": None,
        "comments": [],
    }
    assert rec.diff.added == ["tickets.TK-0007"] and rec.diff.changed == ["counters.TK"]
    assert [c.op for c in rec.changes] == ["counter", "create"]
    # priority defaults to normal; a closed ticket's subject (TK-0004) may be used again
    again = ok(s, "create_ticket", customer_id="CU-001", subject="SSO login loop on Safari")
    assert (again["id"], again["priority"], again["description"]) == ("TK-0008", "normal", "")


def test_create_ticket_errors(s: Session) -> None:
    fails(s, "create_ticket", "not_found", customer_id="CU-999", subject="Hello")
    fails(s, "create_ticket", "conflict", customer_id="CU-002", subject="invoice charged twice in February")
    fails(s, "create_ticket", "conflict", customer_id="CU-003", subject="How do I add a team member?")  # resolved
    fails(s, "create_ticket", "tool_error", customer_id="CU-002", subject="  ")
    fails(s, "create_ticket", "tool_error", customer_id="CU-002", subject="x" * 121)
    fails(s, "create_ticket", "invalid_arguments", customer_id="CU-002", subject="Hello", priority="critical")
    fails(s, "create_ticket", "invalid_arguments", customer_id="CU-002")
    # the same subject for another customer is no duplicate
    assert ok(s, "create_ticket", customer_id="CU-004", subject="Invoice charged twice in February")["id"] == "TK-0007"


def test_get_ticket(s: Session) -> None:
    t = ok(s, "get_ticket", ticket_id="TK-0001")
    assert (t["status"], t["assignee_id"], t["priority"]) == ("in_progress", "AG-01", "high")
    assert [(c["id"], c["internal"]) for c in t["comments"]] == [("CM-0001", False), ("CM-0002", True)]
    fails(s, "get_ticket", "not_found", ticket_id="TK-0099")


def test_list_tickets(s: Session) -> None:
    # urgent, high, normal, low; oldest first within a priority
    assert _ids(ok(s, "list_tickets")) == ["TK-0002", "TK-0001", "TK-0006", "TK-0004", "TK-0005", "TK-0003"]
    assert _ids(ok(s, "list_tickets", status="open")) == ["TK-0002", "TK-0006", "TK-0005"]
    assert _ids(ok(s, "list_tickets", priority="high")) == ["TK-0001", "TK-0006"]
    assert _ids(ok(s, "list_tickets", assignee_id="AG-03")) == ["TK-0004", "TK-0003"]
    assert _ids(ok(s, "list_tickets", customer_id="CU-001")) == ["TK-0001", "TK-0004"]
    assert _ids(ok(s, "list_tickets", status="open", assignee_id="AG-05")) == ["TK-0005"]
    assert ok(s, "list_tickets", assignee_id="AG-02") == []
    summary = ok(s, "list_tickets", customer_id="CU-005")[0]
    assert summary == {
        "id": "TK-0006",
        "customer_id": "CU-005",
        "subject": "API rate limit too low for nightly sync",
        "priority": "high",
        "status": "open",
        "assignee_id": None,
        "updated_at": "2026-03-09T08:10:00",
    }
    fails(s, "list_tickets", "not_found", assignee_id="AG-99")
    fails(s, "list_tickets", "not_found", customer_id="CU-999")
    fails(s, "list_tickets", "invalid_arguments", status="pending")


def test_add_comment(s: Session) -> None:
    rec = s.call("add_comment", {"ticket_id": "TK-0002", "text": "We are looking into the duplicate charge."})
    assert rec.ok and rec.result == {
        "id": "CM-0004",
        "ticket_id": "TK-0002",
        "text": "We are looking into the duplicate charge.",
        "internal": False,
        "created_at": NOW,
    }
    assert rec.diff.added == ["tickets.TK-0002.comments[0]"]
    assert rec.diff.changed == ["counters.CM", "tickets.TK-0002.updated_at"]
    rec = s.call("add_comment", {"ticket_id": "TK-0001", "text": "Fix is in 4.2.1.", "internal": True})
    assert rec.ok and rec.result["id"] == "CM-0005" and rec.result["internal"] is True
    assert rec.diff.added == ["tickets.TK-0001.comments[2]"]
    assert ok(s, "add_comment", ticket_id="TK-0003", text="Glad it worked!")["id"] == "CM-0006"  # resolved is fine
    assert [c["id"] for c in ok(s, "get_ticket", ticket_id="TK-0001")["comments"]] == ["CM-0001", "CM-0002", "CM-0005"]


def test_add_comment_errors(s: Session) -> None:
    fails(s, "add_comment", "conflict", ticket_id="TK-0004", text="Any update?")  # closed
    fails(s, "add_comment", "tool_error", ticket_id="TK-0002", text="   ")
    fails(s, "add_comment", "tool_error", ticket_id="TK-0002", text="x" * 5001)
    fails(s, "add_comment", "not_found", ticket_id="TK-0099", text="Hello")
    fails(s, "add_comment", "invalid_arguments", ticket_id="TK-0002", text="Hello", internal="yes")


def test_assign_ticket(s: Session) -> None:
    rec = s.call("assign_ticket", {"ticket_id": "TK-0002", "agent_id": "AG-02"})
    assert rec.ok and (rec.result["assignee_id"], rec.result["updated_at"]) == ("AG-02", NOW)
    assert rec.diff.changed == ["tickets.TK-0002.assignee_id", "tickets.TK-0002.updated_at"]
    # reassigning keeps the status
    moved = ok(s, "assign_ticket", ticket_id="TK-0001", agent_id="AG-03")
    assert (moved["assignee_id"], moved["status"]) == ("AG-03", "in_progress")
    assert _ids(ok(s, "list_tickets", assignee_id="AG-03")) == ["TK-0001", "TK-0004", "TK-0003"]  # high first


def test_assign_ticket_errors(s: Session) -> None:
    fails(s, "assign_ticket", "conflict", ticket_id="TK-0004", agent_id="AG-01")  # closed
    fails(s, "assign_ticket", "conflict", ticket_id="TK-0002", agent_id="AG-04")  # away
    fails(s, "assign_ticket", "conflict", ticket_id="TK-0005", agent_id="AG-05")  # already hers
    fails(s, "assign_ticket", "not_found", ticket_id="TK-0099", agent_id="AG-01")
    fails(s, "assign_ticket", "not_found", ticket_id="TK-0002", agent_id="AG-99")
    fails(s, "assign_ticket", "invalid_arguments", ticket_id="TK-0002")


def test_update_ticket_status_forward(s: Session) -> None:
    rec = s.call("update_ticket_status", {"ticket_id": "TK-0005", "status": "in_progress"})
    assert rec.ok and rec.result["status"] == "in_progress"
    assert rec.diff.changed == ["tickets.TK-0005.status", "tickets.TK-0005.updated_at"]
    rec = s.call("update_ticket_status", {"ticket_id": "TK-0001", "status": "resolved"})
    assert rec.ok and rec.result["resolved_at"] == NOW
    assert rec.diff.changed == ["tickets.TK-0001.resolved_at", "tickets.TK-0001.status", "tickets.TK-0001.updated_at"]
    rec = s.call("update_ticket_status", {"ticket_id": "TK-0003", "status": "closed"})
    assert rec.ok and rec.result["resolved_at"] == "2026-03-07T10:00:00"  # kept when closing
    assert rec.diff.changed == ["tickets.TK-0003.status", "tickets.TK-0003.updated_at"]


def test_update_ticket_status_reopen(s: Session) -> None:
    rec = s.call("update_ticket_status", {"ticket_id": "TK-0003", "status": "open"})
    assert rec.ok and (rec.result["status"], rec.result["resolved_at"]) == ("open", None)
    assert rec.diff.changed == ["tickets.TK-0003.resolved_at", "tickets.TK-0003.status", "tickets.TK-0003.updated_at"]
    closed = ok(s, "update_ticket_status", ticket_id="TK-0004", status="open")
    assert (closed["status"], closed["resolved_at"], closed["assignee_id"]) == ("open", None, "AG-03")
    assert ok(s, "add_comment", ticket_id="TK-0004", text="Reopened: the loop is back on Safari 18.")["id"] == "CM-0004"


def test_update_ticket_status_rejects_bad_moves(s: Session) -> None:
    fails(s, "update_ticket_status", "conflict", ticket_id="TK-0002", status="in_progress")  # unassigned
    fails(s, "update_ticket_status", "conflict", ticket_id="TK-0002", status="resolved")  # skips in_progress
    fails(s, "update_ticket_status", "conflict", ticket_id="TK-0002", status="open")  # already open
    fails(s, "update_ticket_status", "conflict", ticket_id="TK-0001", status="closed")  # not resolved yet
    fails(s, "update_ticket_status", "conflict", ticket_id="TK-0001", status="open")
    fails(s, "update_ticket_status", "conflict", ticket_id="TK-0004", status="closed")
    fails(s, "update_ticket_status", "conflict", ticket_id="TK-0004", status="in_progress")  # reopen first
    fails(s, "update_ticket_status", "not_found", ticket_id="TK-0099", status="open")
    fails(s, "update_ticket_status", "invalid_arguments", ticket_id="TK-0002", status="done")


def test_ticket_lifecycle_chain(s: Session) -> None:
    customer = ok(s, "search_customers", query="erik")[0]
    ticket = ok(s, "create_ticket", customer_id=customer["id"], subject="Webhook retries flood our endpoint")
    agent = ok(s, "list_agents", team="technical", available_only=True)[0]
    assert (customer["id"], ticket["id"], agent["id"]) == ("CU-006", "TK-0007", "AG-01")
    ok(s, "assign_ticket", ticket_id=ticket["id"], agent_id=agent["id"])
    ok(s, "update_ticket_status", ticket_id=ticket["id"], status="in_progress")
    ok(s, "add_comment", ticket_id=ticket["id"], text="Retries now back off exponentially.")
    ok(s, "update_ticket_status", ticket_id=ticket["id"], status="resolved")
    ok(s, "update_ticket_status", ticket_id=ticket["id"], status="closed")
    fails(s, "add_comment", "conflict", ticket_id=ticket["id"], text="One more thing")
    final = ok(s, "get_ticket", ticket_id=ticket["id"])
    assert (final["status"], final["assignee_id"], final["resolved_at"]) == ("closed", "AG-01", NOW)
    assert [c["text"] for c in final["comments"]] == ["Retries now back off exponentially."]
    assert _ids(ok(s, "list_tickets", customer_id="CU-006", status="closed")) == ["TK-0007"]


def test_triage_chain(s: Session) -> None:
    # pick the most urgent unassigned ticket and hand it to an available billing agent
    urgent = ok(s, "list_tickets", status="open")[0]
    assert urgent["id"] == "TK-0002" and urgent["assignee_id"] is None
    billing = ok(s, "list_agents", team="billing", available_only=True)
    assert _ids(billing) == ["AG-02", "AG-05"]
    ok(s, "assign_ticket", ticket_id=urgent["id"], agent_id=billing[0]["id"])
    started = ok(s, "update_ticket_status", ticket_id=urgent["id"], status="in_progress")
    assert (started["assignee_id"], started["status"]) == ("AG-02", "in_progress")
    assert _ids(ok(s, "list_tickets", assignee_id="AG-02", status="in_progress")) == ["TK-0002"]
