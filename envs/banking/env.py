"""Banking: accounts and balances, transaction history, payees, transfers and card freezes."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from envfactory.env import ConflictError, Environment, Record, State, ToolError

# Money is a float in the account currency, always rounded to 2 decimals (cents).
MAX_TRANSFER = 10000.0  # largest single transfer
_IBAN = re.compile(r"^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$")


class Account(Record):
    id: str
    owner: str
    type: Literal["checking", "savings"]
    iban: str
    currency: str = "EUR"
    balance: float
    status: Literal["open", "closed"] = "open"


class Balance(Record):
    account_id: str
    currency: str
    balance: float
    pending_out: float


class Card(Record):
    id: str
    account_id: str
    kind: Literal["debit", "credit"]
    last4: str
    status: Literal["active", "frozen"] = "active"
    frozen_reason: str | None = None


class Payee(Record):
    id: str
    owner: str
    name: str
    iban: str


class Transaction(Record):
    id: str
    account_id: str
    posted_at: datetime
    description: str
    amount: float  # positive: money in, negative: money out


class Transfer(Record):
    id: str
    from_account_id: str
    payee_id: str
    amount: float
    reference: str = ""
    status: Literal["pending", "completed", "cancelled"] = "pending"
    created_at: datetime


class BankDB(State):
    accounts: dict[str, Account] = {}
    cards: dict[str, Card] = {}
    payees: dict[str, Payee] = {}
    transactions: dict[str, Transaction] = {}
    transfers: dict[str, Transfer] = {}


env = Environment(
    "banking",
    BankDB,
    description=(
        "Retail banking: list a customer's accounts, balances and transactions, manage payees, "
        "send and cancel transfers, and freeze cards."
    ),
    domain="finance",
)


def _same_owner(a: str, b: str) -> bool:
    return a.strip().lower() == b.strip().lower()


def _post(db: BankDB, account: Account, amount: float, description: str) -> Transaction:
    """Book `amount` on `account`: a new transaction and the new balance."""
    tx = Transaction(
        id=db.new_id("TX"), account_id=account.id, posted_at=db.now(), description=description, amount=amount
    )
    db.update("accounts", account.id, balance=round(account.balance + amount, 2))
    return db.create("transactions", tx.id, tx)


@env.tool(kind="read")
def list_accounts(db: BankDB, owner: str) -> list[Account]:
    """List all accounts (open and closed) held by a customer, with their IBAN and balance.

    Args:
        owner: Full name of the account holder, e.g. "Maria Silva".
    """
    return [a for a in db.accounts.values() if _same_owner(a.owner, owner)]


@env.tool(kind="read")
def get_balance(db: BankDB, account_id: str) -> Balance:
    """Get an account's balance and the total of its pending outgoing transfers (already deducted).

    Args:
        account_id: Id of the account, as returned by list_accounts.
    """
    account = db.get("accounts", account_id, "account")
    pending = sum(t.amount for t in db.find("transfers", from_account_id=account_id, status="pending"))
    return Balance(
        account_id=account_id, currency=account.currency, balance=account.balance, pending_out=round(pending, 2)
    )


@env.tool(kind="read")
def list_transactions(db: BankDB, account_id: str, limit: int = 10) -> list[Transaction]:
    """List an account's most recent transactions, newest first.

    Args:
        account_id: Id of the account.
        limit: Most transactions to return (1-100).
    """
    db.get("accounts", account_id, "account")
    if limit < 1 or limit > 100:
        raise ToolError(f"limit must be between 1 and 100, got {limit}")
    txs = sorted(db.find("transactions", account_id=account_id), key=lambda t: (t.posted_at, t.id), reverse=True)
    return txs[:limit]


@env.tool(kind="read")
def list_cards(db: BankDB, account_id: str) -> list[Card]:
    """List the payment cards linked to an account, with their status.

    Args:
        account_id: Id of the account.
    """
    db.get("accounts", account_id, "account")
    return db.find("cards", account_id=account_id)


@env.tool(kind="write")
def freeze_card(
    db: BankDB, card_id: str, reason: Literal["lost", "stolen", "suspicious_activity", "temporary"]
) -> Card:
    """Freeze a card so that it can no longer be used for payments or withdrawals.

    Args:
        card_id: Id of the card, as returned by list_cards.
        reason: Why the card is frozen: "lost", "stolen", "suspicious_activity" or "temporary".
    """
    card = db.get("cards", card_id, "card")
    if card.status == "frozen":
        raise ConflictError(f"card {card_id} is already frozen ({card.frozen_reason})")
    return db.update("cards", card_id, status="frozen", frozen_reason=reason)


@env.tool(kind="read")
def list_payees(db: BankDB, owner: str) -> list[Payee]:
    """List the payees a customer has saved for transfers.

    Args:
        owner: Full name of the customer.
    """
    return [p for p in db.payees.values() if _same_owner(p.owner, owner)]


@env.tool(kind="write")
def add_payee(db: BankDB, owner: str, name: str, iban: str) -> Payee:
    """Save a new payee (a person or company to send transfers to) for a customer.

    Args:
        owner: Full name of the customer who saves the payee; they must hold an account.
        name: Name of the payee, e.g. "Ana Costa".
        iban: The payee's IBAN; spaces are ignored, e.g. "PT50 0002 0123 1234 5678 9015 4".
    """
    accounts = [a for a in db.accounts.values() if _same_owner(a.owner, owner)]
    if not accounts:
        raise ToolError(f"'{owner}' holds no account at this bank")
    if not name.strip():
        raise ToolError("name must not be empty")
    normalized = iban.replace(" ", "").upper()
    if not _IBAN.match(normalized):
        raise ToolError(f"'{iban}' is not a valid IBAN")
    owner_name = accounts[0].owner
    for p in db.payees.values():
        if _same_owner(p.owner, owner_name) and p.iban == normalized:
            raise ConflictError(f"{owner_name} already has payee {p.id} ({p.name}) with IBAN {normalized}")
    payee = Payee(id=db.new_id("PY"), owner=owner_name, name=name.strip(), iban=normalized)
    return db.create("payees", payee.id, payee)


@env.tool(kind="write")
def transfer(db: BankDB, from_account_id: str, payee_id: str, amount: float, reference: str = "") -> Transfer:
    """Send money from an account to a saved payee; the amount is deducted at once and the transfer stays pending.

    Args:
        from_account_id: Id of the account to pay from.
        payee_id: Id of the payee, as returned by add_payee or list_payees.
        amount: Amount in the account currency, at most 2 decimals (0.01-10000.00).
        reference: Message for the payee, e.g. "Invoice 2026-03".
    """
    account = db.get("accounts", from_account_id, "account")
    payee = db.get("payees", payee_id, "payee")
    if amount <= 0 or amount > MAX_TRANSFER:
        raise ToolError(f"amount must be between 0.01 and {MAX_TRANSFER:.2f}, got {amount}")
    if round(amount, 2) != amount:
        raise ToolError(f"amount must have at most 2 decimals, got {amount}")
    if not _same_owner(payee.owner, account.owner):
        raise ToolError(f"payee {payee_id} is not a payee of {account.owner}, the holder of {from_account_id}")
    if account.status != "open":
        raise ConflictError(f"account {from_account_id} is {account.status}")
    if amount > account.balance:
        raise ConflictError(
            f"insufficient funds: {from_account_id} has {account.balance:.2f} {account.currency}, "
            f"the transfer needs {amount:.2f}"
        )
    tr = Transfer(
        id=db.new_id("TR"),
        from_account_id=from_account_id,
        payee_id=payee_id,
        amount=amount,
        reference=reference.strip(),
        created_at=db.now(),
    )
    _post(db, account, -amount, f"Transfer {tr.id} to {payee.name}")
    return db.create("transfers", tr.id, tr)


@env.tool(kind="read")
def get_transfer(db: BankDB, transfer_id: str) -> Transfer:
    """Get a transfer by its id, with its status (pending, completed or cancelled).

    Args:
        transfer_id: Id of the transfer, as returned by transfer, e.g. "TR-0001".
    """
    return db.get("transfers", transfer_id, "transfer")


@env.tool(kind="write")
def cancel_transfer(db: BankDB, transfer_id: str) -> Transfer:
    """Cancel a pending transfer; the amount is credited back to the account it was sent from.

    Args:
        transfer_id: Id of the pending transfer.
    """
    tr = db.get("transfers", transfer_id, "transfer")
    if tr.status != "pending":
        raise ConflictError(f"transfer {transfer_id} is {tr.status}; only pending transfers can be cancelled")
    account = db.get("accounts", tr.from_account_id, "account")
    _post(db, account, tr.amount, f"Cancelled transfer {transfer_id}")
    return db.update("transfers", transfer_id, status="cancelled")
