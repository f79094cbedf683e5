"""Restaurants: search by city and cuisine, read menus, check and reserve tables, modify, cancel, review."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from typing import Literal

from envfactory.env import ConflictError, Environment, Record, State, ToolError

SEATING_MINUTES = 120  # a reservation holds its table this long
MAX_COMMENT = 500


class Dish(Record):
    name: str
    course: Literal["starter", "main", "dessert", "drink"]
    price: float
    vegetarian: bool = False


class Restaurant(Record):
    id: str
    name: str
    city: str
    cuisine: str
    address: str
    price_level: int  # 1 (cheap) to 4 (fine dining)
    rating: float
    review_count: int
    tables: int
    max_party_size: int
    opens: time  # first seating
    last_seating: time
    menu: list[Dish] = []


class RestaurantSummary(Record):
    id: str
    name: str
    city: str
    cuisine: str
    price_level: int
    rating: float


class TableCheck(Record):
    restaurant_id: str
    date: date
    time: time
    party_size: int
    tables_free: int
    available: bool


class Reservation(Record):
    id: str
    restaurant_id: str
    guest_name: str
    party_size: int
    date: date
    time: time
    special_requests: str = ""
    status: Literal["confirmed", "cancelled"] = "confirmed"


class Review(Record):
    id: str
    restaurant_id: str
    reservation_id: str
    guest_name: str
    rating: int
    comment: str
    created_at: datetime


class RestaurantDB(State):
    restaurants: dict[str, Restaurant] = {}
    reservations: dict[str, Reservation] = {}
    reviews: dict[str, Review] = {}


env = Environment(
    "restaurants",
    RestaurantDB,
    description=(
        "Restaurant bookings: search restaurants by city and cuisine, read menus, check and reserve tables, "
        "modify or cancel reservations and review past visits."
    ),
    domain="lifestyle",
)


def _at(day: date, at: time) -> datetime:
    return datetime.combine(day, at)


def _check_slot(db: RestaurantDB, r: Restaurant, day: date, at: time, party_size: int) -> None:
    """Reject a party size or a seating time the restaurant cannot take (whatever its bookings)."""
    if party_size < 1 or party_size > r.max_party_size:
        raise ToolError(f"{r.name} seats parties of 1 to {r.max_party_size}, got {party_size}")
    if at.minute not in (0, 30) or at.second or at.microsecond:
        raise ToolError(f"seatings are on the hour or half hour, got {at.isoformat()}")
    if at < r.opens or at > r.last_seating:
        raise ToolError(f"{r.name} seats guests from {r.opens:%H:%M} to {r.last_seating:%H:%M}, got {at:%H:%M}")
    if _at(day, at) < db.now():
        raise ToolError(f"{day} {at:%H:%M} is in the past (now is {db.now():%Y-%m-%d %H:%M})")


def _tables_free(db: RestaurantDB, r: Restaurant, day: date, at: time, ignore: str | None = None) -> int:
    start = _at(day, at)
    taken = sum(
        1
        for b in db.reservations.values()
        if b.restaurant_id == r.id
        and b.status == "confirmed"
        and b.id != ignore
        and abs(_at(b.date, b.time) - start) < timedelta(minutes=SEATING_MINUTES)
    )
    return max(r.tables - taken, 0)


def _upcoming(db: RestaurantDB, res: Reservation) -> None:
    if res.status != "confirmed":
        raise ConflictError(f"reservation {res.id} is {res.status}")
    if _at(res.date, res.time) < db.now():
        raise ConflictError(f"reservation {res.id} was for {res.date} {res.time:%H:%M}, which has passed")


@env.tool(kind="read")
def search_restaurants(
    db: RestaurantDB,
    city: str,
    cuisine: str | None = None,
    max_price_level: int | None = None,
    min_rating: float | None = None,
) -> list[RestaurantSummary]:
    """Search restaurants in a city, optionally by cuisine, price level and rating.

    Args:
        city: City to search in, e.g. "Lisbon".
        cuisine: Cuisine, e.g. "portuguese", "japanese", "vegetarian".
        max_price_level: Highest acceptable price level, from 1 (cheap) to 4 (fine dining).
        min_rating: Lowest acceptable average guest rating (1-5).
    """
    found = [
        r
        for r in db.restaurants.values()
        if r.city.lower() == city.strip().lower()
        and (cuisine is None or r.cuisine.lower() == cuisine.strip().lower())
        and (max_price_level is None or r.price_level <= max_price_level)
        and (min_rating is None or r.rating >= min_rating)
    ]
    return [RestaurantSummary(**r.model_dump(include=set(RestaurantSummary.model_fields))) for r in found]


@env.tool(kind="read")
def get_menu(db: RestaurantDB, restaurant_id: str, vegetarian_only: bool = False) -> list[Dish]:
    """Get a restaurant's menu: dishes and drinks with their course and price.

    Args:
        restaurant_id: Id of the restaurant, as returned by search_restaurants.
        vegetarian_only: Only vegetarian dishes.
    """
    r = db.get("restaurants", restaurant_id, "restaurant")
    return [d for d in r.menu if d.vegetarian or not vegetarian_only]


@env.tool(kind="read")
def check_table(db: RestaurantDB, restaurant_id: str, date: date, time: time, party_size: int) -> TableCheck:
    """Check whether a restaurant has a table free for a party at a date and time (a seating lasts 2 hours).

    Args:
        restaurant_id: Id of the restaurant.
        date: Date of the meal (YYYY-MM-DD).
        time: Seating time on the hour or half hour (HH:MM), e.g. "19:30".
        party_size: Number of guests.
    """
    r = db.get("restaurants", restaurant_id, "restaurant")
    _check_slot(db, r, date, time, party_size)
    free = _tables_free(db, r, date, time)
    return TableCheck(
        restaurant_id=restaurant_id, date=date, time=time, party_size=party_size, tables_free=free, available=free > 0
    )


@env.tool(kind="write")
def reserve_table(
    db: RestaurantDB,
    restaurant_id: str,
    guest_name: str,
    date: date,
    time: time,
    party_size: int,
    special_requests: str = "",
) -> Reservation:
    """Reserve a table at a restaurant for a party at a date and time.

    Args:
        restaurant_id: Id of the restaurant.
        guest_name: Full name the reservation is under.
        date: Date of the meal (YYYY-MM-DD).
        time: Seating time on the hour or half hour (HH:MM).
        party_size: Number of guests.
        special_requests: Notes for the restaurant, e.g. "window table", "one high chair".
    """
    r = db.get("restaurants", restaurant_id, "restaurant")
    if not guest_name.strip():
        raise ToolError("guest_name must not be empty")
    _check_slot(db, r, date, time, party_size)
    if _tables_free(db, r, date, time) <= 0:
        raise ConflictError(f"{r.name} has no table free on {date} at {time:%H:%M}")
    res = Reservation(
        id=db.new_id("RV"),
        restaurant_id=restaurant_id,
        guest_name=guest_name.strip(),
        party_size=party_size,
        date=date,
        time=time,
        special_requests=special_requests.strip(),
    )
    return db.create("reservations", res.id, res)


@env.tool(kind="read")
def get_reservation(db: RestaurantDB, reservation_id: str) -> Reservation:
    """Get a reservation by its id.

    Args:
        reservation_id: Id of the reservation, as returned by reserve_table, e.g. "RV-0001".
    """
    return db.get("reservations", reservation_id, "reservation")


@env.tool(kind="read")
def list_reservations(db: RestaurantDB, guest_name: str) -> list[Reservation]:
    """List all reservations (confirmed and cancelled) made under a guest's name.

    Args:
        guest_name: Full name the reservations are under.
    """
    return [b for b in db.reservations.values() if b.guest_name.lower() == guest_name.strip().lower()]


@env.tool(kind="write")
def modify_reservation(
    db: RestaurantDB,
    reservation_id: str,
    date: date | None = None,
    time: time | None = None,
    party_size: int | None = None,
) -> Reservation:
    """Change the date, time and/or party size of an upcoming reservation; a table must be free for the change.

    Args:
        reservation_id: Id of the reservation.
        date: New date (YYYY-MM-DD); by default the date is kept.
        time: New seating time (HH:MM); by default the time is kept.
        party_size: New number of guests; by default it is kept.
    """
    res = db.get("reservations", reservation_id, "reservation")
    if date is None and time is None and party_size is None:
        raise ToolError("give a new date, time or party_size")
    _upcoming(db, res)
    r = db.get("restaurants", res.restaurant_id, "restaurant")
    new_date = res.date if date is None else date
    new_time = res.time if time is None else time
    new_size = res.party_size if party_size is None else party_size
    _check_slot(db, r, new_date, new_time, new_size)
    if _tables_free(db, r, new_date, new_time, ignore=reservation_id) <= 0:
        raise ConflictError(f"{r.name} has no table free on {new_date} at {new_time:%H:%M}")
    changes = {
        k: v for k, v in (("date", new_date), ("time", new_time), ("party_size", new_size)) if getattr(res, k) != v
    }
    if not changes:
        raise ToolError(f"reservation {reservation_id} already has these details")
    return db.update("reservations", reservation_id, **changes)


@env.tool(kind="write")
def cancel_reservation(db: RestaurantDB, reservation_id: str) -> Reservation:
    """Cancel an upcoming reservation; its table is released.

    Args:
        reservation_id: Id of the reservation.
    """
    res = db.get("reservations", reservation_id, "reservation")
    if res.status == "cancelled":
        raise ConflictError(f"reservation {reservation_id} is already cancelled")
    _upcoming(db, res)
    return db.update("reservations", reservation_id, status="cancelled")


@env.tool(kind="write")
def leave_review(db: RestaurantDB, reservation_id: str, rating: int, comment: str) -> Review:
    """Review a past visit (one review per reservation); updates the restaurant's average rating.

    Args:
        reservation_id: Id of the reservation of the visit.
        rating: Rating from 1 (poor) to 5 (excellent).
        comment: What the guest thought, up to 500 characters.
    """
    res = db.get("reservations", reservation_id, "reservation")
    if rating < 1 or rating > 5:
        raise ToolError(f"rating must be between 1 and 5, got {rating}")
    if not comment.strip() or len(comment.strip()) > MAX_COMMENT:
        raise ToolError(f"comment must have 1 to {MAX_COMMENT} characters")
    if res.status != "confirmed":
        raise ConflictError(f"reservation {reservation_id} is {res.status}; there was no visit to review")
    if _at(res.date, res.time) > db.now():
        raise ConflictError(f"reservation {reservation_id} is for {res.date} {res.time:%H:%M}; review after the visit")
    if db.find("reviews", reservation_id=reservation_id):
        raise ConflictError(f"reservation {reservation_id} has already been reviewed")
    r = db.get("restaurants", res.restaurant_id, "restaurant")
    count = r.review_count + 1
    db.update("restaurants", r.id, rating=round((r.rating * r.review_count + rating) / count, 2), review_count=count)
    review = Review(
        id=db.new_id("REV"),
        restaurant_id=r.id,
        reservation_id=reservation_id,
        guest_name=res.guest_name,
        rating=rating,
        comment=comment.strip(),
        created_at=db.now(),
    )
    return db.create("reviews", review.id, review)
