"""The BFCL classes envfactory knows, and where the installed `bfcl-eval` keeps them.

The per-class table (environment name, domain, hand-checked read/write kinds), the corrections to
BFCL's function docs that its own data calls for, and lookups into the installed package (classes,
function docs, data folder, versions). BFCL itself is imported only when a lookup needs it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envfactory.env.metadata import Domain
from envfactory.errors import ScenarioError
from envfactory.inputs import json_lines, parse_json, read_text


@dataclass(frozen=True)
class _Suite:
    env: str
    cls: str
    domain: Domain
    read: frozenset[str]
    write: frozenset[str]


def _suite(env: str, cls: str, domain: Domain, *, read: str, write: str) -> _Suite:
    return _Suite(env, cls, domain, frozenset(read.split()), frozenset(write.split()))


# Read = changes no attribute that dump_state keeps (checked by replaying BFCL's ground truth).
# Notes: `cd` is a write (the working directory is session state); `echo` is a write (it writes a
# file when given one); `get_flight_cost` only refills a private cache; `get_current_speed` and the
# outside-temperature tools draw from the RNG, which is not dumped (why: see `dump.py`).
_SUITES: tuple[_Suite, ...] = (
    _suite(
        "bfcl_file_system",
        "GorillaFileSystem",
        "office",
        read="cat diff du find grep ls pwd sort tail wc",
        write="cd cp echo mkdir mv rm rmdir touch",
    ),
    _suite(
        "bfcl_math",
        "MathAPI",
        "utilities",
        read="absolute_value add divide imperial_si_conversion logarithm max_value mean min_value multiply "
        "percentage power round_number si_unit_conversion square_root standard_deviation subtract sum_values",
        write="",
    ),
    _suite(
        "bfcl_message",
        "MessageAPI",
        "office",
        read="get_message_stats get_user_id list_users message_get_login_status search_messages view_messages_sent",
        write="add_contact delete_message message_login send_message",
    ),
    _suite(
        "bfcl_posting",
        "TwitterAPI",
        "lifestyle",
        read="get_tweet get_tweet_comments get_user_stats get_user_tweets list_all_following "
        "posting_get_login_status search_tweets",
        write="authenticate_twitter comment follow_user mention post_tweet retweet unfollow_user",
    ),
    _suite(
        "bfcl_ticket",
        "TicketAPI",
        "office",
        read="get_ticket get_user_tickets ticket_get_login_status",
        write="close_ticket create_ticket edit_ticket logout resolve_ticket ticket_login",
    ),
    _suite(
        "bfcl_trading",
        "TradingBot",
        "finance",
        read="filter_stocks_by_price get_account_info get_available_stocks get_current_time get_order_details "
        "get_order_history get_stock_info get_symbol_by_name get_transaction_history get_watchlist "
        "notify_price_change trading_get_login_status",
        write="add_to_watchlist cancel_order fund_account place_order remove_stock_from_watchlist trading_login "
        "trading_logout withdraw_funds",
    ),
    _suite(
        "bfcl_travel",
        "TravelAPI",
        "travel",
        read="compute_exchange_rate contact_customer_support get_all_credit_cards get_booking_history "
        "get_budget_fiscal_year get_credit_card_balance get_flight_cost get_nearest_airport_by_city "
        "list_all_airports retrieve_invoice travel_get_login_status verify_traveler_information",
        write="authenticate_travel book_flight cancel_booking purchase_insurance register_credit_card set_budget_limit",
    ),
    _suite(
        "bfcl_vehicle",
        "VehicleControlAPI",
        "lifestyle",
        read="check_tire_pressure displayCarStatus display_log estimate_distance estimate_drive_feasibility_by_mileage "
        "find_nearest_tire_shop gallon_to_liter get_current_speed get_outside_temperature_from_google "
        "get_outside_temperature_from_weather_com get_zipcode_based_on_city liter_to_gallon",
        write="activateParkingBrake adjustClimateControl fillFuelTank lockDoors pressBrakePedal releaseBrakePedal "
        "setCruiseControl setHeadlights set_navigation startEngine",
    ),
)
SUITES_BY_CLASS: dict[str, _Suite] = {s.cls: s for s in _SUITES}
SUITES_BY_ENV: dict[str, _Suite] = {s.env: s for s in _SUITES}

# Corrections to BFCL's docs where its own data contradicts them (found by replaying its ground truth).
# TicketAPI documents ticket ids as integers, but some initial configs use string ids ("ticket_001",
# multi_turn_base_173) and the ground truth passes them: either is accepted.
_INPUT_PATCHES: dict[tuple[str, str], dict[str, Any]] = {
    ("TicketAPI", "ticket_id"): {"type": ["integer", "string"]},
    # MathAPI's logarithm and square_root set mpmath's / decimal's digits to `precision`: 60,000 took 1.7 s of CPU
    # (with the GIL: a served hub's other sessions waited), 300,000 31 s. BFCL's data asks for 2 to 10.
    ("MathAPI", "precision"): {"minimum": 1, "maximum": 1000},
}
# Tools that return None on success (documented as a dict): their output may be null.
_NULLABLE_OUTPUT: dict[str, frozenset[str]] = {"GorillaFileSystem": frozenset({"mkdir", "touch", "echo"})}
# Tools whose documented `response` does not describe what the method returns (a list, fields of
# other types, a list in place of the error dict), so they get no output schema rather than a wrong one.
_UNDOCUMENTED_RESPONSES: dict[str, frozenset[str]] = {
    "MessageAPI": frozenset({"send_message"}),  # message_id is {"new_id": n}, documented as an integer
    "TwitterAPI": frozenset({"get_user_tweets", "search_tweets", "get_tweet_comments"}),  # lists
    "TicketAPI": frozenset({"get_user_tickets", "get_ticket"}),  # a list; ticket fields as the config has them
    "TradingBot": frozenset({"get_watchlist", "get_order_history", "get_transaction_history"}),  # lists if logged out
    "TravelAPI": frozenset({"list_all_airports"}),  # a list of codes
}


# BFCL's multi-turn categories that need no data beyond bfcl-eval's own (composite needs more)
MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")


def available() -> bool:
    """Whether `bfcl-eval` is installed (its multi-turn classes and data)."""
    try:
        return importlib.util.find_spec("bfcl_eval") is not None
    except (ImportError, ValueError):
        return False


def _backend() -> tuple[dict[str, str], dict[str, str], list[str]]:
    """BFCL's own maps: class → module, class → func doc file; and its stateless classes."""
    from bfcl_eval.constants import executable_backend_config as cfg

    return dict(cfg.CLASS_FILE_PATH_MAPPING), dict(cfg.MULTI_TURN_FUNC_DOC_FILE_MAPPING), list(cfg.STATELESS_CLASSES)


def data_dir() -> Path:
    """The installed package's data folder (test entries, ground truth, function docs)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or spec.origin is None:
        raise ScenarioError("bfcl-eval is not installed")
    return Path(spec.origin).parent / "data"


def _version_prefix() -> str:
    from bfcl_eval.constants.category_mapping import VERSION_PREFIX

    return str(VERSION_PREFIX)


def bfcl_version() -> str:
    try:
        return importlib.metadata.version("bfcl-eval")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def load_class(class_name: str) -> type[Any]:
    """The BFCL class named `class_name` (raises ImportError when its module or a dependency is missing)."""
    modules, _, _ = _backend()
    if class_name not in modules:
        raise ImportError(f"bfcl-eval has no multi-turn class '{class_name}'")
    cls = getattr(importlib.import_module(modules[class_name]), class_name)
    assert isinstance(cls, type)
    return cls


@functools.cache
def class_importable(class_name: str) -> bool:
    """Whether the class and its dependencies import here (MathAPI needs `mpmath`)."""
    try:
        load_class(class_name)
    except ImportError:
        return False
    return True


@functools.cache
def func_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs for one class, as shipped in `multi_turn_func_doc/`."""
    _, doc_files, _ = _backend()
    path = data_dir() / "multi_turn_func_doc" / doc_files[class_name]
    return tuple(read_jsonl(path))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A BFCL data file: one JSON document a line, bounded and parsed with one-line errors."""
    text = read_text(path, what="BFCL data file", error=ScenarioError)
    return [parse_json(line, f"{path}:{n}", error=ScenarioError) for n, line in json_lines(text)]
