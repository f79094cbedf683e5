"""Flights: search flights, book seats in a cabin, pick seats, add bags and cancel with refund rules."""

from __future__ import annotations

import re
from datetime import date, datetime
from typing import Literal

from pydantic import Field

from envfactory.env import ConflictError, Environment, Record, State, ToolError

Cabin = Literal["economy", "business"]

# The seat map every aircraft of the pool shares: business rows 1-3 (seats A, C, D, F),
# economy rows 10-30 (seats A-F).
SEAT_LAYOUT: dict[str, tuple[range, str]] = {
    "business": (range(1, 4), "ACDF"),
    "economy": (range(10, 31), "ABCDEF"),
}
BAG_FEE = 40.0
MAX_BAGS = 3
FREE_BAGS: dict[str, int] = {"economy": 0, "business": 2}
_SEAT = re.compile(r"^(\d{1,2})([A-Z])$")


class Flight(Record):
    id: str
    airline: str
    flight_number: str
    origin: str
    destination: str
    departure: datetime
    arrival: datetime
    aircraft: str
    fares: dict[Cabin, float]
    seats_available: dict[Cabin, int]


class FlightSummary(Record):
    id: str
    flight_number: str
    origin: str
    destination: str
    departure: datetime
    arrival: datetime
    fares: dict[Cabin, float]
    seats_available: dict[Cabin, int]


class FlightBooking(Record):
    id: str
    flight_id: str
    passenger_name: str
    cabin: Cabin
    fare: float
    seat: str | None = None
    bags: int = 0
    baggage_fees: float = 0.0
    booked_at: datetime
    status: Literal["confirmed", "cancelled"] = "confirmed"
    refund: float | None = None


class FlightDB(State):
    flights: dict[str, Flight] = Field(default_factory=dict)
    bookings: dict[str, FlightBooking] = Field(default_factory=dict)


env = Environment(
    "flights",
    FlightDB,
    description=(
        "Airline reservations: search flights by route and date, book a seat in economy or business, "
        "choose a seat, add checked bags and cancel bookings with fare-dependent refunds."
    ),
    domain="travel",
)


def _airport(code: str, what: str) -> str:
    code = code.strip().upper()
    if len(code) != 3 or not code.isalpha():
        raise ToolError(f"{what} must be a 3-letter IATA airport code, got {code!r}")
    return code


def _live_booking(db: FlightDB, booking_id: str) -> tuple[FlightBooking, Flight]:
    """A confirmed booking whose flight has not departed yet, and its flight."""
    booking = db.get("bookings", booking_id, "booking")
    if booking.status != "confirmed":
        raise ConflictError(f"booking {booking_id} is {booking.status}")
    flight = db.get("flights", booking.flight_id, "flight")
    if flight.departure <= db.now():
        raise ConflictError(f"flight {flight.flight_number} departed at {flight.departure:%Y-%m-%d %H:%M}")
    return booking, flight


def _refund(db: FlightDB, booking: FlightBooking, flight: Flight) -> float:
    """Business fares are fully refundable; economy: 100% a week or more ahead, 50% a day or more, else 0."""
    hours_left = (flight.departure - db.now()).total_seconds() / 3600
    if booking.cabin == "business" or hours_left >= 7 * 24:
        share = 1.0
    elif hours_left >= 24:
        share = 0.5
    else:
        share = 0.0
    return round(booking.fare * share + booking.baggage_fees, 2)


@env.tool(kind="read")
def search_flights(
    db: FlightDB, origin: str, destination: str, date: date, cabin: Cabin | None = None
) -> list[FlightSummary]:
    """Search the flights of a route departing on a date, earliest first, with fares and seats left per cabin.

    Args:
        origin: IATA code of the departure airport, e.g. "LIS".
        destination: IATA code of the arrival airport, e.g. "MAD".
        date: Departure date (YYYY-MM-DD).
        cabin: Only flights with at least one seat left in this cabin ("economy" or "business").
    """
    origin, destination = _airport(origin, "origin"), _airport(destination, "destination")
    if origin == destination:
        raise ToolError(f"origin and destination are both {origin}")
    found = sorted(
        (
            f
            for f in db.flights.values()
            if f.origin == origin
            and f.destination == destination
            and f.departure.date() == date
            and (cabin is None or f.seats_available.get(cabin, 0) > 0)
        ),
        key=lambda f: (f.departure, f.id),
    )
    return [FlightSummary(**f.model_dump(include=set(FlightSummary.model_fields))) for f in found]


@env.tool(kind="read")
def get_flight(db: FlightDB, flight_id: str) -> Flight:
    """Get the full details of a flight: airline, times, aircraft, fares and seats left per cabin.

    Args:
        flight_id: Id of the flight, as returned by search_flights.
    """
    return db.get("flights", flight_id, "flight")


@env.tool(kind="write")
def book_flight(db: FlightDB, flight_id: str, passenger_name: str, cabin: Cabin = "economy") -> FlightBooking:
    """Book one seat on a flight for a passenger in a cabin, at the cabin's current fare.

    Args:
        flight_id: Id of the flight, as returned by search_flights.
        passenger_name: Full name of the passenger, as on their passport.
        cabin: Cabin to fly in: "economy" or "business".
    """
    flight = db.get("flights", flight_id, "flight")
    name = passenger_name.strip()
    if not name:
        raise ToolError("passenger_name must not be empty")
    if flight.departure <= db.now():
        raise ConflictError(f"flight {flight.flight_number} departed at {flight.departure:%Y-%m-%d %H:%M}")
    left = flight.seats_available.get(cabin, 0)
    if left <= 0:
        raise ConflictError(f"flight {flight.flight_number} has no {cabin} seat left")
    for b in db.find("bookings", flight_id=flight_id, status="confirmed"):
        if b.passenger_name.lower() == name.lower():
            raise ConflictError(f"{name} already holds booking {b.id} on flight {flight.flight_number}")
    db.update("flights", flight_id, seats_available={**flight.seats_available, cabin: left - 1})
    booking = FlightBooking(
        id=db.new_id("FB"),
        flight_id=flight_id,
        passenger_name=name,
        cabin=cabin,
        fare=flight.fares[cabin],
        booked_at=db.now(),
    )
    return db.create("bookings", booking.id, booking)


@env.tool(kind="read")
def get_flight_booking(db: FlightDB, booking_id: str) -> FlightBooking:
    """Get a flight booking by its id: flight, cabin, fare, seat, bags and status.

    Args:
        booking_id: Id of the booking, as returned by book_flight or list_passenger_bookings.
    """
    return db.get("bookings", booking_id, "booking")


@env.tool(kind="read")
def list_passenger_bookings(db: FlightDB, passenger_name: str) -> list[FlightBooking]:
    """List every booking (confirmed and cancelled) made for a passenger, by full name.

    Args:
        passenger_name: Full name of the passenger.
    """
    name = passenger_name.strip().lower()
    return [b for b in db.bookings.values() if b.passenger_name.lower() == name]


@env.tool(kind="write")
def select_seat(db: FlightDB, booking_id: str, seat: str) -> FlightBooking:
    """Choose (or change) the seat of a confirmed booking; the seat must be free and in the booked cabin.

    Business seats are rows 1-3, letters A, C, D, F; economy seats are rows 10-30, letters A-F.

    Args:
        booking_id: Id of the booking.
        seat: Seat code, row then letter, e.g. "12C".
    """
    booking, flight = _live_booking(db, booking_id)
    code = seat.strip().upper()
    m = _SEAT.match(code)
    if m is None:
        raise ToolError(f"seat must be a row number and a letter, e.g. '12C', got {seat!r}")
    row, letter = int(m.group(1)), m.group(2)
    seat_cabin = next((c for c, (rows, letters) in SEAT_LAYOUT.items() if row in rows and letter in letters), None)
    if seat_cabin is None:
        raise ToolError(f"seat {code} does not exist on this aircraft")
    if seat_cabin != booking.cabin:
        raise ToolError(f"seat {code} is in {seat_cabin}, but booking {booking_id} is in {booking.cabin}")
    if booking.seat == code:
        raise ConflictError(f"booking {booking_id} already has seat {code}")
    taken = db.find("bookings", flight_id=flight.id, status="confirmed", seat=code)
    if taken:
        raise ConflictError(f"seat {code} on flight {flight.flight_number} is taken by booking {taken[0].id}")
    return db.update("bookings", booking_id, seat=code)


@env.tool(kind="write")
def add_baggage(db: FlightDB, booking_id: str, bags: int = 1) -> FlightBooking:
    """Add checked bags to a confirmed booking (at most 3 per booking) and charge their fee.

    Each bag costs 40.00; business bookings include their first 2 bags free.

    Args:
        booking_id: Id of the booking.
        bags: Number of bags to add (1-3).
    """
    booking, _ = _live_booking(db, booking_id)
    if bags < 1 or bags > MAX_BAGS:
        raise ToolError(f"bags must be between 1 and {MAX_BAGS}, got {bags}")
    total = booking.bags + bags
    if total > MAX_BAGS:
        raise ConflictError(
            f"booking {booking_id} already has {booking.bags} bag(s); at most {MAX_BAGS} are allowed in all"
        )
    free = FREE_BAGS[booking.cabin]
    paid = max(0, total - free) - max(0, booking.bags - free)
    return db.update("bookings", booking_id, bags=total, baggage_fees=round(booking.baggage_fees + paid * BAG_FEE, 2))


@env.tool(kind="write")
def cancel_flight_booking(db: FlightDB, booking_id: str) -> FlightBooking:
    """Cancel a confirmed booking before departure, free its seat and record the refund.

    Refund: business fares are refunded in full; economy fares in full 7 days (168 hours) or more
    before departure, 50% from 24 hours before, nothing later. Baggage fees are always refunded.

    Args:
        booking_id: Id of the booking.
    """
    booking, flight = _live_booking(db, booking_id)
    refund = _refund(db, booking, flight)
    seats = {**flight.seats_available, booking.cabin: flight.seats_available.get(booking.cabin, 0) + 1}
    db.update("flights", flight.id, seats_available=seats)
    return db.update("bookings", booking_id, status="cancelled", refund=refund)
