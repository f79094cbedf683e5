"""Every tool of `hotels`: results, error cases, state transitions."""

from __future__ import annotations

import pytest

from envfactory.env import Session
from envfactory.env.pool import EnvPool
from tests.envs.helpers import fails, ok


@pytest.fixture()
def s(pool: EnvPool) -> Session:
    # strict: every call also diffs full dumps, proving the tools write only through CRUD helpers
    return pool.get("hotels").session("default", strict=True)


def test_search_hotels_filters(s: Session) -> None:
    assert {h["id"] for h in ok(s, "search_hotels", city="lisbon")} == {"HT-LIS-01", "HT-LIS-02", "HT-LIS-03"}
    assert [h["id"] for h in ok(s, "search_hotels", city="Lisbon", max_price=100)] == ["HT-LIS-02"]
    assert [h["id"] for h in ok(s, "search_hotels", city="Lisbon", min_stars=5)] == ["HT-LIS-03"]
    assert ok(s, "search_hotels", city="Oslo") == []
    fails(s, "search_hotels", "invalid_arguments")  # city is required
    fails(s, "search_hotels", "invalid_arguments", city="Lisbon", min_stars="five")


def test_get_hotel(s: Session) -> None:
    assert ok(s, "get_hotel", hotel_id="HT-MAD-01")["amenities"] == ["wifi", "gym"]
    fails(s, "get_hotel", "not_found", hotel_id="HT-XXX")


def test_check_availability(s: Session) -> None:
    a = ok(s, "check_availability", hotel_id="HT-LIS-02", check_in="2026-02-11", nights=2)
    assert a["rooms_free"] == 0 and a["total_price"] == 170.0  # the one room is booked by BK-0001
    assert ok(s, "check_availability", hotel_id="HT-LIS-02", check_in="2026-02-13", nights=2)["rooms_free"] == 1
    fails(s, "check_availability", "tool_error", hotel_id="HT-LIS-02", check_in="2025-12-01", nights=1)
    fails(s, "check_availability", "tool_error", hotel_id="HT-LIS-02", check_in="2026-02-13", nights=0)
    fails(s, "check_availability", "invalid_arguments", hotel_id="HT-LIS-02", check_in="next monday", nights=1)


def test_book_room_then_get_and_list(s: Session) -> None:
    rec = s.call(
        "book_room", {"hotel_id": "HT-LIS-01", "guest_name": "Ana Costa", "check_in": "2026-02-01", "nights": 3}
    )
    assert rec.ok and rec.result["id"] == "BK-0002" and rec.result["total_price"] == 360.0
    assert rec.diff.added == ["bookings.BK-0002"] and rec.diff.changed == ["counters.BK"]
    assert [c.op for c in rec.changes] == ["counter", "create"]
    assert ok(s, "get_booking", booking_id="BK-0002")["guest_name"] == "Ana Costa"
    assert [b["id"] for b in ok(s, "list_bookings", guest_name="ana costa")] == ["BK-0002"]


def test_book_room_errors(s: Session) -> None:
    fails(s, "book_room", "not_found", hotel_id="HT-NOPE", guest_name="A", check_in="2026-02-01", nights=1)
    fails(s, "book_room", "conflict", hotel_id="HT-LIS-02", guest_name="A", check_in="2026-02-11", nights=1)
    fails(s, "book_room", "tool_error", hotel_id="HT-LIS-01", guest_name="  ", check_in="2026-02-01", nights=1)
    fails(s, "book_room", "invalid_arguments", hotel_id="HT-LIS-01", check_in="2026-02-01", nights=1)


def test_full_hotel_conflicts(s: Session) -> None:
    for name in ("A", "B"):
        ok(s, "book_room", hotel_id="HT-LIS-01", guest_name=name, check_in="2026-05-01", nights=2)
    fails(s, "book_room", "conflict", hotel_id="HT-LIS-01", guest_name="C", check_in="2026-05-02", nights=1)


def test_modify_booking(s: Session) -> None:
    rec = s.call("modify_booking", {"booking_id": "BK-0001", "nights": 2})
    assert rec.ok and rec.result["total_price"] == 170.0
    assert rec.diff.changed == ["bookings.BK-0001.nights", "bookings.BK-0001.total_price"]
    fails(s, "modify_booking", "not_found", booking_id="BK-0099", nights=2)
    fails(s, "modify_booking", "tool_error", booking_id="BK-0001", nights=45)


def test_cancel_booking_chain(s: Session) -> None:
    hotels = ok(s, "search_hotels", city="Porto")
    booking = ok(s, "book_room", hotel_id=hotels[0]["id"], guest_name="Rui", check_in="2026-06-01", nights=1)
    rec = s.call("cancel_booking", {"booking_id": booking["id"]})
    assert rec.ok and rec.result["status"] == "cancelled"
    assert rec.diff.changed == [f"bookings.{booking['id']}.status"]
    fails(s, "cancel_booking", "conflict", booking_id=booking["id"])
    fails(s, "modify_booking", "conflict", booking_id=booking["id"], nights=2)
    fails(s, "cancel_booking", "not_found", booking_id="BK-4242")
