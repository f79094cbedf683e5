"""Every tool of `flights`: results, error cases, state transitions."""

from __future__ import annotations

import pytest

from envfactory.env import Session
from envfactory.env.pool import EnvPool
from tests.envs.helpers import fails, ok

# default scenario: now is 2026-03-02 08:00; FL-1001 leaves 2026-03-08 07:30 (143.5 h ahead),
# FL-1003 2026-03-11 07:30 (215.5 h), FL-1005 2026-03-03 06:00 (22 h), FL-1007 left yesterday.


@pytest.fixture()
def s(pool: EnvPool) -> Session:
    # strict: every call also diffs full dumps, proving the tools write only through CRUD helpers
    return pool.get("flights").session("default", strict=True)


def _session_at(pool: EnvPool, clock: str) -> Session:
    env = pool.get("flights")
    data = env.scenario("default")
    data["clock"] = clock
    return env.session(data, strict=True)


def test_scenarios_load(pool: EnvPool) -> None:
    env = pool.get("flights")
    assert env.scenario_names() == ["default", "holiday_rush"]
    rush = env.session("holiday_rush", strict=True)
    assert [f["id"] for f in ok(rush, "search_flights", origin="FRA", destination="BCN", date="2026-08-01")] == [
        "FL-2001",
        "FL-2002",
    ]


def test_search_flights_filters(s: Session) -> None:
    found = ok(s, "search_flights", origin="LIS", destination="MAD", date="2026-03-08")
    assert [f["id"] for f in found] == ["FL-1001", "FL-1002"]  # earliest first
    assert found[0]["fares"] == {"economy": 89.0, "business": 240.0}
    assert found[1]["seats_available"] == {"economy": 0, "business": 2}
    assert set(found[0]) == {
        "id",
        "flight_number",
        "origin",
        "destination",
        "departure",
        "arrival",
        "fares",
        "seats_available",
    }
    economy = ok(s, "search_flights", origin="lis", destination="mad", date="2026-03-08", cabin="economy")
    assert [f["id"] for f in economy] == ["FL-1001"]  # IB3101 has no economy seat left
    assert [f["id"] for f in ok(s, "search_flights", origin="MAD", destination="LIS", date="2026-03-14")] == ["FL-1004"]
    assert ok(s, "search_flights", origin="LIS", destination="LHR", date="2026-03-04") == []
    fails(s, "search_flights", "tool_error", origin="Lisbon", destination="MAD", date="2026-03-08")
    fails(s, "search_flights", "tool_error", origin="LIS", destination="lis", date="2026-03-08")
    fails(s, "search_flights", "invalid_arguments", origin="LIS", destination="MAD", date="next friday")
    fails(s, "search_flights", "invalid_arguments", origin="LIS", destination="MAD", date="2026-03-08", cabin="first")
    fails(s, "search_flights", "invalid_arguments", origin="LIS", date="2026-03-08")


def test_get_flight(s: Session) -> None:
    f = ok(s, "get_flight", flight_id="FL-1006")
    assert (f["airline"], f["flight_number"], f["aircraft"]) == ("British Airways", "BA501", "Airbus A320")
    assert f["departure"] == "2026-03-20T09:10:00" and f["seats_available"] == {"economy": 6, "business": 3}
    fails(s, "get_flight", "not_found", flight_id="FL-9999")


def test_book_flight_takes_a_seat(s: Session) -> None:
    rec = s.call("book_flight", {"flight_id": "FL-1003", "passenger_name": " Ana Costa ", "cabin": "economy"})
    assert rec.ok, rec.error
    assert rec.result == {
        "id": "FB-0006",
        "flight_id": "FL-1003",
        "passenger_name": "Ana Costa",
        "cabin": "economy",
        "fare": 79.0,
        "seat": None,
        "bags": 0,
        "baggage_fees": 0.0,
        "booked_at": "2026-03-02T08:00:00",
        "status": "confirmed",
        "refund": None,
    }
    assert rec.diff.added == ["bookings.FB-0006"]
    assert rec.diff.changed == ["counters.FB", "flights.FL-1003.seats_available.economy"]
    assert [c.op for c in rec.changes] == ["update", "counter", "create"]
    assert ok(s, "get_flight", flight_id="FL-1003")["seats_available"] == {"economy": 4, "business": 2}
    # the cabin defaults to economy; a cancelled booking (FB-0003) does not block a new one
    again = ok(s, "book_flight", flight_id="FL-1003", passenger_name="John Park")
    assert again["id"] == "FB-0007" and again["cabin"] == "economy"
    assert s.dump()["flights"]["FL-1003"]["seats_available"]["economy"] == 3


def test_book_flight_errors(s: Session) -> None:
    fails(s, "book_flight", "not_found", flight_id="FL-0000", passenger_name="Ana Costa")
    fails(s, "book_flight", "conflict", flight_id="FL-1002", passenger_name="Ana Costa", cabin="economy")  # sold out
    fails(s, "book_flight", "conflict", flight_id="FL-1007", passenger_name="Ana Costa")  # departed
    fails(s, "book_flight", "conflict", flight_id="FL-1001", passenger_name="lena hoff", cabin="business")  # FB-0005
    fails(s, "book_flight", "tool_error", flight_id="FL-1003", passenger_name="   ")
    fails(s, "book_flight", "invalid_arguments", flight_id="FL-1003", passenger_name="Ana Costa", cabin="first")
    fails(s, "book_flight", "invalid_arguments", flight_id="FL-1003")


def test_book_last_seat_then_sold_out(s: Session) -> None:
    ok(s, "book_flight", flight_id="FL-1001", passenger_name="Ana Costa", cabin="business")
    assert ok(s, "get_flight", flight_id="FL-1001")["seats_available"] == {"economy": 3, "business": 0}
    fails(s, "book_flight", "conflict", flight_id="FL-1001", passenger_name="Rui Alves", cabin="business")
    assert [
        f["id"] for f in ok(s, "search_flights", origin="LIS", destination="MAD", date="2026-03-08", cabin="business")
    ] == ["FL-1002"]


def test_get_flight_booking(s: Session) -> None:
    b = ok(s, "get_flight_booking", booking_id="FB-0004")
    assert (b["flight_id"], b["seat"], b["bags"], b["baggage_fees"]) == ("FL-1006", "21F", 2, 80.0)
    fails(s, "get_flight_booking", "not_found", booking_id="FB-0099")


def test_list_passenger_bookings(s: Session) -> None:
    assert [b["id"] for b in ok(s, "list_passenger_bookings", passenger_name="maria silva")] == ["FB-0001", "FB-0002"]
    john = ok(s, "list_passenger_bookings", passenger_name="John Park ")
    assert [(b["id"], b["status"]) for b in john] == [("FB-0003", "cancelled"), ("FB-0004", "confirmed")]
    assert ok(s, "list_passenger_bookings", passenger_name="Nobody Here") == []
    fails(s, "list_passenger_bookings", "invalid_arguments")


def test_select_seat(s: Session) -> None:
    rec = s.call("select_seat", {"booking_id": "FB-0005", "seat": " 14a"})
    assert rec.ok and rec.result["seat"] == "14A"
    assert rec.diff.changed == ["bookings.FB-0005.seat"] and not rec.diff.added
    fails(s, "select_seat", "conflict", booking_id="FB-0005", seat="14A")  # already its seat
    fails(s, "select_seat", "tool_error", booking_id="FB-0005", seat="2C")  # a business seat
    fails(s, "select_seat", "tool_error", booking_id="FB-0002", seat="12C")  # an economy seat
    fails(s, "select_seat", "tool_error", booking_id="FB-0005", seat="9A")  # no row 9
    fails(s, "select_seat", "tool_error", booking_id="FB-0005", seat="12G")  # no seat G
    fails(s, "select_seat", "tool_error", booking_id="FB-0005", seat="window")
    fails(s, "select_seat", "conflict", booking_id="FB-0003", seat="12A")  # cancelled
    fails(s, "select_seat", "not_found", booking_id="FB-0099", seat="12A")
    fails(s, "select_seat", "invalid_arguments", booking_id="FB-0005", seat=14)
    assert s.dump()["bookings"]["FB-0005"]["seat"] == "14A"


def test_select_seat_taken(s: Session) -> None:
    new = ok(s, "book_flight", flight_id="FL-1001", passenger_name="Ana Costa", cabin="business")
    fails(s, "select_seat", "conflict", booking_id=new["id"], seat="2A")  # FB-0002's seat
    assert ok(s, "select_seat", booking_id=new["id"], seat="2C")["seat"] == "2C"
    eco = ok(s, "book_flight", flight_id="FL-1001", passenger_name="Rui Alves")
    fails(s, "select_seat", "conflict", booking_id=eco["id"], seat="12B")  # FB-0005's seat


def test_add_baggage_economy(s: Session) -> None:
    rec = s.call("add_baggage", {"booking_id": "FB-0005", "bags": 2})
    assert rec.ok and (rec.result["bags"], rec.result["baggage_fees"]) == (2, 80.0)
    assert rec.diff.changed == ["bookings.FB-0005.baggage_fees", "bookings.FB-0005.bags"]
    fails(s, "add_baggage", "conflict", booking_id="FB-0005", bags=2)  # 4 bags in all
    b = ok(s, "add_baggage", booking_id="FB-0005")  # one bag by default
    assert (b["bags"], b["baggage_fees"]) == (3, 120.0)


def test_add_baggage_business_first_two_free(s: Session) -> None:
    rec = s.call("add_baggage", {"booking_id": "FB-0002", "bags": 2})
    assert rec.ok and (rec.result["bags"], rec.result["baggage_fees"]) == (2, 0.0)
    assert rec.diff.changed == ["bookings.FB-0002.bags"]  # no fee: the fee field is unchanged
    b = ok(s, "add_baggage", booking_id="FB-0002", bags=1)
    assert (b["bags"], b["baggage_fees"]) == (3, 40.0)


def test_add_baggage_errors(s: Session) -> None:
    fails(s, "add_baggage", "tool_error", booking_id="FB-0005", bags=0)
    fails(s, "add_baggage", "tool_error", booking_id="FB-0005", bags=4)
    fails(s, "add_baggage", "conflict", booking_id="FB-0004", bags=2)  # has 2 already
    fails(s, "add_baggage", "conflict", booking_id="FB-0003", bags=1)  # cancelled
    fails(s, "add_baggage", "not_found", booking_id="FB-0099", bags=1)
    fails(s, "add_baggage", "invalid_arguments", booking_id="FB-0005", bags="two")


def test_cancel_refund_rules(s: Session) -> None:
    # economy 18 days ahead: fare and bags back in full (135 + 80)
    rec = s.call("cancel_flight_booking", {"booking_id": "FB-0004"})
    assert rec.ok and rec.result["status"] == "cancelled" and rec.result["refund"] == 215.0
    assert rec.diff.changed == [
        "bookings.FB-0004.refund",
        "bookings.FB-0004.status",
        "flights.FL-1006.seats_available.economy",
    ]
    assert s.dump()["flights"]["FL-1006"]["seats_available"] == {"economy": 7, "business": 3}
    # economy 143.5 h ahead: half the fare
    assert ok(s, "cancel_flight_booking", booking_id="FB-0005")["refund"] == 44.5
    # economy 22 h ahead: no fare back, the 40.00 bag fee is
    assert ok(s, "cancel_flight_booking", booking_id="FB-0001")["refund"] == 40.0
    # business: always in full
    assert ok(s, "cancel_flight_booking", booking_id="FB-0002")["refund"] == 240.0
    assert s.dump()["flights"]["FL-1001"]["seats_available"] == {"economy": 4, "business": 2}


def test_cancel_errors(s: Session) -> None:
    fails(s, "cancel_flight_booking", "conflict", booking_id="FB-0003")  # already cancelled
    fails(s, "cancel_flight_booking", "not_found", booking_id="FB-0099")
    fails(s, "cancel_flight_booking", "invalid_arguments")


def test_departed_booking_is_frozen(pool: EnvPool) -> None:
    s = _session_at(pool, "2026-03-03T07:00:00")  # FL-1005 (FB-0001) left at 06:00
    fails(s, "cancel_flight_booking", "conflict", booking_id="FB-0001")
    fails(s, "select_seat", "conflict", booking_id="FB-0001", seat="15A")
    fails(s, "add_baggage", "conflict", booking_id="FB-0001", bags=1)
    # a day later FL-1001 (FB-0005) is 120.5 h ahead: still half the economy fare
    assert ok(s, "cancel_flight_booking", booking_id="FB-0005")["refund"] == 44.5


def test_refund_boundary_at_24_hours(pool: EnvPool) -> None:
    s = _session_at(pool, "2026-03-07T07:30:00")  # exactly 24 h before FL-1001
    assert ok(s, "cancel_flight_booking", booking_id="FB-0005")["refund"] == 44.5
    s = _session_at(pool, "2026-03-07T07:31:00")
    assert ok(s, "cancel_flight_booking", booking_id="FB-0005")["refund"] == 0.0


def test_booking_chain(s: Session) -> None:
    flights = ok(s, "search_flights", origin="LIS", destination="MAD", date="2026-03-11", cabin="economy")
    booking = ok(s, "book_flight", flight_id=flights[0]["id"], passenger_name="Ana Costa")
    assert booking["flight_id"] == "FL-1003" and booking["fare"] == 79.0
    ok(s, "select_seat", booking_id=booking["id"], seat="11F")
    ok(s, "add_baggage", booking_id=booking["id"], bags=1)
    got = ok(s, "get_flight_booking", booking_id=booking["id"])
    assert (got["seat"], got["bags"], got["baggage_fees"]) == ("11F", 1, 40.0)
    cancelled = ok(s, "cancel_flight_booking", booking_id=booking["id"])
    assert cancelled["refund"] == 119.0  # 215.5 h ahead: 79 + 40 back
    assert ok(s, "get_flight", flight_id="FL-1003")["seats_available"]["economy"] == 5
    assert [b["status"] for b in ok(s, "list_passenger_bookings", passenger_name="Ana Costa")] == ["cancelled"]


def test_cancel_frees_the_seat_chain(s: Session) -> None:
    lena = ok(s, "list_passenger_bookings", passenger_name="Lena Hoff")[0]
    assert ok(s, "get_flight", flight_id=lena["flight_id"])["flight_number"] == "TP1026"
    ok(s, "cancel_flight_booking", booking_id=lena["id"])
    new = ok(s, "book_flight", flight_id=lena["flight_id"], passenger_name="Rui Alves")
    assert ok(s, "select_seat", booking_id=new["id"], seat="12B")["seat"] == "12B"  # Lena's old seat
    # the cancelled booking can be rebooked by its passenger
    assert ok(s, "book_flight", flight_id="FL-1001", passenger_name="Lena Hoff")["id"] == "FB-0007"
