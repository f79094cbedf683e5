"""Every tool of `shop`: results, error cases, state transitions."""

from __future__ import annotations

import pytest

from envfactory.env import Session
from envfactory.env.pool import EnvPool
from tests.envs.helpers import fails, ok


@pytest.fixture()
def s(pool: EnvPool) -> Session:
    # strict: every call also diffs full dumps, proving the tools write only through CRUD helpers
    return pool.get("shop").session("default", strict=True)


def test_search_products(s: Session) -> None:
    assert [p["id"] for p in ok(s, "search_products", query="sonique")] == ["PR-1001", "PR-1002"]
    assert [p["id"] for p in ok(s, "search_products", query="Wireless HEADPHONES")] == ["PR-1001"]
    # every keyword must match somewhere: "kitchen" is the category, "knife" the name
    assert [p["id"] for p in ok(s, "search_products", query="kitchen knife")] == ["PR-2003"]
    assert [p["id"] for p in ok(s, "search_products", category="kitchen", max_price=50)] == ["PR-2002"]
    audio = ok(s, "search_products", category="Audio")
    assert [(p["id"], p["in_stock"]) for p in audio] == [("PR-1001", True), ("PR-1002", True), ("PR-1003", False)]
    assert [p["id"] for p in ok(s, "search_products", category="audio", in_stock_only=True)] == ["PR-1001", "PR-1002"]
    assert ok(s, "search_products", query="shoes", category="kitchen") == []
    assert ok(s, "search_products", query="yoga")[0] == {
        "id": "PR-3002",
        "name": "Yoga Mat Pro",
        "category": "sports",
        "brand": "Stride",
        "price": 42.0,
        "in_stock": True,
    }
    fails(s, "search_products", "tool_error")  # neither a query nor a category
    fails(s, "search_products", "tool_error", query="   ")
    fails(s, "search_products", "invalid_arguments", query="mat", max_price="cheap")


def test_get_product(s: Session) -> None:
    p = ok(s, "get_product", product_id="PR-2001")
    assert (p["name"], p["brand"], p["price"], p["stock"]) == ("Brew Master Coffee Grinder", "Mokka", 79.0, 3)
    fails(s, "get_product", "not_found", product_id="PR-9999")
    fails(s, "get_product", "invalid_arguments")


def test_add_to_cart_new_line(s: Session) -> None:
    rec = s.call("add_to_cart", {"customer_id": "CU-002", "product_id": "PR-1001", "quantity": 2})
    assert rec.ok and rec.result == {"id": "CI-0003", "customer_id": "CU-002", "product_id": "PR-1001", "quantity": 2}
    assert rec.diff.added == ["cart_items.CI-0003"] and rec.diff.changed == ["counters.CI"]
    assert [c.op for c in rec.changes] == ["counter", "create"]
    cart = ok(s, "view_cart", customer_id="CU-002")
    assert cart["items"] == [
        {
            "cart_item_id": "CI-0003",
            "product_id": "PR-1001",
            "name": "Aurora Wireless Headphones",
            "unit_price": 129.99,
            "quantity": 2,
            "line_total": 259.98,
        }
    ]
    assert cart["total"] == 259.98


def test_add_to_cart_same_product_raises_quantity(s: Session) -> None:
    rec = s.call("add_to_cart", {"customer_id": "CU-001", "product_id": "PR-1002", "quantity": 3})
    assert rec.ok and rec.result["id"] == "CI-0001" and rec.result["quantity"] == 5  # 2 already in the cart
    assert rec.diff.changed == ["cart_items.CI-0001.quantity"] and not rec.diff.added
    assert s.dump()["counters"]["CI"] == 2  # no new id used
    assert ok(s, "add_to_cart", customer_id="CU-003", product_id="PR-3002")["quantity"] == 1  # default quantity


def test_add_to_cart_errors(s: Session) -> None:
    fails(s, "add_to_cart", "not_found", customer_id="CU-999", product_id="PR-1001")
    fails(s, "add_to_cart", "not_found", customer_id="CU-002", product_id="PR-0000")
    fails(s, "add_to_cart", "tool_error", customer_id="CU-002", product_id="PR-1001", quantity=0)
    fails(s, "add_to_cart", "tool_error", customer_id="CU-002", product_id="PR-1001", quantity=11)
    fails(s, "add_to_cart", "conflict", customer_id="CU-002", product_id="PR-2003", quantity=3)  # stock 2
    fails(s, "add_to_cart", "conflict", customer_id="CU-002", product_id="PR-1003")  # out of stock
    fails(s, "add_to_cart", "conflict", customer_id="CU-001", product_id="PR-1002", quantity=9)  # 2 + 9 > 10
    fails(s, "add_to_cart", "conflict", customer_id="CU-001", product_id="PR-2002", quantity=8)  # 1 + 8 > stock 8
    fails(s, "add_to_cart", "invalid_arguments", customer_id="CU-002", product_id="PR-1001", quantity="2")
    fails(s, "add_to_cart", "invalid_arguments", customer_id="CU-002")


def test_view_cart(s: Session) -> None:
    cart = ok(s, "view_cart", customer_id="CU-001")
    assert [
        (i["cart_item_id"], i["product_id"], i["unit_price"], i["quantity"], i["line_total"]) for i in cart["items"]
    ] == [
        ("CI-0001", "PR-1002", 59.5, 2, 119.0),
        ("CI-0002", "PR-2002", 34.5, 1, 34.5),
    ]
    assert cart["total"] == 153.5
    assert ok(s, "view_cart", customer_id="CU-003") == {"customer_id": "CU-003", "items": [], "total": 0.0}
    fails(s, "view_cart", "not_found", customer_id="CU-999")


def test_remove_from_cart(s: Session) -> None:
    rec = s.call("remove_from_cart", {"cart_item_id": "CI-0002"})
    assert rec.ok and rec.result == {"id": "CI-0002", "customer_id": "CU-001", "product_id": "PR-2002", "quantity": 1}
    assert rec.diff.removed == ["cart_items.CI-0002"] and not rec.diff.added and not rec.diff.changed
    assert [c.op for c in rec.changes] == ["delete"]
    assert ok(s, "view_cart", customer_id="CU-001")["total"] == 119.0
    fails(s, "remove_from_cart", "not_found", cart_item_id="CI-0002")


def test_checkout(s: Session) -> None:
    rec = s.call("checkout", {"customer_id": "CU-001"})
    assert rec.ok
    assert rec.result == {
        "id": "ORD-0006",
        "customer_id": "CU-001",
        "lines": [
            {"product_id": "PR-1002", "name": "Pulse Bluetooth Speaker", "unit_price": 59.5, "quantity": 2},
            {"product_id": "PR-2002", "name": "Ceramic Pour-Over Set", "unit_price": 34.5, "quantity": 1},
        ],
        "total": 153.5,
        "status": "placed",
        "placed_at": "2026-03-10T10:00:00",
        "delivered_at": None,
    }
    assert rec.diff.added == ["orders.ORD-0006"]
    assert rec.diff.removed == ["cart_items.CI-0001", "cart_items.CI-0002"]
    assert rec.diff.changed == ["counters.ORD", "products.PR-1002.stock", "products.PR-2002.stock"]
    assert ok(s, "get_product", product_id="PR-1002")["stock"] == 10  # 12 - 2
    assert ok(s, "get_product", product_id="PR-2002")["stock"] == 7  # 8 - 1
    assert ok(s, "view_cart", customer_id="CU-001")["items"] == []
    assert ok(s, "get_order", order_id="ORD-0006") == rec.result
    fails(s, "checkout", "conflict", customer_id="CU-001")  # the cart is empty now
    fails(s, "checkout", "conflict", customer_id="CU-004")
    fails(s, "checkout", "not_found", customer_id="CU-999")


def test_checkout_last_unit_goes_to_first_buyer(pool: EnvPool) -> None:
    s = pool.get("shop").session("holiday_rush", strict=True)
    # CU-101 and CU-102 both hold the only Cashmere Scarf (PR-4001, stock 1) in their carts
    assert ok(s, "checkout", customer_id="CU-101")["total"] == 65.0
    assert ok(s, "get_product", product_id="PR-4001")["stock"] == 0
    fails(s, "checkout", "conflict", customer_id="CU-102")  # nothing is ordered, the cart stays whole
    assert [i["cart_item_id"] for i in ok(s, "view_cart", customer_id="CU-102")["items"]] == ["CI-0002", "CI-0003"]
    ok(s, "remove_from_cart", cart_item_id="CI-0002")
    order = ok(s, "checkout", customer_id="CU-102")
    assert order["id"] == "ORD-0005" and order["total"] == 37.5  # 3 cookie cutter sets at 12.50
    assert ok(s, "get_product", product_id="PR-5002")["stock"] == 27


def test_get_order(s: Session) -> None:
    order = ok(s, "get_order", order_id="ORD-0002")
    assert order["status"] == "shipped" and order["total"] == 213.99 and order["customer_id"] == "CU-002"
    assert [(ln["product_id"], ln["quantity"]) for ln in order["lines"]] == [("PR-1001", 1), ("PR-3002", 2)]
    assert ok(s, "get_order", order_id="ORD-0001")["delivered_at"] == "2026-02-24T14:00:00"
    fails(s, "get_order", "not_found", order_id="ORD-9999")


def test_cancel_order_restores_stock(s: Session) -> None:
    rec = s.call("cancel_order", {"order_id": "ORD-0003"})
    assert rec.ok and rec.result["status"] == "cancelled"
    assert rec.diff.changed == ["orders.ORD-0003.status", "products.PR-2003.stock"]
    assert ok(s, "get_product", product_id="PR-2003")["stock"] == 3  # 2 + the 1 knife of the order
    fails(s, "cancel_order", "conflict", order_id="ORD-0003")  # already cancelled
    fails(s, "cancel_order", "conflict", order_id="ORD-0002")  # shipped
    fails(s, "cancel_order", "conflict", order_id="ORD-0001")  # delivered
    fails(s, "cancel_order", "conflict", order_id="ORD-0005")  # cancelled in the scenario
    fails(s, "cancel_order", "not_found", order_id="ORD-9999")


def test_request_return(s: Session) -> None:
    rec = s.call(
        "request_return", {"order_id": "ORD-0001", "product_id": "PR-3001", "quantity": 1, "reason": " Too small "}
    )
    assert rec.ok and rec.result == {
        "id": "RT-0003",
        "order_id": "ORD-0001",
        "product_id": "PR-3001",
        "quantity": 1,
        "reason": "Too small",
        "refund_amount": 110.0,
        "requested_at": "2026-03-10T10:00:00",
        "status": "requested",
    }
    assert rec.diff.added == ["returns.RT-0003"] and rec.diff.changed == ["counters.RT"]
    fails(s, "request_return", "conflict", order_id="ORD-0001", product_id="PR-3001", quantity=1, reason="again")


def test_request_return_counts_earlier_returns(s: Session) -> None:
    # ORD-0001 has 2 yoga mats and RT-0001 already returns 1 of them
    fails(s, "request_return", "conflict", order_id="ORD-0001", product_id="PR-3002", quantity=2, reason="x")
    assert (
        ok(s, "request_return", order_id="ORD-0001", product_id="PR-3002", quantity=1, reason="x")["refund_amount"]
        == 42.0
    )
    fails(s, "request_return", "conflict", order_id="ORD-0001", product_id="PR-3002", quantity=1, reason="x")


def test_request_return_errors(s: Session) -> None:
    args = {"product_id": "PR-3001", "quantity": 1, "reason": "broken"}
    fails(s, "request_return", "not_found", order_id="ORD-9999", **args)
    fails(s, "request_return", "conflict", order_id="ORD-0002", product_id="PR-1001", quantity=1, reason="x")  # shipped
    # ORD-0004 was delivered on 2026-01-20: the 30-day window closed on 2026-02-19
    fails(s, "request_return", "conflict", order_id="ORD-0004", product_id="PR-2001", quantity=1, reason="x")
    fails(s, "request_return", "tool_error", order_id="ORD-0001", product_id="PR-1001", quantity=1, reason="x")
    fails(s, "request_return", "tool_error", order_id="ORD-0001", product_id="PR-3001", quantity=0, reason="x")
    fails(s, "request_return", "tool_error", order_id="ORD-0001", product_id="PR-3001", quantity=1, reason="  ")
    fails(s, "request_return", "invalid_arguments", order_id="ORD-0001", product_id="PR-3001", quantity=1)


def test_chain_search_cart_checkout_cancel(s: Session) -> None:
    product = ok(s, "search_products", query="coffee grinder")[0]
    assert product["id"] == "PR-2001" and ok(s, "get_product", product_id=product["id"])["stock"] == 3
    item = ok(s, "add_to_cart", customer_id="CU-004", product_id=product["id"], quantity=2)
    assert ok(s, "view_cart", customer_id="CU-004")["total"] == 158.0
    order = ok(s, "checkout", customer_id="CU-004")
    assert order["lines"][0]["quantity"] == 2 and order["total"] == 158.0
    assert not s.dump()["cart_items"].get(item["id"])
    assert ok(s, "get_product", product_id="PR-2001")["stock"] == 1
    fails(s, "add_to_cart", "conflict", customer_id="CU-004", product_id="PR-2001", quantity=2)  # 1 left
    assert ok(s, "cancel_order", order_id=order["id"])["status"] == "cancelled"
    assert ok(s, "get_product", product_id="PR-2001")["stock"] == 3
    assert ok(s, "get_order", order_id=order["id"])["status"] == "cancelled"
    fails(s, "request_return", "conflict", order_id=order["id"], product_id="PR-2001", quantity=1, reason="x")
