"""Hotels: search hotels, check availability, book, modify and cancel stays."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Literal

from envfactory.env import ConflictError, Environment, Record, State, ToolError


class Hotel(Record):
    id: str
    name: str
    city: str
    stars: int
    price_per_night: float
    rooms_total: int
    amenities: list[str] = []


class Booking(Record):
    id: str
    hotel_id: str
    guest_name: str
    check_in: date
    nights: int
    total_price: float
    status: Literal["confirmed", "cancelled"] = "confirmed"


class HotelSummary(Record):
    id: str
    name: str
    city: str
    stars: int
    price_per_night: float


class Availability(Record):
    hotel_id: str
    check_in: date
    nights: int
    rooms_free: int
    total_price: float


class HotelDB(State):
    hotels: dict[str, Hotel] = {}
    bookings: dict[str, Booking] = {}


env = Environment(
    "hotels",
    HotelDB,
    description="Hotel reservations: search hotels by city, check room availability, book, modify and cancel stays.",
    domain="travel",
)


def _overlaps(b: Booking, check_in: date, nights: int) -> bool:
    end = check_in + timedelta(days=nights)
    return b.status == "confirmed" and b.check_in < end and check_in < b.check_in + timedelta(days=b.nights)


def _rooms_free(db: HotelDB, hotel: Hotel, check_in: date, nights: int, ignore: str | None = None) -> int:
    taken = sum(
        1 for b in db.bookings.values() if b.hotel_id == hotel.id and b.id != ignore and _overlaps(b, check_in, nights)
    )
    return hotel.rooms_total - taken


def _check_stay(db: HotelDB, check_in: date, nights: int) -> None:
    if nights < 1 or nights > 30:
        raise ToolError(f"nights must be between 1 and 30, got {nights}")
    if check_in < db.now().date():
        raise ToolError(f"check_in {check_in} is in the past (today is {db.now().date()})")


@env.tool(kind="read")
def search_hotels(
    db: HotelDB, city: str, max_price: float | None = None, min_stars: int | None = None
) -> list[HotelSummary]:
    """Search hotels in a city, optionally under a nightly price and above a star rating.

    Args:
        city: City to search in, e.g. "Lisbon".
        max_price: Highest acceptable price per night.
        min_stars: Lowest acceptable star rating (1-5).
    """
    found = [
        h
        for h in db.hotels.values()
        if h.city.lower() == city.lower()
        and (max_price is None or h.price_per_night <= max_price)
        and (min_stars is None or h.stars >= min_stars)
    ]
    return [HotelSummary(**h.model_dump(include=set(HotelSummary.model_fields))) for h in found]


@env.tool(kind="read")
def get_hotel(db: HotelDB, hotel_id: str) -> Hotel:
    """Get the full details of a hotel.

    Args:
        hotel_id: Id of the hotel, as returned by search_hotels.
    """
    return db.get("hotels", hotel_id, "hotel")


@env.tool(kind="read")
def check_availability(db: HotelDB, hotel_id: str, check_in: date, nights: int) -> Availability:
    """Check how many rooms a hotel has free for a stay and what the stay costs.

    Args:
        hotel_id: Id of the hotel.
        check_in: Arrival date (YYYY-MM-DD).
        nights: Number of nights.
    """
    hotel = db.get("hotels", hotel_id, "hotel")
    _check_stay(db, check_in, nights)
    return Availability(
        hotel_id=hotel_id,
        check_in=check_in,
        nights=nights,
        rooms_free=_rooms_free(db, hotel, check_in, nights),
        total_price=round(hotel.price_per_night * nights, 2),
    )


@env.tool(kind="write")
def book_room(db: HotelDB, hotel_id: str, guest_name: str, check_in: date, nights: int) -> Booking:
    """Book one room at a hotel for a stay.

    Args:
        hotel_id: Id of the hotel.
        guest_name: Full name of the guest.
        check_in: Arrival date (YYYY-MM-DD).
        nights: Number of nights.
    """
    hotel = db.get("hotels", hotel_id, "hotel")
    _check_stay(db, check_in, nights)
    if not guest_name.strip():
        raise ToolError("guest_name must not be empty")
    if _rooms_free(db, hotel, check_in, nights) <= 0:
        raise ConflictError(f"{hotel.name} has no free room from {check_in} for {nights} nights")
    booking = Booking(
        id=db.new_id("BK"),
        hotel_id=hotel_id,
        guest_name=guest_name.strip(),
        check_in=check_in,
        nights=nights,
        total_price=round(hotel.price_per_night * nights, 2),
    )
    return db.create("bookings", booking.id, booking)


@env.tool(kind="read")
def get_booking(db: HotelDB, booking_id: str) -> Booking:
    """Get a booking by its id.

    Args:
        booking_id: Id of the booking, as returned by book_room.
    """
    return db.get("bookings", booking_id, "booking")


@env.tool(kind="read")
def list_bookings(db: HotelDB, guest_name: str) -> list[Booking]:
    """List all bookings (confirmed and cancelled) made under a guest's name.

    Args:
        guest_name: Full name of the guest.
    """
    return [b for b in db.bookings.values() if b.guest_name.lower() == guest_name.strip().lower()]


@env.tool(kind="write")
def modify_booking(db: HotelDB, booking_id: str, nights: int) -> Booking:
    """Change the number of nights of a confirmed booking; the price is recomputed.

    Args:
        booking_id: Id of the booking.
        nights: New number of nights.
    """
    booking = db.get("bookings", booking_id, "booking")
    if booking.status != "confirmed":
        raise ConflictError(f"booking {booking_id} is {booking.status} and cannot be modified")
    hotel = db.get("hotels", booking.hotel_id, "hotel")
    if nights < 1 or nights > 30:
        raise ToolError(f"nights must be between 1 and 30, got {nights}")
    if _rooms_free(db, hotel, booking.check_in, nights, ignore=booking_id) <= 0:
        raise ConflictError(f"{hotel.name} has no free room to extend the stay to {nights} nights")
    return db.update("bookings", booking_id, nights=nights, total_price=round(hotel.price_per_night * nights, 2))


@env.tool(kind="write")
def cancel_booking(db: HotelDB, booking_id: str) -> Booking:
    """Cancel a confirmed booking.

    Args:
        booking_id: Id of the booking.
    """
    booking = db.get("bookings", booking_id, "booking")
    if booking.status == "cancelled":
        raise ConflictError(f"booking {booking_id} is already cancelled")
    return db.update("bookings", booking_id, status="cancelled")
