"""Initial-state generation on the real bundled environments: it loads, is deterministic, keeps references
sound, leaves room for new ids, and the core records work with the environment's own tools."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from envfactory.env import Environment, Record, State
from envfactory.env.environment import BaseEnvironment, ToolBinding
from envfactory.env.metadata import EnvMetadata
from envfactory.env.pool import EnvPool, load_env_folder
from envfactory.errors import EnvFactoryError, ScenarioError
from envfactory.tasks.initial_state import (
    InitialState,
    StateGenerationError,
    StateGenSettings,
    exemplars,
    generate_initial_state,
)
from tests.support.paths import ROOT

NATIVE = sorted(p.parent.name for p in (ROOT / "envs").glob("*/env.py"))
SEEDS = (0, 7, 2024)
DEPTHS = (1, 2, 3)
_ID = re.compile(r"([A-Za-z]+)-(\d+)")


def native(pool: EnvPool, name: str) -> Environment:
    env = pool.get(name)
    assert isinstance(env, Environment)
    return env


def collections(env: Environment) -> list[str]:
    return list(exemplars(env).collections)


def records(made: InitialState, env: Environment) -> dict[str, dict[str, Any]]:
    return {c: made.config[c] for c in collections(env)}


def collection_for(stem: str, colls: list[str]) -> str | None:
    """`hotel` → `hotels`, `from_account` → `accounts`, `list` → `reading_lists`; None if none is named so."""
    for cand in (stem, stem.split("_")[-1]):
        for c in colls:
            if c in (cand + "s", cand + "es", cand) or c.endswith("_" + cand + "s"):
                return c
    return None


def walk(value: Any) -> Any:
    """Every (key, value) pair of every dict inside `value`."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k, v
            yield from walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk(v)


def test_pool_has_the_native_environments(pool: EnvPool) -> None:
    assert set(NATIVE) == set(pool.native_names())
    assert {"hotels", "flights", "shop", "banking", "calendar", "helpdesk", "restaurants", "papers"} <= set(NATIVE)


@pytest.mark.parametrize("name", NATIVE)
def test_loads_and_has_the_composition_asked_for(pool: EnvPool, name: str) -> None:
    env = native(pool, name)
    ex = exemplars(env)
    for seed in SEEDS:
        for depth in DEPTHS:
            made = generate_initial_state(env, seed=seed, depth=depth)
            assert (made.env, made.seed, made.depth) == (name, seed, depth)
            assert env.new_state(made.config).dump() == made.config  # loads, and is already a normalized dump
            for coll, recs in records(made, env).items():
                core, distractors = made.core_ids[coll], made.distractor_ids[coll]
                assert sorted(core + distractors) == sorted(recs), coll  # every record is core or distractor
                assert not set(core) & set(distractors)
                counts = [len(d.get(coll, {})) for d in ex.dumps]
                if any(counts) and not all(n == 1 for n in counts):  # neither a log nor a singleton
                    assert len(core) == 3 and len(distractors) == 3 * (depth - 1), (coll, depth)
                for key, rec in recs.items():
                    if "id" in rec:
                        assert rec["id"] == key


@pytest.mark.parametrize("name", NATIVE)
def test_deterministic_per_seed(pool: EnvPool, name: str) -> None:
    env = native(pool, name)
    a, b = generate_initial_state(env, seed=11, depth=2), generate_initial_state(env, seed=11, depth=2)
    assert a == b
    dumps = {json.dumps(generate_initial_state(env, seed=s, depth=2).config, sort_keys=True) for s in SEEDS}
    assert len(dumps) == len(SEEDS)


def test_deterministic_across_processes() -> None:
    """No hidden dependence on set order (hash randomization), the global RNG or the wall clock."""
    code = textwrap.dedent(
        """
        import hashlib, json, random, sys
        from envfactory.config import Settings
        from envfactory.env.pool import EnvPool
        from envfactory.tasks.initial_state import generate_initial_state
        random.seed(int(sys.argv[1]))
        pool = EnvPool(Settings(root=sys.argv[2]))
        made = [generate_initial_state(pool.get(n), seed=5, depth=2).model_dump() for n in pool.native_names()]
        print(hashlib.sha256(json.dumps(made, sort_keys=True).encode()).hexdigest())
        """
    )
    outs = set()
    for hash_seed in ("1", "2"):
        env = {"PYTHONHASHSEED": hash_seed, "PATH": "/usr/bin:/bin"}
        run = subprocess.run(
            [sys.executable, "-c", code, hash_seed, str(ROOT)], capture_output=True, text=True, env=env, check=True
        )
        outs.add(run.stdout.strip())
    assert len(outs) == 1


@pytest.mark.parametrize("name", NATIVE)
def test_references_point_at_existing_records(pool: EnvPool, name: str) -> None:
    env = native(pool, name)
    for seed in SEEDS:
        made = generate_initial_state(env, seed=seed, depth=3)
        recs = records(made, env)
        every_id = {k for coll in recs.values() for k in coll}
        for coll, coll_recs in recs.items():
            for rec in coll_recs.values():
                for field, value in walk(rec):
                    m = re.fullmatch(r"(.+)_ids?", field)
                    if not m or value is None:
                        continue
                    target = collection_for(m.group(1), list(recs))
                    for v in value if isinstance(value, list) else [value]:
                        assert v in (recs[target] if target else every_id), (coll, field, v)
                if name == "papers" and coll == "papers":
                    assert set(rec["references"]) <= set(recs["papers"])


@pytest.mark.parametrize("name", NATIVE)
def test_counters_leave_room_for_new_ids(pool: EnvPool, name: str) -> None:
    env = native(pool, name)
    made = generate_initial_state(env, seed=3, depth=3)
    counters = made.config["counters"]
    assert set(exemplars(env).counters) <= set(counters)  # every prefix the tools use
    for _, value in walk(records(made, env)):
        if isinstance(value, str) and (m := _ID.fullmatch(value)):
            assert counters.get(m.group(1), 0) >= int(m.group(2)), value


def _create_calls(name: str, cfg: dict[str, Any], core: dict[str, list[str]]) -> list[tuple[str, dict[str, Any]]]:
    """Write calls that create one record, built from the core records; at least one must succeed."""
    clock = datetime.fromisoformat(cfg["clock"])
    later = (clock + timedelta(days=200)).replace(hour=10, minute=0, second=0)
    if name == "hotels":
        args = {"guest_name": "Test Guest", "check_in": later.date().isoformat(), "nights": 1}
        return [("book_room", {"hotel_id": h, **args}) for h in core["hotels"]]
    if name == "banking":
        owner = cfg["accounts"][core["accounts"][0]]["owner"]
        return [("add_payee", {"owner": owner, "name": "Test Payee", "iban": "PT50000201231234567899999"})]
    if name == "calendar":
        organizer = cfg["events"][core["events"][0]]["organizer"]
        args = {"title": "Test sync", "organizer": organizer, "start": later.isoformat(), "duration_minutes": 30}
        return [("create_event", args)]
    if name == "flights":
        return [
            ("book_flight", {"flight_id": f, "passenger_name": "Test Passenger", "cabin": cabin})
            for f in core["flights"]
            for cabin in ("economy", "business")
        ]
    if name == "helpdesk":
        return [("create_ticket", {"customer_id": c, "subject": "Test subject"}) for c in core["customers"]]
    if name == "papers":
        return [("create_reading_list", {"name": "Test list"})]
    if name == "restaurants":
        return [
            (
                "reserve_table",
                {
                    "restaurant_id": r,
                    "guest_name": "Test Guest",
                    "date": later.date().isoformat(),
                    "time": cfg["restaurants"][r]["opens"],
                    "party_size": 1,
                },
            )
            for r in core["restaurants"]
        ]
    if name == "shop":
        in_cart = {(i["customer_id"], i["product_id"]) for i in cfg["cart_items"].values()}
        return [
            ("add_to_cart", {"customer_id": c, "product_id": p, "quantity": 1})
            for c in core["customers"]
            for p in cfg["products"]  # any product: all core ones may be sold out
            if (c, p) not in in_cart  # else the cart line grows instead of a new one being created
        ]
    if name == "smart_home":
        at = (clock + timedelta(days=2)).isoformat()
        return [("schedule_action", {"device_id": d, "at": at, "power": "on"}) for d in core["devices"]]
    raise AssertionError(f"no create call known for environment '{name}': add one")


@pytest.mark.parametrize("name", NATIVE)
def test_new_records_get_fresh_ids(pool: EnvPool, name: str) -> None:
    env = native(pool, name)
    for seed in SEEDS:
        made = generate_initial_state(env, seed=seed, depth=2)
        for tool, args in _create_calls(name, made.config, made.core_ids):
            session = env.session(made.config)
            rec = session.call(tool, args)
            if rec.ok:
                break
        else:
            pytest.fail(f"{name} seed {seed}: no create call succeeded; last: {rec.error}")
        created = [c for c in rec.changes if c.op == "create"]
        assert created, rec.changes
        for change in created:
            assert change.id not in made.config[change.collection]


@pytest.mark.parametrize("name", NATIVE)
def test_read_tools_work_on_core_records(pool: EnvPool, name: str) -> None:
    """Every read tool with exactly one required `<x>_id` parameter accepts each core id of that collection."""
    env = native(pool, name)
    colls = collections(env)
    checked = 0
    for seed in SEEDS:
        made = generate_initial_state(env, seed=seed, depth=2)
        session = env.session(made.config)
        for spec in env.metadata.tools:
            required = spec.required
            m = re.fullmatch(r"(.+)_id", required[0]) if spec.kind == "read" and len(required) == 1 else None
            target = collection_for(m.group(1), colls) if m else None
            if target is None:
                continue
            for key in made.core_ids[target]:
                rec = session.call(spec.name, {required[0]: key})
                assert rec.ok, (spec.name, key, rec.error)
                checked += 1
    assert checked > 0


def test_hotels_search_finds_core_hotels(pool: EnvPool) -> None:
    env = native(pool, "hotels")
    made = generate_initial_state(env, seed=4, depth=3)
    session = env.session(made.config)
    for h in made.core_ids["hotels"]:
        city = made.config["hotels"][h]["city"]
        found = session.call("search_hotels", {"city": city})
        assert found.ok and h in {x["id"] for x in found.result}


def test_banking_core_owners_have_accounts_and_payees(pool: EnvPool) -> None:
    env = native(pool, "banking")
    made = generate_initial_state(env, seed=9, depth=2)
    cfg, session = made.config, env.session(made.config)
    owners = {a["owner"] for a in cfg["accounts"].values()}
    assert {p["owner"] for p in cfg["payees"].values()} <= owners  # payees belong to account holders
    for a in made.core_ids["accounts"]:
        listed = session.call("list_accounts", {"owner": cfg["accounts"][a]["owner"]})
        assert listed.ok and a in {x["id"] for x in listed.result}
        assert session.call("get_balance", {"account_id": a}).ok
    for t in cfg["transfers"].values():  # a transfer's account and payee have one owner
        assert cfg["accounts"][t["from_account_id"]]["owner"] == cfg["payees"][t["payee_id"]]["owner"]


def test_values_follow_the_exemplars(pool: EnvPool) -> None:
    """Future stays future, a copied field equals its source, times keep their order, scales stay in range."""
    hotels = generate_initial_state(native(pool, "hotels"), seed=1, depth=3).config
    today = datetime.fromisoformat(hotels["clock"]).date().isoformat()
    assert all(b["check_in"] >= today for b in hotels["bookings"].values())
    assert all(1 <= h["stars"] <= 5 for h in hotels["hotels"].values())
    shop = generate_initial_state(native(pool, "shop"), seed=1, depth=3).config
    for order in shop["orders"].values():
        for line in order["lines"]:
            assert line["name"] == shop["products"][line["product_id"]]["name"]
        if order["delivered_at"]:
            assert order["delivered_at"] >= order["placed_at"]
    flights = generate_initial_state(native(pool, "flights"), seed=1, depth=3).config
    for f in flights["flights"].values():
        assert f["arrival"] > f["departure"] and f["origin"] != f["destination"]
    home = generate_initial_state(native(pool, "smart_home"), seed=1, depth=3).config
    for d in home["devices"].values():
        assert (d["power"] is None) == (d["type"] == "blind")
        assert (d["temperature"] is None) == (d["type"] != "thermostat")
        if d["temperature"] is not None:
            assert d["temperature"] * 2 == round(d["temperature"] * 2)  # the exemplars' half-degree steps


def test_settings(pool: EnvPool) -> None:
    env = native(pool, "hotels")
    made = generate_initial_state(env, seed=1, depth=2, settings=StateGenSettings(batch_size=1))
    assert [len(v) for v in made.core_ids.values()] == [1, 1]
    with pytest.raises(ValidationError):
        StateGenSettings(batch_size=0)
    with pytest.raises(StateGenerationError, match="depth"):
        generate_initial_state(env, seed=1, depth=0)


class _PlainEnv(BaseEnvironment):
    """An environment with a plain dict for a state (like an imported suite): not native."""

    name = "plain"

    @property
    def metadata(self) -> EnvMetadata:
        return EnvMetadata(name="plain", description="A plain environment.", domain="utilities", tools=[])

    def binding(self, tool: str) -> ToolBinding | None:
        return None

    def new_state(self, config: dict[str, Any] | None, source: str = "<config>") -> Any:
        return dict(config or {})

    def dump_state(self, state: Any) -> dict[str, Any]:
        return dict(state)


def test_non_native_environment_is_refused(pool: EnvPool) -> None:
    envs: list[BaseEnvironment] = [_PlainEnv()]
    imported = pool.names(include_imported=True)[len(pool.native_names()) :]
    if imported:  # a BFCL environment, when its package is installed
        envs.append(pool.get(imported[0]))
    for env in envs:
        with pytest.raises(StateGenerationError, match="not native") as err:
            generate_initial_state(env, seed=1)
        assert isinstance(err.value, ScenarioError) and isinstance(err.value, EnvFactoryError)


# ---- environments without exemplars: polyfactory, the log rule, a clear error ------------------
class Gadget(Record):
    id: str
    name: str
    weight: float
    made: datetime
    tags: list[str] = []


class Part(Record):
    id: str
    gadget_id: str
    count: int


class Shed(State):
    gadgets: dict[str, Gadget] = {}
    parts: dict[str, Part] = {}


def test_environment_without_scenarios_uses_polyfactory() -> None:
    env = Environment("shed", Shed, description="A shed of gadgets and parts.", domain="utilities")
    made = generate_initial_state(env, seed=2, depth=2)
    assert made == generate_initial_state(env, seed=2, depth=2)
    state = Shed.model_validate(made.config)
    assert len(state.gadgets) == 6 and len(state.parts) == 6
    clock = state.clock
    for key, g in state.gadgets.items():
        assert g.id == key and 0 <= g.weight <= 100 and abs(g.made - clock) <= timedelta(days=31)
    for p in state.parts.values():
        assert p.gadget_id in state.gadgets and 0 <= p.count <= 10
    core_parts = made.core_ids["parts"]
    assert all(state.parts[p].gadget_id in made.core_ids["gadgets"] for p in core_parts)
    for key in list(state.gadgets) + list(state.parts):
        m = _ID.fullmatch(key)
        assert m and state.counters[m.group(1)] >= int(m.group(2))


class Loop(Record):
    id: str
    knot_id: str


class Knot(Record):
    id: str
    loop_id: str


class Tangle(State):
    loops: dict[str, Loop] = {}
    knots: dict[str, Knot] = {}


def test_unsatisfiable_reference_names_env_collection_and_field() -> None:
    env = Environment("tangle", Tangle, description="Loops and knots that need each other.", domain="utilities")
    with pytest.raises(StateGenerationError) as err:
        generate_initial_state(env, seed=1)
    msg = str(err.value)
    assert "tangle" in msg and "loops" in msg and "knot_id" in msg


def test_log_collections_stay_empty_unless_asked(tmp_path: Path) -> None:
    folder = tmp_path / "workshop"
    (folder / "scenarios").mkdir(parents=True)
    (folder / "env.py").write_text(
        textwrap.dedent(
            """
            from datetime import datetime
            from envfactory.env import Environment, Record, State

            class Tool(Record):
                id: str
                name: str
                price: float

            class Entry(Record):
                id: str
                tool_id: str
                at: datetime

            class WorkshopDB(State):
                tools: dict[str, Tool] = {}
                log: dict[str, Entry] = {}

            env = Environment("workshop", WorkshopDB, description="Tools and a usage log.", domain="utilities")
            """
        )
    )
    scenario = {
        "clock": "2026-02-01T09:00:00",
        "counters": {"LG": 0},
        "tools": {
            "TL-01": {"id": "TL-01", "name": "Claw hammer", "price": 12.5},
            "TL-02": {"id": "TL-02", "name": "Hand saw", "price": 20.0},
        },
        "log": {},
    }
    (folder / "scenarios" / "default.json").write_text(json.dumps(scenario))
    env = load_env_folder(folder, with_metadata=False)
    made = generate_initial_state(env, seed=1, depth=3)
    assert made.config["log"] == {} and len(made.config["tools"]) == 9
    filled = generate_initial_state(env, seed=1, depth=3, settings=StateGenSettings(fill_logs=True))
    assert filled.core_ids["log"] == [] and len(filled.distractor_ids["log"]) == 6
    assert all(e["tool_id"] in filled.config["tools"] for e in filled.config["log"].values())
    assert all(5 <= t["price"] <= 30 for t in filled.config["tools"].values())  # magnitude × U(0.5, 1.5)
    env.new_state(filled.config)
