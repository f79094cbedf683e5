"""Sessions: argument validation, structured errors with the state untouched, records, isolation."""

from __future__ import annotations

from typing import Any

import pytest

from envfactory.env import Environment, Record, Session, State, ToolError


class Account(Record):
    id: str
    owner: str
    balance: float


class Bank(State):
    accounts: dict[str, Account] = {}
    audit: list[str] = []


env = Environment("minibank", Bank, description="A tiny bank for tests.", domain="finance")


@env.tool(kind="read")
def get_account(db: Bank, account_id: str) -> Account:
    """Get an account.

    Args:
        account_id: Id of the account.
    """
    return db.get("accounts", account_id, "account")


@env.tool(kind="write")
def open_account(db: Bank, owner: str, deposit: float = 0.0) -> Account:
    """Open an account.

    Args:
        owner: Owner's name.
        deposit: First deposit.
    """
    if deposit < 0:
        raise ToolError("deposit must not be negative", deposit=deposit)
    acc = Account(id=db.new_id("AC"), owner=owner, balance=deposit)
    return db.create("accounts", acc.id, acc)


@env.tool(kind="write")
def transfer(db: Bank, from_id: str, to_id: str, amount: float) -> list[Account]:
    """Move money; fails half-way (after the debit) when the target does not exist.

    Args:
        from_id: Source account.
        to_id: Target account.
        amount: Amount to move.
    """
    src = db.get("accounts", from_id)
    db.update("accounts", from_id, balance=src.balance - amount)
    dst = db.get("accounts", to_id)  # NotFoundError after a write: the session must roll back
    db.update("accounts", to_id, balance=dst.balance + amount)
    return [db.get("accounts", from_id), db.get("accounts", to_id)]


@env.tool(kind="read")
def sneaky_read(db: Bank, account_id: str) -> Account:
    """A read tool that writes (a contract violation the session catches).

    Args:
        account_id: Id of the account.
    """
    db.update("accounts", account_id, balance=0.0)
    return db.get("accounts", account_id)


@env.tool(kind="write")
def crash(db: Bank, account_id: str) -> None:
    """A buggy tool: writes, then raises a bare exception.

    Args:
        account_id: Id of the account.
    """
    db.update("accounts", account_id, owner="???")
    raise KeyError("bug")


@env.tool(kind="write")
def bypass(db: Bank, note: str) -> None:
    """Writes outside the CRUD helpers (only a strict session can see it).

    Args:
        note: Text to append.
    """
    db.audit.append(note)


CONFIG: dict[str, Any] = {
    "accounts": {
        "AC-0001": {"id": "AC-0001", "owner": "ana", "balance": 100.0},
        "AC-0002": {"id": "AC-0002", "owner": "rui", "balance": 5.0},
    },
    "counters": {"AC": 2},
}


@pytest.fixture()
def s() -> Session:
    return Session.fork(env, CONFIG)


def _unchanged(s: Session, tool: str, args: Any, error_type: str) -> None:
    before = s.dump()
    rec = s.call(tool, args)
    assert not rec.ok and rec.error is not None and rec.error.type == error_type, rec
    assert s.dump() == before and rec.diff.empty
    assert s.history[-1] is rec


def test_success_records_call_result_diff(s: Session) -> None:
    rec = s.call("open_account", {"owner": "lena", "deposit": 20})
    assert rec.ok and rec.index == 0
    assert rec.result == {"id": "AC-0003", "owner": "lena", "balance": 20.0}
    assert rec.arguments == {"owner": "lena", "deposit": 20}
    assert rec.diff.added == ["accounts.AC-0003"] and rec.diff.changed == ["counters.AC"]
    assert s.dump()["accounts"]["AC-0003"]["balance"] == 20.0
    assert rec.payload() == rec.result


def test_argument_errors_are_structured(s: Session) -> None:
    _unchanged(s, "no_such_tool", {}, "unknown_tool")
    _unchanged(s, "open_account", {"deposit": 3.0}, "invalid_arguments")  # missing required
    _unchanged(s, "open_account", {"owner": 7}, "invalid_arguments")  # wrong type
    _unchanged(s, "open_account", {"owner": "x", "deposit": "3"}, "invalid_arguments")  # strict: no coercion
    _unchanged(s, "open_account", {"owner": "x", "colour": "red"}, "invalid_arguments")  # unknown parameter
    _unchanged(s, "get_account", {"account_id": "AC-9999"}, "not_found")  # unknown id
    _unchanged(s, "open_account", {"owner": "x", "deposit": -1}, "tool_error")
    rec = s.call("open_account", {"deposit": "3"})
    problems = {p["parameter"]: p["problem"] for p in rec.error.details["problems"]}  # type: ignore[union-attr]
    assert problems["owner"] == "required parameter is missing"
    assert "valid number" in problems["deposit"]
    assert s.call("open_account", "owner=x").error.type == "invalid_arguments"  # type: ignore[arg-type, union-attr]


def test_failed_call_rolls_back_partial_writes(s: Session) -> None:
    _unchanged(s, "transfer", {"from_id": "AC-0001", "to_id": "AC-0404", "amount": 10}, "not_found")
    ok = s.call("transfer", {"from_id": "AC-0001", "to_id": "AC-0002", "amount": 10})
    assert ok.ok and ok.diff.changed == ["accounts.AC-0001.balance", "accounts.AC-0002.balance"]


def test_bugs_and_contract_violations_never_raise(s: Session) -> None:
    _unchanged(s, "crash", {"account_id": "AC-0001"}, "internal_error")
    assert "KeyError" in s.history[-1].error.message  # type: ignore[union-attr]
    _unchanged(s, "sneaky_read", {"account_id": "AC-0001"}, "contract_violation")
    assert "read tool 'sneaky_read' changed the state" in s.history[-1].error.message  # type: ignore[union-attr]


def test_strict_session_catches_writes_outside_the_helpers() -> None:
    lax = Session.fork(env, CONFIG)
    assert lax.call("bypass", {"note": "hi"}).ok  # the fast path trusts the change log
    strict = Session.fork(env, CONFIG, strict=True)
    _unchanged(strict, "bypass", {"note": "hi"}, "contract_violation")
    assert strict.dump()["audit"] == []


def test_sessions_share_nothing() -> None:
    config = {"accounts": {"AC-0001": {"id": "AC-0001", "owner": "ana", "balance": 1.0}}}
    a, b = Session.fork(env, config), Session.fork(env, config)
    a.call("transfer", {"from_id": "AC-0001", "to_id": "AC-0001", "amount": 0})
    a.call("open_account", {"owner": "zoe"})
    assert "AC-0001" in b.dump()["accounts"] and len(b.dump()["accounts"]) == 1
    config["accounts"]["AC-0001"]["owner"] = "changed later"
    assert a.dump()["accounts"]["AC-0001"]["owner"] == "ana"
    assert a.state.accounts is not b.state.accounts


def test_reset_and_dump(s: Session) -> None:
    s.call("open_account", {"owner": "lena"})
    s.reset(CONFIG)
    assert s.history == [] and set(s.dump()["accounts"]) == {"AC-0001", "AC-0002"}
    s.reset(None)
    assert s.dump()["accounts"] == {}


def test_an_untraced_session_ends_in_the_same_state_and_keeps_the_contract_checks() -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("open_account", {"owner": "lena", "deposit": 20}),
        ("transfer", {"from_id": "AC-0001", "to_id": "AC-0404", "amount": 10}),  # fails half-way: rolled back
        ("crash", {"account_id": "AC-0002"}),
        ("transfer", {"from_id": "AC-0001", "to_id": "AC-0003", "amount": 7.5}),
        ("sneaky_read", {"account_id": "AC-0001"}),  # a read: traced, the violation caught
        ("open_account", {"owner": "x", "deposit": -1}),
    ]
    traced, untraced = Session.fork(env, CONFIG), Session(env, env.new_state(CONFIG), traced=False)
    for tool, args in calls:
        a, b = traced.call(tool, args), untraced.call(tool, args)
        assert (a.ok, a.result, a.error) == (b.ok, b.result, b.error)
        assert untraced.dump() == traced.dump()
        if b.ok:
            assert b.diff.empty and b.changes == [] and not a.diff.empty  # what untraced leaves out
    assert untraced.history[4].error.type == "contract_violation"  # type: ignore[union-attr]
