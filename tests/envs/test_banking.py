"""Every tool of `banking`: results, error cases, state transitions."""

from __future__ import annotations

import pytest

from envfactory.env import Session
from envfactory.env.pool import EnvPool
from tests.envs.helpers import fails, ok


@pytest.fixture()
def s(pool: EnvPool) -> Session:
    # strict: every call also diffs full dumps, proving the tools write only through CRUD helpers
    return pool.get("banking").session("default", strict=True)


def test_list_accounts(s: Session) -> None:
    assert [a["id"] for a in ok(s, "list_accounts", owner="maria silva")] == ["AC-1001", "AC-1002"]
    jonas = ok(s, "list_accounts", owner=" Jonas Weber ")
    assert [(a["id"], a["type"], a["status"]) for a in jonas] == [
        ("AC-2001", "checking", "open"),
        ("AC-2002", "savings", "closed"),
    ]
    assert ok(s, "list_accounts", owner="Nobody Here") == []
    fails(s, "list_accounts", "invalid_arguments")


def test_get_balance(s: Session) -> None:
    # TR-0003 (150.00 to Ana Costa) is pending and already deducted
    assert ok(s, "get_balance", account_id="AC-1001") == {
        "account_id": "AC-1001",
        "currency": "EUR",
        "balance": 2450.75,
        "pending_out": 150.0,
    }
    assert ok(s, "get_balance", account_id="AC-2001")["pending_out"] == 0.0  # TR-0001 is completed
    assert ok(s, "get_balance", account_id="AC-3001")["currency"] == "GBP"
    fails(s, "get_balance", "not_found", account_id="AC-9999")


def test_list_transactions(s: Session) -> None:
    txs = ok(s, "list_transactions", account_id="AC-1001")
    assert [t["id"] for t in txs] == ["TX-0006", "TX-0005", "TX-0004", "TX-0001"]  # newest first
    recent = ok(s, "list_transactions", account_id="AC-1001", limit=2)
    assert [(t["id"], t["amount"]) for t in recent] == [("TX-0006", -150.0), ("TX-0005", -62.85)]
    assert ok(s, "list_transactions", account_id="AC-2002") == []
    fails(s, "list_transactions", "tool_error", account_id="AC-1001", limit=0)
    fails(s, "list_transactions", "tool_error", account_id="AC-1001", limit=101)
    fails(s, "list_transactions", "not_found", account_id="AC-9999")


def test_list_cards(s: Session) -> None:
    cards = ok(s, "list_cards", account_id="AC-1001")
    assert [(c["id"], c["kind"], c["last4"], c["status"]) for c in cards] == [
        ("CD-1001", "debit", "4821", "active"),
        ("CD-1002", "credit", "9930", "active"),
    ]
    assert ok(s, "list_cards", account_id="AC-2002") == []
    fails(s, "list_cards", "not_found", account_id="AC-9999")


def test_freeze_card(s: Session) -> None:
    rec = s.call("freeze_card", {"card_id": "CD-1002", "reason": "lost"})
    assert rec.ok and rec.result["status"] == "frozen" and rec.result["frozen_reason"] == "lost"
    assert rec.diff.changed == ["cards.CD-1002.frozen_reason", "cards.CD-1002.status"]
    assert [c["status"] for c in ok(s, "list_cards", account_id="AC-1001")] == ["active", "frozen"]
    fails(s, "freeze_card", "conflict", card_id="CD-1002", reason="stolen")
    fails(s, "freeze_card", "conflict", card_id="CD-2001", reason="stolen")  # frozen in the scenario
    fails(s, "freeze_card", "not_found", card_id="CD-9999", reason="lost")
    fails(s, "freeze_card", "invalid_arguments", card_id="CD-1001", reason="misplaced")
    fails(s, "freeze_card", "invalid_arguments", card_id="CD-1001")


def test_list_payees(s: Session) -> None:
    assert [p["id"] for p in ok(s, "list_payees", owner="Maria Silva")] == ["PY-0001", "PY-0002"]
    assert ok(s, "list_payees", owner="priya nair") == [
        {"id": "PY-0004", "owner": "Priya Nair", "name": "Maria Silva", "iban": "PT50000201231234567890154"}
    ]
    assert ok(s, "list_payees", owner="Nobody Here") == []


def test_add_payee(s: Session) -> None:
    rec = s.call(
        "add_payee", {"owner": "jonas weber", "name": " Stadtwerke Köln ", "iban": "de44 5001 0517 5407 3249 31"}
    )
    assert rec.ok and rec.result == {
        "id": "PY-0005",
        "owner": "Jonas Weber",  # the holder's name as the bank has it
        "name": "Stadtwerke Köln",
        "iban": "DE44500105175407324931",
    }
    assert rec.diff.added == ["payees.PY-0005"] and rec.diff.changed == ["counters.PY"]
    assert [p["id"] for p in ok(s, "list_payees", owner="Jonas Weber")] == ["PY-0003", "PY-0005"]
    # the same IBAN is fine for another customer
    assert ok(s, "add_payee", owner="Priya Nair", name="Ana Costa", iban="PT50001000001234567890112")["id"] == "PY-0006"


def test_add_payee_errors(s: Session) -> None:
    fails(s, "add_payee", "tool_error", owner="Nobody Here", name="X", iban="PT50001000001234567890112")
    fails(s, "add_payee", "tool_error", owner="Maria Silva", name="  ", iban="PT50001000001234567890199")
    fails(s, "add_payee", "tool_error", owner="Maria Silva", name="X", iban="12345")
    fails(s, "add_payee", "tool_error", owner="Maria Silva", name="X", iban="PT50-0010-0000")
    # PY-0002 (Ana Costa) already has this IBAN, written here with spaces and in lower case
    fails(s, "add_payee", "conflict", owner="Maria Silva", name="Ana", iban="pt50 0010 0000 1234 5678 9011 2")
    fails(s, "add_payee", "invalid_arguments", owner="Maria Silva", name="X")


def test_transfer(s: Session) -> None:
    args = {"from_account_id": "AC-1001", "payee_id": "PY-0001", "amount": 100, "reference": "Invoice 2026-03"}
    rec = s.call("transfer", args)
    assert rec.ok and rec.result == {
        "id": "TR-0004",
        "from_account_id": "AC-1001",
        "payee_id": "PY-0001",
        "amount": 100.0,
        "reference": "Invoice 2026-03",
        "status": "pending",
        "created_at": "2026-03-12T09:30:00",
    }
    assert rec.diff.added == ["transactions.TX-0008", "transfers.TR-0004"]
    assert rec.diff.changed == ["accounts.AC-1001.balance", "counters.TR", "counters.TX"]
    assert ok(s, "get_balance", account_id="AC-1001") == {
        "account_id": "AC-1001",
        "currency": "EUR",
        "balance": 2350.75,  # 2450.75 - 100.00
        "pending_out": 250.0,  # TR-0003 + TR-0004
    }
    assert ok(s, "list_transactions", account_id="AC-1001", limit=1) == [
        {
            "id": "TX-0008",
            "account_id": "AC-1001",
            "posted_at": "2026-03-12T09:30:00",
            "description": "Transfer TR-0004 to Lisbon Energy Co",
            "amount": -100.0,
        }
    ]


def test_transfer_whole_balance_then_insufficient_funds(s: Session) -> None:
    fails(s, "transfer", "conflict", from_account_id="AC-2001", payee_id="PY-0003", amount=310.21)  # has 310.20
    assert ok(s, "transfer", from_account_id="AC-2001", payee_id="PY-0003", amount=310.2)["status"] == "pending"
    assert ok(s, "get_balance", account_id="AC-2001")["balance"] == 0.0
    fails(s, "transfer", "conflict", from_account_id="AC-2001", payee_id="PY-0003", amount=0.01)


def test_transfer_errors(s: Session) -> None:
    pay = {"from_account_id": "AC-1001", "payee_id": "PY-0001"}
    fails(s, "transfer", "not_found", from_account_id="AC-9999", payee_id="PY-0001", amount=10)
    fails(s, "transfer", "not_found", from_account_id="AC-1001", payee_id="PY-9999", amount=10)
    fails(s, "transfer", "tool_error", **pay, amount=0)
    fails(s, "transfer", "tool_error", **pay, amount=-5)
    fails(s, "transfer", "tool_error", **pay, amount=10000.01)
    fails(s, "transfer", "tool_error", **pay, amount=12.345)
    fails(s, "transfer", "tool_error", from_account_id="AC-1001", payee_id="PY-0003", amount=10)  # Jonas's payee
    fails(s, "transfer", "conflict", from_account_id="AC-2002", payee_id="PY-0003", amount=1)  # closed account
    # AC-1002 holds 12000.00, but one transfer may move at most 10000.00
    fails(s, "transfer", "tool_error", from_account_id="AC-1002", payee_id="PY-0002", amount=12000)
    fails(s, "transfer", "invalid_arguments", **pay, amount="100")
    fails(s, "transfer", "invalid_arguments", **pay)


def test_get_transfer(s: Session) -> None:
    tr = ok(s, "get_transfer", transfer_id="TR-0001")
    assert (tr["from_account_id"], tr["payee_id"], tr["amount"], tr["status"]) == (
        "AC-2001",
        "PY-0003",
        950.0,
        "completed",
    )
    assert ok(s, "get_transfer", transfer_id="TR-0003")["status"] == "pending"
    fails(s, "get_transfer", "not_found", transfer_id="TR-9999")


def test_cancel_transfer(s: Session) -> None:
    rec = s.call("cancel_transfer", {"transfer_id": "TR-0003"})
    assert rec.ok and rec.result["status"] == "cancelled" and rec.result["amount"] == 150.0
    assert rec.diff.added == ["transactions.TX-0008"]
    assert rec.diff.changed == ["accounts.AC-1001.balance", "counters.TX", "transfers.TR-0003.status"]
    assert ok(s, "get_balance", account_id="AC-1001")["balance"] == 2600.75  # 2450.75 + 150.00
    assert ok(s, "get_balance", account_id="AC-1001")["pending_out"] == 0.0
    credit = ok(s, "list_transactions", account_id="AC-1001", limit=1)[0]
    assert (credit["description"], credit["amount"]) == ("Cancelled transfer TR-0003", 150.0)
    fails(s, "cancel_transfer", "conflict", transfer_id="TR-0003")  # already cancelled
    fails(s, "cancel_transfer", "conflict", transfer_id="TR-0001")  # completed
    fails(s, "cancel_transfer", "not_found", transfer_id="TR-9999")


def test_chain_payee_transfer_cancel(s: Session) -> None:
    account = next(a for a in ok(s, "list_accounts", owner="Jonas Weber") if a["status"] == "open")
    payee = ok(s, "add_payee", owner="Jonas Weber", name="Lena Hoff", iban="DE75512108001245126199")
    tr = ok(s, "transfer", from_account_id=account["id"], payee_id=payee["id"], amount=120.5, reference="Concert")
    assert (tr["id"], tr["payee_id"]) == ("TR-0004", "PY-0005")
    assert ok(s, "get_transfer", transfer_id=tr["id"])["status"] == "pending"
    assert ok(s, "get_balance", account_id="AC-2001")["balance"] == 189.7  # 310.20 - 120.50
    ok(s, "cancel_transfer", transfer_id=tr["id"])
    assert ok(s, "get_transfer", transfer_id=tr["id"])["status"] == "cancelled"
    assert ok(s, "get_balance", account_id="AC-2001")["balance"] == 310.2
    txs = ok(s, "list_transactions", account_id="AC-2001", limit=3)
    assert [(t["id"], t["amount"]) for t in txs] == [("TX-0009", 120.5), ("TX-0008", -120.5), ("TX-0003", -950.0)]


def test_chain_account_card_freeze(s: Session) -> None:
    account = ok(s, "list_accounts", owner="Priya Nair")[0]
    card = ok(s, "list_cards", account_id=account["id"])[0]
    assert ok(s, "freeze_card", card_id=card["id"], reason="suspicious_activity")["status"] == "frozen"
    assert ok(s, "list_cards", account_id=account["id"])[0]["frozen_reason"] == "suspicious_activity"


def test_month_end_duplicate_payment(pool: EnvPool) -> None:
    s = pool.get("banking").session("month_end", strict=True)
    # Rui paid the gym fee twice; the second transfer (TR-0004) is still pending
    assert ok(s, "get_balance", account_id="AC-5001") == {
        "account_id": "AC-5001",
        "currency": "EUR",
        "balance": 84.3,
        "pending_out": 45.0,
    }
    fails(s, "cancel_transfer", "conflict", transfer_id="TR-0001")  # the first one went through
    ok(s, "cancel_transfer", transfer_id="TR-0004")
    assert ok(s, "get_balance", account_id="AC-5001")["balance"] == 129.3
    fails(s, "transfer", "conflict", from_account_id="AC-5001", payee_id="PY-0001", amount=130)
    ok(s, "transfer", from_account_id="AC-5001", payee_id="PY-0001", amount=129.3)
    assert ok(s, "get_balance", account_id="AC-5001")["balance"] == 0.0
