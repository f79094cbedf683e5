"""Calendar: a team's events, attendees and meeting rooms; find free time, schedule, reschedule, book rooms."""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta
from typing import Literal

from envfactory.env import ConflictError, Environment, Record, State, ToolError

WORK_START, WORK_END = time(9, 0), time(18, 0)  # the working day find_free_slots searches
MIN_MINUTES, MAX_MINUTES = 15, 480
_EMAIL = re.compile(r"^[a-z0-9._%+-]+@[a-z0-9-]+(\.[a-z0-9-]+)*\.[a-z]{2,}$")


class Room(Record):
    id: str
    name: str
    floor: int
    capacity: int
    equipment: list[str] = []


class Event(Record):
    id: str
    title: str
    organizer: str
    start: datetime
    end: datetime
    attendees: list[str] = []
    room_id: str | None = None
    status: Literal["scheduled", "cancelled"] = "scheduled"


class Slot(Record):
    start: datetime
    end: datetime
    minutes: int


class CalendarDB(State):
    rooms: dict[str, Room] = {}
    events: dict[str, Event] = {}


env = Environment(
    "calendar",
    CalendarDB,
    description=(
        "Team calendar: list events, find time when people are free, create, reschedule and cancel "
        "meetings, invite attendees and book meeting rooms."
    ),
    domain="office",
)


def _email(value: str, what: str = "email") -> str:
    e = value.strip().lower()
    if not _EMAIL.match(e):
        raise ToolError(f"'{value}' is not a valid {what} address")
    return e


def _check_time(db: CalendarDB, start: datetime, minutes: int) -> datetime:
    """Validate a start and duration; return the end."""
    if minutes < MIN_MINUTES or minutes > MAX_MINUTES:
        raise ToolError(f"duration_minutes must be between {MIN_MINUTES} and {MAX_MINUTES}, got {minutes}")
    if start < db.now():
        raise ToolError(f"start {start.isoformat()} is in the past (now is {db.now().isoformat()})")
    return start + timedelta(minutes=minutes)


def _involves(e: Event, person: str) -> bool:
    return e.organizer == person or person in e.attendees


def _upcoming(db: CalendarDB, event: Event) -> None:
    """Only scheduled events that have not started yet can be changed."""
    if event.status != "scheduled":
        raise ConflictError(f"event {event.id} is {event.status}")
    if event.start < db.now():
        raise ConflictError(f"event {event.id} started at {event.start.isoformat()} and can no longer be changed")


def _clash(
    db: CalendarDB,
    start: datetime,
    end: datetime,
    *,
    person: str | None = None,
    room_id: str | None = None,
    ignore: str | None = None,
) -> Event | None:
    """The first scheduled event overlapping [start, end) that involves `person` or uses `room_id`."""
    for e in db.events.values():
        if e.status != "scheduled" or e.id == ignore or not (e.start < end and start < e.end):
            continue
        if (person is not None and _involves(e, person)) or (room_id is not None and e.room_id == room_id):
            return e
    return None


@env.tool(kind="read")
def list_events(db: CalendarDB, day: date, person: str | None = None) -> list[Event]:
    """List the scheduled (not cancelled) events starting on a day, earliest first.

    Args:
        day: The day (YYYY-MM-DD).
        person: Only events this person organizes or attends (email address).
    """
    who = _email(person) if person is not None else None
    found = [
        e
        for e in db.events.values()
        if e.status == "scheduled" and e.start.date() == day and (who is None or _involves(e, who))
    ]
    return sorted(found, key=lambda e: (e.start, e.id))


@env.tool(kind="read")
def find_free_slots(db: CalendarDB, day: date, duration_minutes: int, people: list[str]) -> list[Slot]:
    """Find the free periods of a working day (09:00-18:00) when all the given people are free for long enough.

    Args:
        day: The day (YYYY-MM-DD), today or later.
        duration_minutes: Shortest useful period, in minutes (15-480).
        people: Email addresses of everyone who must be free.
    """
    if not people:
        raise ToolError("people must name at least one email address")
    who = {_email(p) for p in people}
    if duration_minutes < MIN_MINUTES or duration_minutes > MAX_MINUTES:
        raise ToolError(f"duration_minutes must be between {MIN_MINUTES} and {MAX_MINUTES}, got {duration_minutes}")
    if day < db.now().date():
        raise ToolError(f"day {day} is in the past (today is {db.now().date()})")
    cursor = max(datetime.combine(day, WORK_START), db.now())
    day_end = datetime.combine(day, WORK_END)
    busy = sorted(
        (e.start, e.end)
        for e in db.events.values()
        if e.status == "scheduled" and e.start < day_end and e.end > cursor and any(_involves(e, p) for p in who)
    )
    slots: list[Slot] = []
    for b_start, b_end in [*busy, (day_end, day_end)]:
        if b_start > cursor:
            end = min(b_start, day_end)
            minutes = int((end - cursor).total_seconds() // 60)
            if minutes >= duration_minutes:
                slots.append(Slot(start=cursor, end=end, minutes=minutes))
        cursor = max(cursor, b_end)
    return slots


@env.tool(kind="read")
def get_event(db: CalendarDB, event_id: str) -> Event:
    """Get an event by its id: time, organizer, attendees, room and status.

    Args:
        event_id: Id of the event, as returned by list_events or create_event.
    """
    return db.get("events", event_id, "event")


@env.tool(kind="write")
def create_event(
    db: CalendarDB,
    title: str,
    organizer: str,
    start: datetime,
    duration_minutes: int,
    attendees: list[str] | None = None,
) -> Event:
    """Create a meeting in the organizer's calendar; the organizer must be free at that time.

    Args:
        title: Title of the meeting, e.g. "Budget sync".
        organizer: Email address of the organizer.
        start: Start time (YYYY-MM-DDTHH:MM:SS, local time).
        duration_minutes: Length in minutes (15-480).
        attendees: Email addresses of the people invited (the organizer need not be listed).
    """
    if not title.strip():
        raise ToolError("title must not be empty")
    org = _email(organizer, "organizer email")
    guests: list[str] = []
    for a in attendees or []:
        e = _email(a)
        if e != org and e not in guests:
            guests.append(e)
    end = _check_time(db, start, duration_minutes)
    clash = _clash(db, start, end, person=org)
    if clash is not None:
        raise ConflictError(f"{org} is busy then: {clash.id} '{clash.title}' {clash.start:%H:%M}-{clash.end:%H:%M}")
    event = Event(id=db.new_id("EV"), title=title.strip(), organizer=org, start=start, end=end, attendees=guests)
    return db.create("events", event.id, event)


@env.tool(kind="write")
def invite_attendee(db: CalendarDB, event_id: str, email: str) -> Event:
    """Invite a person to an upcoming event; if the event has a room, it must have a seat left for them.

    Args:
        event_id: Id of the event.
        email: Email address of the person to invite.
    """
    event = db.get("events", event_id, "event")
    guest = _email(email)
    _upcoming(db, event)
    if _involves(event, guest):
        raise ConflictError(f"{guest} is already in event {event_id}")
    if event.room_id is not None:
        room = db.get("rooms", event.room_id, "room")
        if len(event.attendees) + 2 > room.capacity:  # + the organizer + the new guest
            raise ConflictError(f"room {room.name} seats {room.capacity} and event {event_id} already fills it")
    return db.update("events", event_id, attendees=[*event.attendees, guest])


@env.tool(kind="write")
def reschedule_event(db: CalendarDB, event_id: str, start: datetime, duration_minutes: int | None = None) -> Event:
    """Move an upcoming event to a new start (optionally a new length); the organizer and its room must be free.

    Args:
        event_id: Id of the event.
        start: New start time (YYYY-MM-DDTHH:MM:SS, local time).
        duration_minutes: New length in minutes (15-480); by default the event keeps its length.
    """
    event = db.get("events", event_id, "event")
    _upcoming(db, event)
    minutes = duration_minutes if duration_minutes is not None else int((event.end - event.start).total_seconds() // 60)
    end = _check_time(db, start, minutes)
    clash = _clash(db, start, end, person=event.organizer, ignore=event_id)
    if clash is not None:
        raise ConflictError(f"{event.organizer} is busy then: {clash.id} '{clash.title}'")
    if event.room_id is not None:
        clash = _clash(db, start, end, room_id=event.room_id, ignore=event_id)
        if clash is not None:
            raise ConflictError(f"room {event.room_id} is booked then by {clash.id} '{clash.title}'")
    return db.update("events", event_id, start=start, end=end)


@env.tool(kind="write")
def cancel_event(db: CalendarDB, event_id: str) -> Event:
    """Cancel an event that has not started yet; its room is released.

    Args:
        event_id: Id of the event.
    """
    event = db.get("events", event_id, "event")
    if event.status == "cancelled":
        raise ConflictError(f"event {event_id} is already cancelled")
    _upcoming(db, event)
    return db.update("events", event_id, status="cancelled")


@env.tool(kind="read")
def list_rooms(db: CalendarDB, min_capacity: int | None = None, equipment: str | None = None) -> list[Room]:
    """List meeting rooms, optionally only those seating enough people or having some equipment.

    Args:
        min_capacity: Fewest seats the room must have.
        equipment: Equipment the room must have, e.g. "projector", "video", "whiteboard".
    """
    return [
        r
        for r in db.rooms.values()
        if (min_capacity is None or r.capacity >= min_capacity)
        and (equipment is None or equipment.strip().lower() in r.equipment)
    ]


@env.tool(kind="write")
def book_meeting_room(db: CalendarDB, event_id: str, room_id: str) -> Event:
    """Book a meeting room for an upcoming event, replacing any room it had; the room must be free and big enough.

    Args:
        event_id: Id of the event.
        room_id: Id of the room, as returned by list_rooms.
    """
    event = db.get("events", event_id, "event")
    room = db.get("rooms", room_id, "room")
    _upcoming(db, event)
    if event.room_id == room_id:
        raise ConflictError(f"event {event_id} already has room {room.name}")
    people = len(event.attendees) + 1
    if people > room.capacity:
        raise ConflictError(f"room {room.name} seats {room.capacity} but event {event_id} has {people} people")
    clash = _clash(db, event.start, event.end, room_id=room_id, ignore=event_id)
    if clash is not None:
        raise ConflictError(
            f"room {room.name} is booked {clash.start:%H:%M}-{clash.end:%H:%M} by {clash.id} '{clash.title}'"
        )
    return db.update("events", event_id, room_id=room_id)
