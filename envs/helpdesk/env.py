"""Helpdesk: find customers, open support tickets, comment, assign agents and move tickets through their workflow."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from envfactory.env import ConflictError, Environment, Record, State, ToolError

Priority = Literal["low", "normal", "high", "urgent"]
Status = Literal["open", "in_progress", "resolved", "closed"]
Team = Literal["billing", "technical", "accounts"]

# The ticket workflow: open -> in_progress -> resolved -> closed; resolved and closed tickets can be reopened.
TRANSITIONS: dict[str, tuple[str, ...]] = {
    "open": ("in_progress",),
    "in_progress": ("resolved",),
    "resolved": ("closed", "open"),
    "closed": ("open",),
}
PRIORITY_ORDER: dict[str, int] = {"urgent": 0, "high": 1, "normal": 2, "low": 3}
MAX_SUBJECT = 120
MAX_COMMENT = 5000


class Customer(Record):
    id: str
    name: str
    email: str
    company: str
    plan: Literal["free", "pro", "enterprise"]


class SupportAgent(Record):
    id: str
    name: str
    email: str
    team: Team
    available: bool = True


class Comment(Record):
    id: str
    ticket_id: str
    text: str
    internal: bool = False
    created_at: datetime


class Ticket(Record):
    id: str
    customer_id: str
    subject: str
    description: str = ""
    priority: Priority
    status: Status = "open"
    assignee_id: str | None = None
    created_at: datetime
    updated_at: datetime
    resolved_at: datetime | None = None
    comments: list[Comment] = Field(default_factory=list)


class TicketSummary(Record):
    id: str
    customer_id: str
    subject: str
    priority: Priority
    status: Status
    assignee_id: str | None
    updated_at: datetime


class HelpdeskDB(State):
    customers: dict[str, Customer] = Field(default_factory=dict)
    agents: dict[str, SupportAgent] = Field(default_factory=dict)
    tickets: dict[str, Ticket] = Field(default_factory=dict)


env = Environment(
    "helpdesk",
    HelpdeskDB,
    description=(
        "Customer support desk: look up customers, open tickets, add public or internal comments, "
        "assign tickets to support agents and move them through open, in progress, resolved and closed."
    ),
    domain="office",
)


def _summary(t: Ticket) -> TicketSummary:
    return TicketSummary(**t.model_dump(include=set(TicketSummary.model_fields)))


@env.tool(kind="read")
def search_customers(db: HelpdeskDB, query: str) -> list[Customer]:
    """Find customers whose name, email or company contains the query (case-insensitive).

    Args:
        query: Part of a name, email address or company, at least 2 characters, e.g. "priya" or "@northwind.de".
    """
    q = query.strip().lower()
    if len(q) < 2:
        raise ToolError(f"query must have at least 2 characters, got {query!r}")
    return [c for c in db.customers.values() if q in c.name.lower() or q in c.email.lower() or q in c.company.lower()]


@env.tool(kind="read")
def list_agents(db: HelpdeskDB, team: Team | None = None, available_only: bool = False) -> list[SupportAgent]:
    """List support agents, optionally of one team or only those available to take tickets.

    Args:
        team: "billing", "technical" or "accounts".
        available_only: Leave out agents who are away.
    """
    return [a for a in db.agents.values() if (team is None or a.team == team) and (not available_only or a.available)]


@env.tool(kind="write")
def create_ticket(
    db: HelpdeskDB, customer_id: str, subject: str, priority: Priority = "normal", description: str = ""
) -> Ticket:
    """Open a new support ticket for a customer; it starts unassigned with status "open".

    Args:
        customer_id: Id of the customer, as returned by search_customers.
        subject: One-line summary of the problem (at most 120 characters).
        priority: "low", "normal", "high" or "urgent".
        description: Longer description of the problem.
    """
    customer = db.get("customers", customer_id, "customer")
    subject = subject.strip()
    if not subject:
        raise ToolError("subject must not be empty")
    if len(subject) > MAX_SUBJECT:
        raise ToolError(f"subject must be at most {MAX_SUBJECT} characters, got {len(subject)}")
    for t in db.find("tickets", customer_id=customer_id):
        if t.status != "closed" and t.subject.lower() == subject.lower():
            raise ConflictError(f"{customer.name} already has {t.status} ticket {t.id} with this subject")
    now = db.now()
    ticket = Ticket(
        id=db.new_id("TK"),
        customer_id=customer_id,
        subject=subject,
        description=description.strip(),
        priority=priority,
        created_at=now,
        updated_at=now,
    )
    return db.create("tickets", ticket.id, ticket)


@env.tool(kind="read")
def get_ticket(db: HelpdeskDB, ticket_id: str) -> Ticket:
    """Get a ticket with its full description, status, assignee and comment thread.

    Args:
        ticket_id: Id of the ticket, as returned by create_ticket or list_tickets.
    """
    return db.get("tickets", ticket_id, "ticket")


@env.tool(kind="read")
def list_tickets(
    db: HelpdeskDB,
    status: Status | None = None,
    priority: Priority | None = None,
    assignee_id: str | None = None,
    customer_id: str | None = None,
) -> list[TicketSummary]:
    """List tickets matching all given filters, most urgent first, then oldest first.

    Args:
        status: Only tickets in this status: "open", "in_progress", "resolved" or "closed".
        priority: Only tickets of this priority.
        assignee_id: Only tickets assigned to this agent (an id from list_agents).
        customer_id: Only tickets of this customer (an id from search_customers).
    """
    if assignee_id is not None:
        db.get("agents", assignee_id, "agent")
    if customer_id is not None:
        db.get("customers", customer_id, "customer")
    found = [
        t
        for t in db.tickets.values()
        if (status is None or t.status == status)
        and (priority is None or t.priority == priority)
        and (assignee_id is None or t.assignee_id == assignee_id)
        and (customer_id is None or t.customer_id == customer_id)
    ]
    found.sort(key=lambda t: (PRIORITY_ORDER[t.priority], t.created_at, t.id))
    return [_summary(t) for t in found]


@env.tool(kind="write")
def add_comment(db: HelpdeskDB, ticket_id: str, text: str, internal: bool = False) -> Comment:
    """Add a comment to a ticket that is not closed: a reply the customer sees, or an internal note.

    Args:
        ticket_id: Id of the ticket.
        text: The comment (at most 5000 characters).
        internal: True for a note only support agents see.
    """
    ticket = db.get("tickets", ticket_id, "ticket")
    if ticket.status == "closed":
        raise ConflictError(f"ticket {ticket_id} is closed; reopen it before commenting")
    text = text.strip()
    if not text:
        raise ToolError("text must not be empty")
    if len(text) > MAX_COMMENT:
        raise ToolError(f"a comment holds at most {MAX_COMMENT} characters, got {len(text)}")
    comment = Comment(id=db.new_id("CM"), ticket_id=ticket_id, text=text, internal=internal, created_at=db.now())
    db.update("tickets", ticket_id, comments=[*ticket.comments, comment], updated_at=db.now())
    return comment


@env.tool(kind="write")
def assign_ticket(db: HelpdeskDB, ticket_id: str, agent_id: str) -> Ticket:
    """Assign (or reassign) a ticket that is not closed to an available support agent.

    Args:
        ticket_id: Id of the ticket.
        agent_id: Id of the agent, as returned by list_agents.
    """
    ticket = db.get("tickets", ticket_id, "ticket")
    agent = db.get("agents", agent_id, "agent")
    if ticket.status == "closed":
        raise ConflictError(f"ticket {ticket_id} is closed; reopen it before assigning it")
    if not agent.available:
        raise ConflictError(f"{agent.name} ({agent_id}) is away and cannot take tickets")
    if ticket.assignee_id == agent_id:
        raise ConflictError(f"ticket {ticket_id} is already assigned to {agent.name}")
    return db.update("tickets", ticket_id, assignee_id=agent_id, updated_at=db.now())


@env.tool(kind="write")
def update_ticket_status(db: HelpdeskDB, ticket_id: str, status: Status) -> Ticket:
    """Move a ticket along its workflow: open -> in_progress -> resolved -> closed, or reopen it.

    Allowed moves: open to in_progress (the ticket must be assigned), in_progress to resolved,
    resolved to closed, and resolved or closed back to open (reopen).

    Args:
        ticket_id: Id of the ticket.
        status: The new status: "open", "in_progress", "resolved" or "closed".
    """
    ticket = db.get("tickets", ticket_id, "ticket")
    allowed = TRANSITIONS[ticket.status]
    if status not in allowed:
        raise ConflictError(
            f"ticket {ticket_id} is {ticket.status}; it can move only to {' or '.join(allowed)}, not {status}"
        )
    if status == "in_progress" and ticket.assignee_id is None:
        raise ConflictError(f"ticket {ticket_id} is unassigned; assign it before starting work")
    fields: dict[str, object] = {"status": status, "updated_at": db.now()}
    if status == "resolved":
        fields["resolved_at"] = db.now()
    elif status == "open":
        fields["resolved_at"] = None
    return db.update("tickets", ticket_id, **fields)
