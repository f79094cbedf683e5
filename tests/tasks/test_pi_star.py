"""The verifier v and the privileged solver π* on real pool environments (no model)."""

from __future__ import annotations

import random
from datetime import datetime

from envfactory.env.pool import EnvPool
from envfactory.records.episode import replay
from envfactory.records.models import Assertion, MaskSpec, StateVerifier, ToolCall
from envfactory.records.verifier import admissible, answer_forms, get_path, state_differences, verify
from envfactory.tasks.offline import initial_states
from envfactory.tasks.pi_star import solve_chain
from envfactory.tasks.plan import SynthConfig, plan_units
from envfactory.tasks.values import ValueMaker, learned_bounds
from envfactory.toolgraph import ToolGraph
from tests.support.chains import chain, from_tool, hotel_chain, user


def _book(hotel: str, guest: str = "Ana Costa") -> ToolCall:
    args = {"hotel_id": hotel, "guest_name": guest, "check_in": "2026-03-01", "nights": 2}
    return ToolCall(server="hotels", name="book_room", arguments=args)


def test_state_equivalence_names_what_differs(pool: EnvPool) -> None:
    initial = {"hotels": pool.get("hotels").scenario("default")}
    goal = replay(pool, [_book("HT-LIS-01")], initial).final
    assert verify(StateVerifier(goal=goal), initial, goal).ok
    other = replay(pool, [_book("HT-POR-01")], initial).final
    verdict = verify(StateVerifier(goal=goal), initial, other)
    assert not verdict.ok
    assert any("hotels: different bookings.<new>[0].hotel_id" in r for r in verdict.reasons), verdict.reasons
    assert not verify(StateVerifier(goal=goal), initial, initial).ok  # the booking is missing


def test_generated_ids_are_masked_but_only_when_asked(pool: EnvPool) -> None:
    initial = {"hotels": pool.get("hotels").scenario("default")}
    a_then_b = replay(pool, [_book("HT-LIS-01"), _book("HT-POR-01")], initial).final
    b_then_a = replay(pool, [_book("HT-POR-01"), _book("HT-LIS-01")], initial).final
    assert a_then_b != b_then_a  # BK-0002 and BK-0003 swapped hotels
    assert verify(StateVerifier(goal=a_then_b), initial, b_then_a).ok
    strict = StateVerifier(goal=a_then_b, mask=MaskSpec(generated_ids=False))
    assert not verify(strict, initial, b_then_a).ok


def test_references_to_generated_ids_are_masked_and_paths_globbed(pool: EnvPool) -> None:
    init = {"counters": {"X": 1}, "items": {"A": {"id": "A", "ref": None, "at": "t0"}}}
    goal = {"counters": {"X": 2}, "items": {"A": {"id": "A", "ref": "X-2", "at": "t1"}, "X-2": {"id": "X-2"}}}
    actual = {"counters": {"X": 3}, "items": {"A": {"id": "A", "ref": "X-3", "at": "t2"}, "X-3": {"id": "X-3"}}}
    assert state_differences(init, goal, actual, MaskSpec()) == ["different items.A.at"]
    assert state_differences(init, goal, actual, MaskSpec(paths=["items.*.at"])) == []


def test_assertions_and_answer_forms(pool: EnvPool) -> None:
    initial = {"hotels": pool.get("hotels").scenario("default")}
    v = StateVerifier(
        goal=initial,
        assertions=[
            Assertion(kind="answer_contains", value=1250.5),
            Assertion(kind="state_equals", server="hotels", path="hotels.HT-LIS-01.amenities[1]", value="breakfast"),
            Assertion(kind="state_absent", server="hotels", path="bookings.BK-0002"),
        ],
    )
    assert verify(v, initial, initial, "It costs 1,250.50 in total.").ok
    verdict = verify(v, initial, initial, "It costs 1250.")
    assert verdict.reasons == ["the answer does not mention 1250.5"]
    assert "1,250.50" in answer_forms(1250.5) and "3" in answer_forms(3.0)
    assert get_path({"a": [{"b": 1}, {"b": [5, 6]}]}, "a[1].b[0]") == 5


def test_admissible_is_synthapi_filter(pool: EnvPool) -> None:
    initial = {"hotels": pool.get("hotels").scenario("default")}
    solved = replay(pool, [_book("HT-LIS-01")], initial).final
    assert admissible(StateVerifier(goal=solved), initial, solved, None) == (True, None)
    kept, why = admissible(StateVerifier(goal=initial), initial, initial, None)
    assert not kept and why is not None and why.startswith("goal_already_holds")
    wrong = replay(pool, [_book("HT-MAD-01")], initial).final
    kept, why = admissible(StateVerifier(goal=solved), initial, wrong, None)
    assert not kept and why is not None and why.startswith("unsolved")


def test_privileged_solver_binds_from_state_outputs_and_schema(pool: EnvPool) -> None:
    initial = {"hotels": pool.get("hotels").scenario("default")}
    core = {"hotels": {"hotels": ["HT-POR-01"]}}
    out = solve_chain(pool, hotel_chain(), initial, core, seed=3)
    assert out.ok, out.failure
    search, book, cancel = out.planned
    city = next(b for b in search.bindings if b.parameter == "city")
    assert (city.source, city.value, city.path) == ("state", "Porto", "hotels.HT-POR-01.city")  # the core hotel's city
    hotel = next(b for b in book.bindings if b.parameter == "hotel_id")
    assert (hotel.source, hotel.value, hotel.call) == ("output", "HT-POR-01", 0)
    assert {b.parameter: b.source for b in book.bindings}["guest_name"] == "generated"
    check_in = datetime.fromisoformat(book.call.arguments["check_in"])
    assert check_in > datetime(2026, 1, 5)  # after the state's clock: a bookable date
    assert cancel.call.arguments == {"booking_id": "BK-0002"}
    assert [b.source for b in cancel.bindings] == ["output"]
    assert len(out.turn_final) == 2  # one state per turn
    assert out.turn_final[0]["hotels"]["bookings"]["BK-0002"]["status"] == "confirmed"
    assert out.final["hotels"]["bookings"]["BK-0002"]["status"] == "cancelled"
    assert out == solve_chain(pool, hotel_chain(), initial, core, seed=3)  # seeded: the same plan again


def test_solver_reports_an_unsolvable_chain(pool: EnvPool) -> None:
    checkout = chain([("shop.checkout", [user("customer_id")])])
    initial = {"shop": pool.get("shop").scenario("default")}
    initial["shop"]["cart_items"] = {}  # every cart empty
    out = solve_chain(pool, checkout, initial, seed=1)
    assert not out.ok
    assert out.failure is not None and "unsolvable: call 1 (shop.checkout)" in out.failure and "empty" in out.failure


def test_user_values_are_repeated_not_redrawn(pool: EnvPool) -> None:
    c = chain(
        [
            ("hotels.search_hotels", [user("city")]),
            (
                "hotels.book_room",
                [from_tool("hotel_id", "hotels.search_hotels", "hotel_id", 0), user("guest_name"), user("check_in"),
                 user("nights")],
            ),
            ("hotels.list_bookings", [user("guest_name")]),
        ]
    )  # fmt: skip
    out = solve_chain(pool, c, {"hotels": pool.get("hotels").scenario("default")}, seed=5)
    assert out.ok, out.failure
    guest = out.planned[1].call.arguments["guest_name"]
    listed = out.planned[2].bindings[0]
    assert (listed.source, listed.value, listed.call) == ("repeated", guest, 1)


def test_value_maker_reads_schema_and_learned_bounds() -> None:
    maker = ValueMaker(random.Random(0), datetime(2026, 3, 1, 9))
    assert learned_bounds("duration_minutes must be between 15 and 480, got 2") == {"duration_minutes": (15.0, 480.0)}
    for _ in range(20):
        assert 15 <= maker.make("span", {"type": "integer"}, (15, 480)) <= 480
        assert maker.make("status", {"enum": ["a", "b"]}) in ("a", "b")
        assert maker.make("check_in", {"type": "string", "format": "date"}) > "2026-03-01"
    assert "@" in maker.make("contact_email", {"type": "string"})
    # nested records through $defs: required fields, one optional setting, ids of real records
    maker = ValueMaker(random.Random(0), datetime(2026, 3, 1, 9), id_lookup={"device": "DV-001"}.get)
    maker.defs = {
        "S": {
            "type": "object",
            "properties": {"device_id": {"type": "string"}, "power": {"enum": ["on", "off"]}},
            "required": ["device_id"],
        }
    }
    [item] = maker.make("settings", {"type": "array", "items": {"$ref": "#/$defs/S"}})
    assert item["device_id"] == "DV-001" and item["power"] in ("on", "off")


def test_the_solvers_states_are_those_of_replaying_its_calls(pool: EnvPool, graph: ToolGraph) -> None:
    """On every native environment's planned chains (D 2): each turn's state, and the final one, which the
    solver dumps along what its calls touched, is the whole dump of replaying its calls up to there."""
    config = SynthConfig.model_validate({"T": 3, "S": 1, "D": 2, "seed": 11})
    solved = 0
    for unit in plan_units(config, pool, graph).units:
        initial, core = initial_states(pool, unit.chain.servers, unit.seed, unit.depth)
        out = solve_chain(pool, unit.chain, initial, core, seed=unit.seed)
        if not out.ok:
            continue
        solved += 1
        calls = [p.call for p in out.planned]
        for (_, end), state in zip(out.spans, out.turn_final, strict=True):
            assert state == replay(pool, calls[:end], initial).final, unit.key
        assert out.final == replay(pool, calls, initial).final, unit.key
    assert solved >= 9
