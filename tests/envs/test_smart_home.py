"""Every tool of `smart_home`: results, error cases, state transitions."""

from __future__ import annotations

import pytest

from envfactory.env import Session
from envfactory.env.pool import EnvPool
from tests.envs.helpers import fails, ok

# default scenario: now is 2026-03-06 18:30; DV-007 (Bedside lamp) is offline.


@pytest.fixture()
def s(pool: EnvPool) -> Session:
    # strict: every call also diffs full dumps, proving the tools write only through CRUD helpers
    return pool.get("smart_home").session("default", strict=True)


def _ids(items: list[dict]) -> list[str]:
    return [i["id"] for i in items]


def test_scenarios_load(pool: EnvPool) -> None:
    env = pool.get("smart_home")
    assert env.scenario_names() == ["default", "studio_flat"]
    flat = env.session("studio_flat", strict=True)
    assert _ids(ok(flat, "list_devices", room="bathroom")) == ["DV-105", "DV-106"]
    rec = flat.call("activate_scene", {"scene_id": "SC-0001"})
    assert rec.ok and rec.diff.changed == [
        "devices.DV-102.temperature",
        "devices.DV-103.level",
        "devices.DV-104.power",
        "scenes.SC-0001.last_activated",
    ]


def test_list_devices(s: Session) -> None:
    everything = ok(s, "list_devices")
    assert _ids(everything) == [f"DV-00{i}" for i in range(1, 10)]
    assert _ids(ok(s, "list_devices", room="living ROOM")) == ["DV-001", "DV-002", "DV-003"]
    assert _ids(ok(s, "list_devices", room="RM-KIT")) == ["DV-005", "DV-006"]
    assert _ids(ok(s, "list_devices", room="rm-off")) == ["DV-009"]
    fails(s, "list_devices", "not_found", room="Garage")
    fails(s, "list_devices", "invalid_arguments", room=5)


def test_get_device_status(s: Session) -> None:
    assert ok(s, "get_device_status", device_id="DV-004") == {
        "id": "DV-004",
        "name": "Hallway thermostat",
        "type": "thermostat",
        "room_id": "RM-HAL",
        "online": True,
        "power": "on",
        "level": None,
        "temperature": 20.5,
    }
    assert ok(s, "get_device_status", device_id="DV-007")["online"] is False
    fails(s, "get_device_status", "not_found", device_id="DV-999")


def test_set_device_state(s: Session) -> None:
    rec = s.call("set_device_state", {"device_id": "DV-002", "power": "on", "level": 60})
    assert rec.ok and (rec.result["power"], rec.result["level"]) == ("on", 60)
    assert rec.diff.changed == ["devices.DV-002.level", "devices.DV-002.power"]
    rec = s.call("set_device_state", {"device_id": "DV-004", "temperature": 21})
    assert rec.ok and rec.result["temperature"] == 21.0
    assert rec.diff.changed == ["devices.DV-004.temperature"]
    rec = s.call("set_device_state", {"device_id": "DV-003", "level": 0})  # close the blinds
    assert rec.ok and rec.diff.changed == ["devices.DV-003.level"]
    rec = s.call("set_device_state", {"device_id": "DV-001", "power": "on", "level": 50})  # already on
    assert rec.ok and rec.diff.changed == ["devices.DV-001.level"]
    rec = s.call("set_device_state", {"device_id": "DV-005", "power": "on"})
    assert rec.ok and rec.diff.changed == ["devices.DV-005.power"]
    dev = s.dump()["devices"]
    assert (dev["DV-002"]["level"], dev["DV-003"]["level"], dev["DV-004"]["temperature"]) == (60, 0, 21.0)


def test_set_device_state_per_type_validation(s: Session) -> None:
    fails(s, "set_device_state", "tool_error", device_id="DV-003", power="on")  # a blind has no power switch
    fails(s, "set_device_state", "tool_error", device_id="DV-005", level=50)  # a plug has no level
    fails(s, "set_device_state", "tool_error", device_id="DV-004", level=50)  # nor a thermostat
    fails(s, "set_device_state", "tool_error", device_id="DV-001", temperature=20.0)  # a light has no temperature
    fails(s, "set_device_state", "tool_error", device_id="DV-001", level=0)  # brightness is 1-100
    fails(s, "set_device_state", "tool_error", device_id="DV-003", level=101)
    fails(s, "set_device_state", "tool_error", device_id="DV-004", temperature=31)
    fails(s, "set_device_state", "tool_error", device_id="DV-004", temperature=9.5)
    fails(s, "set_device_state", "tool_error", device_id="DV-004", temperature=20.3)  # 0.5 steps
    fails(s, "set_device_state", "tool_error", device_id="DV-001")  # nothing to set
    fails(s, "set_device_state", "invalid_arguments", device_id="DV-001", power="dim")
    fails(s, "set_device_state", "invalid_arguments", device_id="DV-001", level=50.5)
    fails(s, "set_device_state", "invalid_arguments", device_id="DV-001", level="high")


def test_set_device_state_conflicts(s: Session) -> None:
    fails(s, "set_device_state", "conflict", device_id="DV-007", power="on")  # offline
    fails(s, "set_device_state", "conflict", device_id="DV-001", power="on", level=80)  # already so
    fails(s, "set_device_state", "conflict", device_id="DV-004", temperature=20.5)
    fails(s, "set_device_state", "not_found", device_id="DV-999", power="on")


def test_list_scenes(s: Session) -> None:
    scenes = ok(s, "list_scenes")
    assert [(sc["id"], sc["name"]) for sc in scenes] == [("SC-0001", "Movie night"), ("SC-0002", "Good night")]
    assert scenes[0]["settings"][1] == {"device_id": "DV-002", "power": "on", "level": 25, "temperature": None}


def test_create_scene(s: Session) -> None:
    devices_before = s.dump()["devices"]
    settings = [
        {"device_id": "DV-006", "power": "on", "level": 40},
        {"device_id": "DV-005", "power": "off"},
        {"device_id": "DV-004", "temperature": 21.5},
        {"device_id": "DV-007", "power": "on"},  # offline now: allowed in a scene, checked on activation
    ]
    rec = s.call("create_scene", {"name": " Dinner ", "settings": settings})
    assert rec.ok, rec.error
    assert rec.result["id"] == "SC-0003" and rec.result["name"] == "Dinner"
    assert rec.result["created_at"] == "2026-03-06T18:30:00" and rec.result["last_activated"] is None
    assert rec.result["settings"][0] == {"device_id": "DV-006", "power": "on", "level": 40, "temperature": None}
    assert rec.result["settings"][2] == {"device_id": "DV-004", "power": None, "level": None, "temperature": 21.5}
    assert rec.diff.added == ["scenes.SC-0003"] and rec.diff.changed == ["counters.SC"]
    assert s.dump()["devices"] == devices_before  # saving a scene changes no device
    assert _ids(ok(s, "list_scenes")) == ["SC-0001", "SC-0002", "SC-0003"]


def test_create_scene_errors(s: Session) -> None:
    one = [{"device_id": "DV-001", "power": "off"}]
    fails(s, "create_scene", "conflict", name="movie NIGHT", settings=one)
    fails(s, "create_scene", "tool_error", name="  ", settings=one)
    fails(s, "create_scene", "tool_error", name="Empty", settings=[])
    fails(s, "create_scene", "not_found", name="Ghost", settings=[{"device_id": "DV-999", "power": "on"}])
    fails(s, "create_scene", "tool_error", name="Twice", settings=[*one, {"device_id": "DV-001", "level": 10}])
    fails(s, "create_scene", "tool_error", name="Blind", settings=[{"device_id": "DV-003", "power": "off"}])
    fails(s, "create_scene", "tool_error", name="Nothing", settings=[{"device_id": "DV-001"}])
    fails(s, "create_scene", "invalid_arguments", name="Red", settings=[{"device_id": "DV-001", "color": "red"}])
    fails(s, "create_scene", "invalid_arguments", name="No settings")


def test_activate_scene(s: Session) -> None:
    rec = s.call("activate_scene", {"scene_id": "SC-0001"})
    assert rec.ok, rec.error
    assert rec.result["scene_id"] == "SC-0001" and rec.result["activated_at"] == "2026-03-06T18:30:00"
    assert [(d["id"], d["power"], d["level"]) for d in rec.result["devices"]] == [
        ("DV-001", "off", 80),
        ("DV-002", "on", 25),
        ("DV-003", None, 0),
    ]
    assert rec.diff.changed == [
        "devices.DV-001.power",
        "devices.DV-002.level",
        "devices.DV-002.power",
        "devices.DV-003.level",
        "scenes.SC-0001.last_activated",
    ]
    assert s.dump()["scenes"]["SC-0001"]["last_activated"] == "2026-03-06T18:30:00"
    # activating it again at the same moment finds every device already set: nothing changes
    again = s.call("activate_scene", {"scene_id": "SC-0001"})
    assert again.ok and again.diff.empty


def test_activate_scene_offline_device_changes_nothing(s: Session) -> None:
    fails(s, "activate_scene", "conflict", scene_id="SC-0002")  # DV-007 is offline; DV-001 stays on
    assert s.dump()["devices"]["DV-001"]["power"] == "on"
    fails(s, "activate_scene", "not_found", scene_id="SC-0099")


def test_activate_scene_when_all_online(pool: EnvPool) -> None:
    env = pool.get("smart_home")
    data = env.scenario("default")
    data["devices"]["DV-007"]["online"] = True
    s = env.session(data, strict=True)
    rec = s.call("activate_scene", {"scene_id": "SC-0002"})
    assert rec.ok, rec.error
    # DV-007 is already off: only DV-001 and DV-008 change
    assert rec.diff.changed == [
        "devices.DV-001.power",
        "devices.DV-008.power",
        "devices.DV-008.temperature",
        "scenes.SC-0002.last_activated",
    ]
    assert (s.dump()["devices"]["DV-008"]["power"], s.dump()["devices"]["DV-008"]["temperature"]) == ("on", 17.5)


def test_delete_scene(s: Session) -> None:
    devices_before = s.dump()["devices"]
    rec = s.call("delete_scene", {"scene_id": "SC-0002"})
    assert rec.ok and rec.result["name"] == "Good night"
    assert rec.diff.removed == ["scenes.SC-0002"] and not rec.diff.changed
    assert s.dump()["devices"] == devices_before
    assert _ids(ok(s, "list_scenes")) == ["SC-0001"]
    fails(s, "delete_scene", "not_found", scene_id="SC-0002")
    fails(s, "activate_scene", "not_found", scene_id="SC-0002")


def test_schedule_action(s: Session) -> None:
    rec = s.call("schedule_action", {"device_id": "DV-006", "at": "2026-03-06T23:30:00", "power": "off"})
    assert rec.ok and rec.result == {
        "id": "SCH-0004",
        "device_id": "DV-006",
        "at": "2026-03-06T23:30:00",
        "power": "off",
        "level": None,
        "temperature": None,
        "status": "pending",
    }
    assert rec.diff.added == ["schedules.SCH-0004"] and rec.diff.changed == ["counters.SCH"]
    assert s.dump()["devices"]["DV-006"]["power"] == "on"  # nothing happens now
    heat = ok(s, "schedule_action", device_id="DV-004", at="2026-03-07T06:30:00", temperature=21)
    assert (heat["id"], heat["power"], heat["temperature"]) == ("SCH-0005", None, 21.0)
    # offline devices can be scheduled; exactly 30 days ahead is the limit
    assert ok(s, "schedule_action", device_id="DV-007", at="2026-04-05T18:30:00", power="on")["id"] == "SCH-0006"


def test_schedule_action_errors(s: Session) -> None:
    fails(s, "schedule_action", "tool_error", device_id="DV-006", at="2026-03-06T18:00:00", power="off")  # past
    fails(s, "schedule_action", "tool_error", device_id="DV-006", at="2026-03-06T18:30:00", power="off")  # now
    fails(s, "schedule_action", "tool_error", device_id="DV-006", at="2026-04-05T18:31:00", power="off")  # > 30 d
    fails(s, "schedule_action", "invalid_arguments", device_id="DV-006", at="2026-03-07T07:00:00Z", power="off")  # tz
    fails(s, "schedule_action", "tool_error", device_id="DV-003", at="2026-03-07T07:00:00", power="on")
    fails(s, "schedule_action", "tool_error", device_id="DV-004", at="2026-03-07T07:00:00", temperature=35.0)
    fails(s, "schedule_action", "tool_error", device_id="DV-006", at="2026-03-07T07:00:00")  # nothing to do
    fails(s, "schedule_action", "conflict", device_id="DV-005", at="2026-03-07T07:00:00", power="off")  # SCH-0001
    fails(s, "schedule_action", "not_found", device_id="DV-999", at="2026-03-07T07:00:00", power="on")
    fails(s, "schedule_action", "invalid_arguments", device_id="DV-006", at="tomorrow 7am", power="on")
    fails(s, "schedule_action", "invalid_arguments", device_id="DV-006", power="on")


def test_list_schedules(s: Session) -> None:
    assert _ids(ok(s, "list_schedules")) == ["SCH-0003", "SCH-0002", "SCH-0001"]  # time order
    bedroom = ok(s, "list_schedules", device_id="DV-008")
    assert _ids(bedroom) == ["SCH-0002"] and bedroom[0]["temperature"] == 19.0
    assert ok(s, "list_schedules", device_id="DV-002") == []
    fails(s, "list_schedules", "not_found", device_id="DV-999")


def test_cancel_schedule(s: Session) -> None:
    rec = s.call("cancel_schedule", {"schedule_id": "SCH-0001"})
    assert rec.ok and rec.result["status"] == "cancelled"
    assert rec.diff.changed == ["schedules.SCH-0001.status"]
    fails(s, "cancel_schedule", "conflict", schedule_id="SCH-0001")  # already cancelled
    fails(s, "cancel_schedule", "conflict", schedule_id="SCH-0003")  # already done
    fails(s, "cancel_schedule", "not_found", schedule_id="SCH-0099")
    # the slot is free again
    assert ok(s, "schedule_action", device_id="DV-005", at="2026-03-07T07:00:00", power="on")["id"] == "SCH-0004"


def test_room_device_schedule_chain(s: Session) -> None:
    kitchen = ok(s, "list_devices", room="Kitchen")
    light = next(d for d in kitchen if d["type"] == "light")
    assert light["id"] == "DV-006"
    ok(s, "set_device_state", device_id=light["id"], level=30)
    assert ok(s, "get_device_status", device_id=light["id"])["level"] == 30
    sched = ok(s, "schedule_action", device_id=light["id"], at="2026-03-06T23:00:00", power="off")
    assert _ids(ok(s, "list_schedules", device_id=light["id"])) == [sched["id"]]
    ok(s, "cancel_schedule", schedule_id=sched["id"])
    assert ok(s, "list_schedules", device_id=light["id"])[0]["status"] == "cancelled"


def test_scene_chain(s: Session) -> None:
    living = ok(s, "list_devices", room="Living room")
    settings = [{"device_id": d["id"], "level": 70} for d in living if d["type"] in ("light", "blind")]
    scene = ok(s, "create_scene", name="Reading", settings=settings)
    activation = ok(s, "activate_scene", scene_id=scene["id"])
    assert [(d["id"], d["level"]) for d in activation["devices"]] == [("DV-001", 70), ("DV-002", 70), ("DV-003", 70)]
    assert s.dump()["devices"]["DV-002"]["power"] == "off"  # a level alone does not switch a light on
    ok(s, "delete_scene", scene_id=scene["id"])
    fails(s, "activate_scene", "not_found", scene_id=scene["id"])
    assert s.dump()["devices"]["DV-001"]["level"] == 70  # devices keep the scene's state
