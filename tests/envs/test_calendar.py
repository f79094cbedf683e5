"""Every tool of `calendar`: results, error cases, state transitions."""

from __future__ import annotations

import pytest

from envfactory.env import Session
from envfactory.env.pool import EnvPool
from tests.envs.helpers import fails, ok

ANA, BEN, CHLOE, DEV, ELI = (f"{n}@acme.io" for n in ("ana", "ben", "chloe", "dev", "eli"))


@pytest.fixture()
def s(pool: EnvPool) -> Session:
    # strict: every call also diffs full dumps, proving the tools write only through CRUD helpers
    return pool.get("calendar").session("default", strict=True)


def spans(slots: list[dict]) -> list[tuple[str, str, int]]:
    return [(x["start"][11:16], x["end"][11:16], x["minutes"]) for x in slots]


def test_list_events(s: Session) -> None:
    # EV-0005 on the same day is cancelled
    assert [e["id"] for e in ok(s, "list_events", day="2026-03-10")] == ["EV-0001", "EV-0002", "EV-0003"]
    assert [e["id"] for e in ok(s, "list_events", day="2026-03-10", person="DEV@acme.io")] == ["EV-0003"]
    assert [e["id"] for e in ok(s, "list_events", day="2026-03-11")] == ["EV-0004"]
    assert [e["id"] for e in ok(s, "list_events", day="2026-03-06")] == ["EV-0006"]
    assert ok(s, "list_events", day="2026-03-12") == []
    fails(s, "list_events", "tool_error", day="2026-03-10", person="ana")
    fails(s, "list_events", "invalid_arguments", day="tomorrow")


def test_find_free_slots(s: Session) -> None:
    # ana and ben are busy 09:00-10:00 (EV-0001), ben 11:00-11:30 (EV-0002), ana 14:00-15:30 (EV-0003)
    both = ok(s, "find_free_slots", day="2026-03-10", duration_minutes=30, people=[ANA, BEN])
    assert spans(both) == [("10:00", "11:00", 60), ("11:30", "14:00", 150), ("15:30", "18:00", 150)]
    assert both[0]["start"] == "2026-03-10T10:00:00"
    long = ok(s, "find_free_slots", day="2026-03-10", duration_minutes=90, people=[ANA, BEN])
    assert spans(long) == [("11:30", "14:00", 150), ("15:30", "18:00", 150)]
    # eli's only event that day (EV-0005) is cancelled
    assert spans(ok(s, "find_free_slots", day="2026-03-10", duration_minutes=60, people=[ELI])) == [
        ("09:00", "18:00", 540)
    ]


def test_find_free_slots_errors(s: Session) -> None:
    fails(s, "find_free_slots", "tool_error", day="2026-03-10", duration_minutes=30, people=[])
    fails(s, "find_free_slots", "tool_error", day="2026-03-10", duration_minutes=10, people=[ANA])
    fails(s, "find_free_slots", "tool_error", day="2026-03-06", duration_minutes=30, people=[ANA])  # past
    fails(s, "find_free_slots", "tool_error", day="2026-03-10", duration_minutes=30, people=["ana"])
    fails(s, "find_free_slots", "invalid_arguments", day="2026-03-10", duration_minutes=30)
    fails(s, "find_free_slots", "invalid_arguments", day="2026-03-10", duration_minutes=30, people=ANA)


def test_find_free_slots_today_starts_now(pool: EnvPool) -> None:
    s = pool.get("calendar").session("quarter_planning", strict=True)
    # now is 13:15; hana's 10:00 debrief is over, the kickoff is 15:00-16:30, the 16:00 review is cancelled
    slots = ok(s, "find_free_slots", day="2026-06-29", duration_minutes=30, people=["hana@orbit.dev"])
    assert spans(slots) == [("13:15", "15:00", 105), ("16:30", "18:00", 90)]


def test_get_event(s: Session) -> None:
    e = ok(s, "get_event", event_id="EV-0004")
    assert (e["organizer"], e["attendees"], e["room_id"], e["end"]) == (DEV, [ELI], "RM-B2", "2026-03-11T11:00:00")
    assert ok(s, "get_event", event_id="EV-0005")["status"] == "cancelled"
    fails(s, "get_event", "not_found", event_id="EV-9999")


def test_create_event(s: Session) -> None:
    rec = s.call(
        "create_event",
        {
            "title": "Budget sync",
            "organizer": "Ana@Acme.io",
            "start": "2026-03-10T10:00:00",
            "duration_minutes": 60,
            "attendees": [BEN, ANA, "BEN@acme.io"],  # the organizer and duplicates are dropped
        },
    )
    assert rec.ok and rec.result == {
        "id": "EV-0007",
        "title": "Budget sync",
        "organizer": ANA,
        "start": "2026-03-10T10:00:00",
        "end": "2026-03-10T11:00:00",
        "attendees": [BEN],
        "room_id": None,
        "status": "scheduled",
    }
    assert rec.diff.added == ["events.EV-0007"] and rec.diff.changed == ["counters.EV"]
    assert [e["id"] for e in ok(s, "list_events", day="2026-03-10", person=ANA)] == ["EV-0001", "EV-0007", "EV-0003"]
    # ending exactly when EV-0003 starts is no clash
    assert ok(s, "create_event", title="Prep", organizer=ANA, start="2026-03-10T13:00:00", duration_minutes=60)[
        "id"
    ] == ("EV-0008")


def test_create_event_errors(s: Session) -> None:
    ev = {"title": "Sync", "organizer": ANA, "duration_minutes": 30}
    fails(s, "create_event", "conflict", **ev, start="2026-03-10T09:30:00")  # EV-0001 09:00-10:00
    fails(s, "create_event", "conflict", title="Sync", organizer=ANA, start="2026-03-10T13:30:00", duration_minutes=60)
    fails(s, "create_event", "tool_error", **{**ev, "title": "  "}, start="2026-03-10T10:00:00")
    fails(s, "create_event", "tool_error", **{**ev, "organizer": "ana"}, start="2026-03-10T10:00:00")
    fails(s, "create_event", "tool_error", **ev, start="2026-03-10T10:00:00", attendees=["bob"])
    fails(s, "create_event", "tool_error", **{**ev, "duration_minutes": 10}, start="2026-03-10T10:00:00")
    fails(s, "create_event", "tool_error", **{**ev, "duration_minutes": 481}, start="2026-03-10T10:00:00")
    fails(s, "create_event", "tool_error", **ev, start="2026-03-09T07:00:00")  # now is 08:00
    fails(s, "create_event", "invalid_arguments", **ev, start="2026-03-10T10:00:00+01:00")  # local times only
    fails(s, "create_event", "invalid_arguments", **ev, start="tomorrow at 10")
    fails(s, "create_event", "invalid_arguments", title="Sync", organizer=ANA, start="2026-03-10T10:00:00")


def test_invite_attendee(s: Session) -> None:
    rec = s.call("invite_attendee", {"event_id": "EV-0001", "email": "Dev@acme.io"})
    assert rec.ok and rec.result["attendees"] == [BEN, CHLOE, DEV]
    assert rec.diff.added == ["events.EV-0001.attendees[2]"] and not rec.diff.changed
    fails(s, "invite_attendee", "conflict", event_id="EV-0001", email=BEN)  # already attends
    fails(s, "invite_attendee", "conflict", event_id="EV-0001", email=ANA)  # the organizer
    fails(s, "invite_attendee", "conflict", event_id="EV-0002", email=DEV)  # room Dune seats 2: ben + chloe
    fails(s, "invite_attendee", "conflict", event_id="EV-0005", email=DEV)  # cancelled
    fails(s, "invite_attendee", "conflict", event_id="EV-0006", email=DEV)  # took place on 2026-03-06
    fails(s, "invite_attendee", "tool_error", event_id="EV-0001", email="dev")
    fails(s, "invite_attendee", "not_found", event_id="EV-9999", email=DEV)


def test_reschedule_event(s: Session) -> None:
    rec = s.call("reschedule_event", {"event_id": "EV-0002", "start": "2026-03-10T14:00:00"})
    assert rec.ok and (rec.result["start"], rec.result["end"]) == ("2026-03-10T14:00:00", "2026-03-10T14:30:00")
    assert rec.diff.changed == ["events.EV-0002.end", "events.EV-0002.start"]
    rec = s.call("reschedule_event", {"event_id": "EV-0002", "start": "2026-03-10T16:00:00", "duration_minutes": 45})
    assert rec.ok and rec.result["end"] == "2026-03-10T16:45:00" and rec.result["room_id"] == "RM-D1"
    # overlapping its own old time is fine
    assert ok(s, "reschedule_event", event_id="EV-0001", start="2026-03-10T09:30:00")["end"] == "2026-03-10T10:30:00"


def test_reschedule_event_errors(s: Session) -> None:
    fails(s, "reschedule_event", "conflict", event_id="EV-0001", start="2026-03-10T14:30:00")  # ana in EV-0003
    # ana is free on the 11th, but room Boreal has EV-0004 10:00-11:00
    fails(s, "reschedule_event", "conflict", event_id="EV-0001", start="2026-03-11T10:30:00")
    fails(s, "reschedule_event", "conflict", event_id="EV-0005", start="2026-03-12T10:00:00")  # cancelled
    fails(s, "reschedule_event", "conflict", event_id="EV-0006", start="2026-03-12T10:00:00")  # in the past
    fails(s, "reschedule_event", "tool_error", event_id="EV-0001", start="2026-03-09T07:00:00")
    fails(s, "reschedule_event", "tool_error", event_id="EV-0001", start="2026-03-12T10:00:00", duration_minutes=5)
    fails(s, "reschedule_event", "not_found", event_id="EV-9999", start="2026-03-12T10:00:00")
    fails(s, "reschedule_event", "invalid_arguments", event_id="EV-0001")


def test_cancel_event(s: Session) -> None:
    rec = s.call("cancel_event", {"event_id": "EV-0003"})
    assert rec.ok and rec.result["status"] == "cancelled"
    assert rec.diff.changed == ["events.EV-0003.status"]
    assert [e["id"] for e in ok(s, "list_events", day="2026-03-10")] == ["EV-0001", "EV-0002"]
    fails(s, "cancel_event", "conflict", event_id="EV-0003")
    fails(s, "cancel_event", "conflict", event_id="EV-0005")
    fails(s, "cancel_event", "conflict", event_id="EV-0006")  # already took place
    fails(s, "cancel_event", "not_found", event_id="EV-9999")


def test_list_rooms(s: Session) -> None:
    assert [r["id"] for r in ok(s, "list_rooms")] == ["RM-A1", "RM-B2", "RM-C3", "RM-D1"]
    assert [r["id"] for r in ok(s, "list_rooms", min_capacity=5)] == ["RM-B2", "RM-C3"]
    assert [r["id"] for r in ok(s, "list_rooms", equipment="Video")] == ["RM-B2", "RM-C3"]
    assert ok(s, "list_rooms", min_capacity=10, equipment="video") == [
        {"id": "RM-C3", "name": "Cosmos", "floor": 3, "capacity": 16, "equipment": ["projector", "video", "whiteboard"]}
    ]
    assert ok(s, "list_rooms", equipment="stage") == []
    fails(s, "list_rooms", "invalid_arguments", min_capacity="five")


def test_book_meeting_room(s: Session) -> None:
    rec = s.call("book_meeting_room", {"event_id": "EV-0004", "room_id": "RM-A1"})
    assert rec.ok and rec.result["room_id"] == "RM-A1"
    assert rec.diff.changed == ["events.EV-0004.room_id"]
    # Boreal is free again on the 11th at 10:00, so EV-0001 can move there now
    assert ok(s, "reschedule_event", event_id="EV-0001", start="2026-03-11T10:30:00")["room_id"] == "RM-B2"


def test_book_meeting_room_conflicts(s: Session) -> None:
    fails(s, "book_meeting_room", "conflict", event_id="EV-0003", room_id="RM-D1")  # 3 people, 2 seats
    fails(s, "book_meeting_room", "conflict", event_id="EV-0001", room_id="RM-B2")  # already its room
    fails(s, "book_meeting_room", "conflict", event_id="EV-0005", room_id="RM-C3")  # cancelled
    fails(s, "book_meeting_room", "conflict", event_id="EV-0006", room_id="RM-C3")  # in the past
    fails(s, "book_meeting_room", "not_found", event_id="EV-9999", room_id="RM-A1")
    fails(s, "book_meeting_room", "not_found", event_id="EV-0004", room_id="RM-Z9")
    late = ok(s, "create_event", title="Catch-up", organizer=ELI, start="2026-03-10T11:00:00", duration_minutes=30)
    fails(s, "book_meeting_room", "conflict", event_id=late["id"], room_id="RM-D1")  # EV-0002 11:00-11:30
    assert ok(s, "book_meeting_room", event_id=late["id"], room_id="RM-A1")["room_id"] == "RM-A1"
    # Atlas at 16:00 was held by EV-0005, which is cancelled
    prep = ok(s, "create_event", title="Prep", organizer=ELI, start="2026-03-10T16:00:00", duration_minutes=60)
    assert ok(s, "book_meeting_room", event_id=prep["id"], room_id="RM-A1")["room_id"] == "RM-A1"


def test_chain_slot_event_room_invites(s: Session) -> None:
    slot = ok(s, "find_free_slots", day="2026-03-10", duration_minutes=60, people=[ANA, BEN, CHLOE])[0]
    assert (slot["start"], slot["end"]) == ("2026-03-10T10:00:00", "2026-03-10T11:00:00")
    event = ok(
        s, "create_event", title="Hiring sync", organizer=ANA, start=slot["start"], duration_minutes=60, attendees=[BEN]
    )
    ok(s, "invite_attendee", event_id=event["id"], email=CHLOE)
    rooms = ok(s, "list_rooms", min_capacity=3)
    assert [r["id"] for r in rooms] == ["RM-A1", "RM-B2", "RM-C3"]
    assert ok(s, "book_meeting_room", event_id=event["id"], room_id=rooms[0]["id"])["room_id"] == "RM-A1"
    ok(s, "invite_attendee", event_id=event["id"], email=DEV)  # 4 people: Atlas is now full
    fails(s, "invite_attendee", "conflict", event_id=event["id"], email=ELI)
    assert spans(ok(s, "find_free_slots", day="2026-03-10", duration_minutes=30, people=[ANA])) == [
        ("11:00", "14:00", 180),
        ("15:30", "18:00", 150),
    ]
    moved = ok(s, "reschedule_event", event_id=event["id"], start="2026-03-10T11:30:00")
    assert (moved["end"], moved["room_id"], moved["attendees"]) == ("2026-03-10T12:30:00", "RM-A1", [BEN, CHLOE, DEV])
    ok(s, "cancel_event", event_id=event["id"])
    assert ok(s, "get_event", event_id=event["id"])["status"] == "cancelled"
    assert [e["id"] for e in ok(s, "list_events", day="2026-03-10", person=CHLOE)] == ["EV-0001", "EV-0002", "EV-0003"]
