"""Smart home: control devices room by room, save and activate scenes, schedule device actions."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import Field

from envfactory.env import ConflictError, Environment, NotFoundError, Record, State, ToolError

DeviceType = Literal["light", "thermostat", "plug", "blind"]
Power = Literal["on", "off"]

# What each device type can be set to: power (on/off), level (light brightness 1-100 or
# blind opening 0-100 %), temperature (thermostat target, 10.0-30.0 °C in 0.5 steps).
CAPABILITIES: dict[str, frozenset[str]] = {
    "light": frozenset({"power", "level"}),
    "thermostat": frozenset({"power", "temperature"}),
    "plug": frozenset({"power"}),
    "blind": frozenset({"level"}),
}
LEVEL_RANGE: dict[str, tuple[int, int]] = {"light": (1, 100), "blind": (0, 100)}
TEMP_MIN, TEMP_MAX = 10.0, 30.0
MAX_SCHEDULE_AHEAD = timedelta(days=30)


class Room(Record):
    id: str
    name: str
    floor: int


class Device(Record):
    id: str
    name: str
    type: DeviceType
    room_id: str
    online: bool = True
    power: Power | None = None  # None for blinds (no power switch)
    level: int | None = None  # light brightness or blind opening; None for other types
    temperature: float | None = None  # thermostat target; None for other types


class SceneSetting(Record):
    device_id: str
    power: Power | None = None
    level: int | None = None
    temperature: float | None = None


class Scene(Record):
    id: str
    name: str
    settings: list[SceneSetting]
    created_at: datetime
    last_activated: datetime | None = None


class SceneActivation(Record):
    scene_id: str
    activated_at: datetime
    devices: list[Device]


class Schedule(Record):
    id: str
    device_id: str
    at: datetime
    power: Power | None = None
    level: int | None = None
    temperature: float | None = None
    status: Literal["pending", "done", "cancelled"] = "pending"


class HomeDB(State):
    rooms: dict[str, Room] = Field(default_factory=dict)
    devices: dict[str, Device] = Field(default_factory=dict)
    scenes: dict[str, Scene] = Field(default_factory=dict)
    schedules: dict[str, Schedule] = Field(default_factory=dict)


env = Environment(
    "smart_home",
    HomeDB,
    description=(
        "Smart-home control: list devices by room, read and set their state (power, brightness, blind "
        "position, thermostat temperature), save and activate scenes, and schedule device actions."
    ),
    domain="utilities",
)


def _settings(device: Device, power: str | None, level: int | None, temperature: float | None) -> dict[str, Any]:
    """The fields to set on `device`, checked against what its type supports."""
    asked = {k: v for k, v in (("power", power), ("level", level), ("temperature", temperature)) if v is not None}
    if not asked:
        raise ToolError(f"give at least one of power, level, temperature for {device.name} ({device.id})")
    allowed = CAPABILITIES[device.type]
    for field in asked:
        if field not in allowed:
            raise ToolError(
                f"{device.name} ({device.id}) is a {device.type} and supports only {', '.join(sorted(allowed))}; "
                f"it has no {field}"
            )
    if level is not None:
        lo, hi = LEVEL_RANGE[device.type]
        if not lo <= level <= hi:
            raise ToolError(f"level for a {device.type} must be between {lo} and {hi}, got {level}")
    if temperature is not None:
        if not TEMP_MIN <= temperature <= TEMP_MAX:
            raise ToolError(f"temperature must be between {TEMP_MIN} and {TEMP_MAX} °C, got {temperature}")
        if temperature * 2 != round(temperature * 2):
            raise ToolError(f"temperature must be a multiple of 0.5 °C, got {temperature}")
        asked["temperature"] = float(temperature)
    return asked


def _changed(device: Device, fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if getattr(device, k) != v}


def _require_online(device: Device) -> None:
    if not device.online:
        raise ConflictError(f"{device.name} ({device.id}) is offline and cannot be controlled")


@env.tool(kind="read")
def list_devices(db: HomeDB, room: str | None = None) -> list[Device]:
    """List the home's devices with their current state, optionally only those in one room.

    Args:
        room: Room name or id, e.g. "Kitchen" or "RM-KIT"; omit to list every device.
    """
    if room is None:
        return list(db.devices.values())
    key = room.strip().lower()
    match = next((r for r in db.rooms.values() if key in (r.id.lower(), r.name.lower())), None)
    if match is None:
        names = ", ".join(r.name for r in db.rooms.values())
        raise NotFoundError(f"no room named '{room}'; rooms: {names}", collection="rooms", id=room)
    return db.find("devices", room_id=match.id)


@env.tool(kind="read")
def get_device_status(db: HomeDB, device_id: str) -> Device:
    """Get one device's current state: online, power, level and target temperature.

    Args:
        device_id: Id of the device, as returned by list_devices.
    """
    return db.get("devices", device_id, "device")


@env.tool(kind="write")
def set_device_state(
    db: HomeDB,
    device_id: str,
    power: Power | None = None,
    level: int | None = None,
    temperature: float | None = None,
) -> Device:
    """Change an online device's state now; each device type accepts only its own settings.

    Lights take power and level (brightness 1-100), thermostats power and temperature
    (10.0-30.0 °C in 0.5 steps), plugs power only, blinds level only (0 closed - 100 open).
    Power and level are independent: setting a light's level does not switch it on.

    Args:
        device_id: Id of the device.
        power: "on" or "off".
        level: Light brightness (1-100) or blind opening in percent (0-100).
        temperature: Thermostat target temperature in °C.
    """
    device = db.get("devices", device_id, "device")
    fields = _settings(device, power, level, temperature)
    _require_online(device)
    changed = _changed(device, fields)
    if not changed:
        raise ConflictError(f"{device.name} ({device.id}) is already in that state")
    return db.update("devices", device_id, **changed)


@env.tool(kind="read")
def list_scenes(db: HomeDB) -> list[Scene]:
    """List the saved scenes with their device settings."""
    return list(db.scenes.values())


@env.tool(kind="write")
def create_scene(db: HomeDB, name: str, settings: list[SceneSetting]) -> Scene:
    """Save a scene: a named set of device settings to apply together later with activate_scene.

    Args:
        name: Scene name, unique (case-insensitive), e.g. "Movie night".
        settings: One entry per device: its device_id and the power, level and/or temperature to set.
    """
    name = name.strip()
    if not name:
        raise ToolError("name must not be empty")
    if not settings:
        raise ToolError("a scene needs at least one device setting")
    for sc in db.scenes.values():
        if sc.name.lower() == name.lower():
            raise ConflictError(f"a scene named '{sc.name}' already exists ({sc.id})")
    seen: set[str] = set()
    for st in settings:
        device = db.get("devices", st.device_id, "device")
        if st.device_id in seen:
            raise ToolError(f"device {st.device_id} appears twice in the scene")
        seen.add(st.device_id)
        _settings(device, st.power, st.level, st.temperature)
    scene = Scene(id=db.new_id("SC"), name=name, settings=settings, created_at=db.now())
    return db.create("scenes", scene.id, scene)


@env.tool(kind="write")
def activate_scene(db: HomeDB, scene_id: str) -> SceneActivation:
    """Apply every setting of a scene now; fails without changing anything if one of its devices is offline.

    Args:
        scene_id: Id of the scene, as returned by create_scene or list_scenes.
    """
    scene = db.get("scenes", scene_id, "scene")
    devices = []
    for st in scene.settings:
        device = db.get("devices", st.device_id, "device")
        _require_online(device)
        changed = _changed(device, _settings(device, st.power, st.level, st.temperature))
        devices.append(db.update("devices", device.id, **changed) if changed else device)
    db.update("scenes", scene_id, last_activated=db.now())
    return SceneActivation(scene_id=scene_id, activated_at=db.now(), devices=devices)


@env.tool(kind="write")
def delete_scene(db: HomeDB, scene_id: str) -> Scene:
    """Delete a saved scene; returns the deleted scene. Devices keep their current state.

    Args:
        scene_id: Id of the scene.
    """
    db.get("scenes", scene_id, "scene")
    return db.delete("scenes", scene_id)


@env.tool(kind="write")
def schedule_action(
    db: HomeDB,
    device_id: str,
    at: datetime,
    power: Power | None = None,
    level: int | None = None,
    temperature: float | None = None,
) -> Schedule:
    """Schedule a device state change for a future time (up to 30 days ahead, home local time).

    The settings follow the same per-type rules as set_device_state.

    Args:
        device_id: Id of the device.
        at: When to apply it, local time without timezone (YYYY-MM-DDTHH:MM:SS).
        power: "on" or "off".
        level: Light brightness (1-100) or blind opening in percent (0-100).
        temperature: Thermostat target temperature in °C.
    """
    device = db.get("devices", device_id, "device")
    now = db.now()
    if at <= now:
        raise ToolError(f"'at' ({at:%Y-%m-%d %H:%M}) must be in the future (now is {now:%Y-%m-%d %H:%M})")
    if at > now + MAX_SCHEDULE_AHEAD:
        raise ToolError(f"'at' ({at:%Y-%m-%d %H:%M}) is more than 30 days ahead")
    fields = _settings(device, power, level, temperature)
    for other in db.find("schedules", device_id=device_id, status="pending"):
        if other.at == at:
            raise ConflictError(f"{device.name} already has schedule {other.id} at {at:%Y-%m-%d %H:%M}")
    schedule = Schedule(id=db.new_id("SCH"), device_id=device_id, at=at, **fields)
    return db.create("schedules", schedule.id, schedule)


@env.tool(kind="read")
def list_schedules(db: HomeDB, device_id: str | None = None) -> list[Schedule]:
    """List scheduled actions (pending, done and cancelled) in time order, optionally for one device.

    Args:
        device_id: Only schedules of this device.
    """
    if device_id is not None:
        db.get("devices", device_id, "device")
    found = [s for s in db.schedules.values() if device_id is None or s.device_id == device_id]
    return sorted(found, key=lambda s: (s.at, s.id))


@env.tool(kind="write")
def cancel_schedule(db: HomeDB, schedule_id: str) -> Schedule:
    """Cancel a pending scheduled action.

    Args:
        schedule_id: Id of the schedule, as returned by schedule_action or list_schedules.
    """
    schedule = db.get("schedules", schedule_id, "schedule")
    if schedule.status != "pending":
        raise ConflictError(f"schedule {schedule_id} is already {schedule.status}")
    return db.update("schedules", schedule_id, status="cancelled")
