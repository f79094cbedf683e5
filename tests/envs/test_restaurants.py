"""Every tool of `restaurants`: results, error cases, state transitions."""

from __future__ import annotations

import pytest

from envfactory.env import Session
from envfactory.env.pool import EnvPool
from tests.envs.helpers import fails, ok


@pytest.fixture()
def s(pool: EnvPool) -> Session:
    # strict: every call also diffs full dumps, proving the tools write only through CRUD helpers
    return pool.get("restaurants").session("default", strict=True)


def test_search_restaurants(s: Session) -> None:
    assert [r["id"] for r in ok(s, "search_restaurants", city="lisbon")] == ["RS-LIS-01", "RS-LIS-02", "RS-LIS-03"]
    assert [r["id"] for r in ok(s, "search_restaurants", city="Lisbon", cuisine="Portuguese")] == ["RS-LIS-01"]
    assert [r["id"] for r in ok(s, "search_restaurants", city="Lisbon", max_price_level=2)] == [
        "RS-LIS-01",
        "RS-LIS-03",
    ]
    assert [r["id"] for r in ok(s, "search_restaurants", city="Lisbon", min_rating=4.6)] == ["RS-LIS-02"]
    assert ok(s, "search_restaurants", city="Lisbon", cuisine="vegetarian") == [
        {
            "id": "RS-LIS-03",
            "name": "Verde Vivo",
            "city": "Lisbon",
            "cuisine": "vegetarian",
            "price_level": 1,
            "rating": 4.2,
        }
    ]
    assert [r["id"] for r in ok(s, "search_restaurants", city="Porto", cuisine="portuguese")] == ["RS-POR-01"]
    assert ok(s, "search_restaurants", city="Oslo") == []
    fails(s, "search_restaurants", "invalid_arguments")
    fails(s, "search_restaurants", "invalid_arguments", city="Lisbon", max_price_level="cheap")


def test_get_menu(s: Session) -> None:
    menu = ok(s, "get_menu", restaurant_id="RS-LIS-02")
    assert [(d["name"], d["course"], d["price"]) for d in menu] == [
        ("Miso Soup", "starter", 5.0),
        ("Vegetable Tempura", "starter", 14.0),
        ("Omakase (11 pieces)", "main", 58.0),
        ("Matcha Ice Cream", "dessert", 7.0),
    ]
    veg = ok(s, "get_menu", restaurant_id="RS-LIS-02", vegetarian_only=True)
    assert [d["name"] for d in veg] == ["Miso Soup", "Vegetable Tempura", "Matcha Ice Cream"]
    assert [d["name"] for d in ok(s, "get_menu", restaurant_id="RS-POR-01", vegetarian_only=True)] == [
        "Port Wine (glass)"
    ]
    fails(s, "get_menu", "not_found", restaurant_id="RS-XXX")


def test_check_table(s: Session) -> None:
    # Taberna do Largo has 3 tables; RV-0002 (19:30) and RV-0006 (20:00) hold two of them for 2 hours
    t = ok(s, "check_table", restaurant_id="RS-LIS-01", date="2026-03-14", time="20:00", party_size=2)
    assert t == {
        "restaurant_id": "RS-LIS-01",
        "date": "2026-03-14",
        "time": "20:00:00",
        "party_size": 2,
        "tables_free": 1,
        "available": True,
    }
    free = {
        at: ok(s, "check_table", restaurant_id="RS-LIS-01", date="2026-03-14", time=at, party_size=2)["tables_free"]
        for at in ("17:30", "18:00", "22:00")
    }
    assert free == {"17:30": 3, "18:00": 2, "22:00": 3}  # 2 hours apart is no overlap
    # Sakura Alfama has one table, held by RV-0001 on the 20th at 20:00
    full = ok(s, "check_table", restaurant_id="RS-LIS-02", date="2026-03-20", time="21:00", party_size=2)
    assert (full["tables_free"], full["available"]) == (0, False)
    assert ok(s, "check_table", restaurant_id="RS-LIS-02", date="2026-03-20", time="18:00", party_size=2)["available"]


def test_check_table_errors(s: Session) -> None:
    sakura = {"restaurant_id": "RS-LIS-02", "date": "2026-03-20"}
    fails(s, "check_table", "tool_error", **sakura, time="17:30", party_size=2)  # opens at 18:00
    fails(s, "check_table", "tool_error", **sakura, time="23:00", party_size=2)  # last seating 22:30
    fails(s, "check_table", "tool_error", **sakura, time="19:15", party_size=2)  # not on the half hour
    fails(s, "check_table", "tool_error", **sakura, time="19:00:30", party_size=2)
    fails(s, "check_table", "invalid_arguments", **sakura, time="19:00+01:00", party_size=2)  # local times only
    fails(s, "check_table", "tool_error", **sakura, time="19:00", party_size=5)  # parties of up to 4
    fails(s, "check_table", "tool_error", **sakura, time="19:00", party_size=0)
    fails(s, "check_table", "tool_error", restaurant_id="RS-LIS-02", date="2026-03-13", time="19:00", party_size=2)
    fails(s, "check_table", "tool_error", restaurant_id="RS-LIS-03", date="2026-03-14", time="11:30", party_size=2)
    fails(s, "check_table", "not_found", restaurant_id="RS-XXX", date="2026-03-20", time="19:00", party_size=2)
    fails(s, "check_table", "invalid_arguments", **sakura, time="7pm", party_size=2)


def test_reserve_table(s: Session) -> None:
    args = {"restaurant_id": "RS-LIS-01", "date": "2026-03-14", "time": "20:00", "party_size": 2}
    rec = s.call("reserve_table", {**args, "guest_name": "Ana Costa", "special_requests": " window table "})
    assert rec.ok and rec.result == {
        "id": "RV-0007",
        "restaurant_id": "RS-LIS-01",
        "guest_name": "Ana Costa",
        "party_size": 2,
        "date": "2026-03-14",
        "time": "20:00:00",
        "special_requests": "window table",
        "status": "confirmed",
    }
    assert rec.diff.added == ["reservations.RV-0007"] and rec.diff.changed == ["counters.RV"]
    assert ok(s, "check_table", **args)["tables_free"] == 0
    fails(s, "reserve_table", "conflict", **args, guest_name="Rui Santos")
    assert ok(s, "get_reservation", reservation_id="RV-0007") == rec.result


def test_reserve_table_errors(s: Session) -> None:
    slot = {"date": "2026-03-20", "time": "13:00", "party_size": 2, "guest_name": "Rui Santos"}
    fails(s, "reserve_table", "not_found", restaurant_id="RS-XXX", **slot)
    fails(s, "reserve_table", "tool_error", restaurant_id="RS-LIS-01", **{**slot, "guest_name": "  "})
    fails(s, "reserve_table", "tool_error", restaurant_id="RS-LIS-01", **{**slot, "party_size": 7})
    fails(s, "reserve_table", "tool_error", restaurant_id="RS-LIS-01", **{**slot, "time": "12:15"})
    fails(s, "reserve_table", "tool_error", restaurant_id="RS-LIS-01", **{**slot, "date": "2026-03-01"})
    fails(s, "reserve_table", "invalid_arguments", restaurant_id="RS-LIS-01", date="2026-03-20", time="13:00")


def test_get_and_list_reservations(s: Session) -> None:
    r = ok(s, "get_reservation", reservation_id="RV-0001")
    assert (r["guest_name"], r["date"], r["time"], r["special_requests"]) == (
        "Maria Silva",
        "2026-03-20",
        "20:00:00",
        "counter seats",
    )
    fails(s, "get_reservation", "not_found", reservation_id="RV-9999")
    assert [b["id"] for b in ok(s, "list_reservations", guest_name="maria silva")] == ["RV-0001", "RV-0003"]
    assert [b["id"] for b in ok(s, "list_reservations", guest_name="Aiko Tanaka")] == ["RV-0004"]  # cancelled too
    assert ok(s, "list_reservations", guest_name="Nobody Here") == []


def test_modify_reservation(s: Session) -> None:
    rec = s.call("modify_reservation", {"reservation_id": "RV-0001", "time": "18:00"})
    assert rec.ok and rec.result["time"] == "18:00:00" and rec.result["date"] == "2026-03-20"
    assert rec.diff.changed == ["reservations.RV-0001.time"]
    rec = s.call("modify_reservation", {"reservation_id": "RV-0001", "party_size": 4})
    assert rec.ok and rec.diff.changed == ["reservations.RV-0001.party_size"]
    # RV-0006 moves to 19:00: only RV-0002 (19:30) overlaps, 2 of 3 tables stay free
    rec = s.call("modify_reservation", {"reservation_id": "RV-0006", "time": "19:00", "party_size": 3})
    assert rec.ok and rec.diff.changed == ["reservations.RV-0006.party_size", "reservations.RV-0006.time"]


def test_modify_reservation_errors(s: Session) -> None:
    fails(s, "modify_reservation", "tool_error", reservation_id="RV-0001")  # nothing to change
    fails(s, "modify_reservation", "tool_error", reservation_id="RV-0001", party_size=2)  # the same size
    fails(s, "modify_reservation", "tool_error", reservation_id="RV-0001", party_size=5)  # Sakura seats up to 4
    fails(s, "modify_reservation", "tool_error", reservation_id="RV-0001", time="17:00")
    fails(s, "modify_reservation", "conflict", reservation_id="RV-0004", party_size=3)  # cancelled
    fails(s, "modify_reservation", "conflict", reservation_id="RV-0003", party_size=2)  # the visit has passed
    fails(s, "modify_reservation", "not_found", reservation_id="RV-9999", party_size=2)
    fails(s, "modify_reservation", "invalid_arguments", reservation_id="RV-0001", date="next friday")
    taken = ok(
        s, "reserve_table", restaurant_id="RS-LIS-02", guest_name="Rui", date="2026-03-21", time="20:00", party_size=2
    )
    assert taken["id"] == "RV-0007"
    fails(s, "modify_reservation", "conflict", reservation_id="RV-0001", date="2026-03-21")  # Sakura's one table


def test_cancel_reservation(s: Session) -> None:
    rec = s.call("cancel_reservation", {"reservation_id": "RV-0002"})
    assert rec.ok and rec.result["status"] == "cancelled"
    assert rec.diff.changed == ["reservations.RV-0002.status"]
    t = ok(s, "check_table", restaurant_id="RS-LIS-01", date="2026-03-14", time="20:00", party_size=2)
    assert t["tables_free"] == 2  # only RV-0006 is left
    fails(s, "cancel_reservation", "conflict", reservation_id="RV-0002")
    fails(s, "cancel_reservation", "conflict", reservation_id="RV-0004")  # cancelled in the scenario
    fails(s, "cancel_reservation", "conflict", reservation_id="RV-0003")  # in the past
    fails(s, "cancel_reservation", "not_found", reservation_id="RV-9999")


def test_leave_review(s: Session) -> None:
    rec = s.call("leave_review", {"reservation_id": "RV-0003", "rating": 5, "comment": " Best francesinha in town "})
    assert rec.ok and rec.result == {
        "id": "REV-0002",
        "restaurant_id": "RS-POR-01",
        "reservation_id": "RV-0003",
        "guest_name": "Maria Silva",
        "rating": 5,
        "comment": "Best francesinha in town",
        "created_at": "2026-03-14T12:00:00",
    }
    assert rec.diff.added == ["reviews.REV-0002"]
    assert rec.diff.changed == ["counters.REV", "restaurants.RS-POR-01.rating", "restaurants.RS-POR-01.review_count"]
    # 4 reviews averaging 4.0, plus a 5: (16 + 5) / 5 = 4.2
    porto = ok(s, "search_restaurants", city="Porto")[0]
    assert porto["rating"] == 4.2 and s.dump()["restaurants"]["RS-POR-01"]["review_count"] == 5
    fails(s, "leave_review", "conflict", reservation_id="RV-0003", rating=4, comment="again")


def test_leave_review_errors(s: Session) -> None:
    fails(s, "leave_review", "conflict", reservation_id="RV-0005", rating=4, comment="x")  # reviewed as REV-0001
    fails(s, "leave_review", "conflict", reservation_id="RV-0004", rating=4, comment="x")  # cancelled
    fails(s, "leave_review", "conflict", reservation_id="RV-0001", rating=4, comment="x")  # on the 20th
    fails(s, "leave_review", "conflict", reservation_id="RV-0002", rating=4, comment="x")  # tonight at 19:30
    fails(s, "leave_review", "tool_error", reservation_id="RV-0003", rating=0, comment="x")
    fails(s, "leave_review", "tool_error", reservation_id="RV-0003", rating=6, comment="x")
    fails(s, "leave_review", "tool_error", reservation_id="RV-0003", rating=4, comment="   ")
    fails(s, "leave_review", "tool_error", reservation_id="RV-0003", rating=4, comment="x" * 501)
    fails(s, "leave_review", "not_found", reservation_id="RV-9999", rating=4, comment="x")
    fails(s, "leave_review", "invalid_arguments", reservation_id="RV-0003", rating=4.5, comment="x")


def test_chain_search_check_reserve_modify_cancel(s: Session) -> None:
    sushi = ok(s, "search_restaurants", city="Lisbon", cuisine="japanese")[0]
    assert sushi["id"] == "RS-LIS-02"
    assert len(ok(s, "get_menu", restaurant_id=sushi["id"], vegetarian_only=True)) == 3
    slot = {"date": "2026-03-20", "time": "18:00"}
    assert ok(s, "check_table", restaurant_id=sushi["id"], **slot, party_size=2)["available"]
    res = ok(s, "reserve_table", restaurant_id=sushi["id"], guest_name="Rui Santos", **slot, party_size=2)
    assert ok(s, "get_reservation", reservation_id=res["id"])["status"] == "confirmed"
    assert ok(s, "modify_reservation", reservation_id=res["id"], party_size=3)["party_size"] == 3
    assert [b["id"] for b in ok(s, "list_reservations", guest_name="Rui Santos")] == [res["id"]]
    fails(s, "modify_reservation", "conflict", reservation_id="RV-0001", time="18:30")  # overlaps Rui's table
    ok(s, "cancel_reservation", reservation_id=res["id"])
    assert ok(s, "modify_reservation", reservation_id="RV-0001", time="18:30")["time"] == "18:30:00"
    fails(s, "leave_review", "conflict", reservation_id=res["id"], rating=5, comment="x")


def test_weekend_rush(pool: EnvPool) -> None:
    s = pool.get("restaurants").session("weekend_rush", strict=True)
    # Kiez Küche has 2 tables, held tonight from 19:00 (RV-0002) and 20:00 (RV-0003)
    kiez = {"restaurant_id": "RS-BER-01", "date": "2026-05-22", "party_size": 2}
    assert ok(s, "check_table", **kiez, time="19:30")["tables_free"] == 0
    assert ok(s, "check_table", **kiez, time="21:30")["tables_free"] == 1
    fails(s, "reserve_table", "conflict", **kiez, time="20:30", guest_name="Aiko Tanaka")
    assert ok(s, "reserve_table", **kiez, time="21:30", guest_name="Aiko Tanaka")["id"] == "RV-0006"
    review = ok(s, "leave_review", reservation_id="RV-0004", rating=3, comment="Labskaus was cold.")
    assert review["id"] == "REV-0001"
    # 9 reviews averaging 4.4, plus a 3: (39.6 + 3) / 10 = 4.26
    assert ok(s, "search_restaurants", city="Hamburg")[0]["rating"] == 4.26
