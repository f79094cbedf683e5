"""Shop: search a product catalogue, fill a cart, check out, cancel orders and request returns."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from envfactory.env import ConflictError, Environment, Record, State, ToolError

MAX_QUANTITY = 10  # most units of one product per cart line
RETURN_WINDOW_DAYS = 30  # days after delivery during which a return can be requested


class Product(Record):
    id: str
    name: str
    category: str
    brand: str
    price: float
    stock: int
    description: str = ""


class ProductSummary(Record):
    id: str
    name: str
    category: str
    brand: str
    price: float
    in_stock: bool


class Customer(Record):
    id: str
    name: str
    email: str


class CartItem(Record):
    id: str
    customer_id: str
    product_id: str
    quantity: int


class CartLine(Record):
    cart_item_id: str
    product_id: str
    name: str
    unit_price: float
    quantity: int
    line_total: float


class Cart(Record):
    customer_id: str
    items: list[CartLine]
    total: float


class OrderLine(Record):
    product_id: str
    name: str
    unit_price: float
    quantity: int


class Order(Record):
    id: str
    customer_id: str
    lines: list[OrderLine]
    total: float
    status: Literal["placed", "shipped", "delivered", "cancelled"] = "placed"
    placed_at: datetime
    delivered_at: datetime | None = None


class ReturnRequest(Record):
    id: str
    order_id: str
    product_id: str
    quantity: int
    reason: str
    refund_amount: float
    requested_at: datetime
    status: Literal["requested", "refunded", "rejected"] = "requested"


class ShopDB(State):
    products: dict[str, Product] = {}
    customers: dict[str, Customer] = {}
    cart_items: dict[str, CartItem] = {}
    orders: dict[str, Order] = {}
    returns: dict[str, ReturnRequest] = {}


env = Environment(
    "shop",
    ShopDB,
    description=(
        "Online shop: search the product catalogue, manage a customer's cart, check out, "
        "cancel orders before they ship and request returns of delivered items."
    ),
    domain="commerce",
)


def _summary(p: Product) -> ProductSummary:
    return ProductSummary(id=p.id, name=p.name, category=p.category, brand=p.brand, price=p.price, in_stock=p.stock > 0)


def _cart_of(db: ShopDB, customer_id: str) -> list[CartItem]:
    return db.find("cart_items", customer_id=customer_id)


@env.tool(kind="read")
def search_products(
    db: ShopDB,
    query: str | None = None,
    category: str | None = None,
    max_price: float | None = None,
    in_stock_only: bool = False,
) -> list[ProductSummary]:
    """Search the catalogue by keywords and/or category; every keyword must appear in the name, brand or category.

    Args:
        query: Keywords, e.g. "wireless headphones" (case-insensitive).
        category: Only products of this category, e.g. "audio", "kitchen", "sports".
        max_price: Highest acceptable unit price.
        in_stock_only: Leave out products with no stock left.
    """
    words = (query or "").lower().split()
    if not words and not (category or "").strip():
        raise ToolError("give a query, a category, or both")
    found = []
    for p in db.products.values():
        text = f"{p.name} {p.brand} {p.category}".lower()
        if (
            all(w in text for w in words)
            and (category is None or p.category.lower() == category.strip().lower())
            and (max_price is None or p.price <= max_price)
            and (not in_stock_only or p.stock > 0)
        ):
            found.append(_summary(p))
    return found


@env.tool(kind="read")
def get_product(db: ShopDB, product_id: str) -> Product:
    """Get the full details of a product, including its price, description and units in stock.

    Args:
        product_id: Id of the product, as returned by search_products.
    """
    return db.get("products", product_id, "product")


@env.tool(kind="write")
def add_to_cart(db: ShopDB, customer_id: str, product_id: str, quantity: int = 1) -> CartItem:
    """Add units of a product to a customer's cart; adding a product already in the cart raises its quantity.

    Args:
        customer_id: Id of the customer, e.g. "CU-001".
        product_id: Id of the product, as returned by search_products.
        quantity: Number of units to add (1-10).
    """
    db.get("customers", customer_id, "customer")
    product = db.get("products", product_id, "product")
    if quantity < 1 or quantity > MAX_QUANTITY:
        raise ToolError(f"quantity must be between 1 and {MAX_QUANTITY}, got {quantity}")
    existing = db.find("cart_items", customer_id=customer_id, product_id=product_id)
    new_quantity = quantity + (existing[0].quantity if existing else 0)
    if new_quantity > MAX_QUANTITY:
        raise ConflictError(
            f"the cart already holds {existing[0].quantity} of {product.name}; at most {MAX_QUANTITY} per product"
        )
    if new_quantity > product.stock:
        raise ConflictError(f"only {product.stock} of {product.name} in stock, cannot put {new_quantity} in the cart")
    if existing:
        return db.update("cart_items", existing[0].id, quantity=new_quantity)
    item = CartItem(id=db.new_id("CI"), customer_id=customer_id, product_id=product_id, quantity=quantity)
    return db.create("cart_items", item.id, item)


@env.tool(kind="read")
def view_cart(db: ShopDB, customer_id: str) -> Cart:
    """Show a customer's cart: each line with its current unit price, and the total.

    Args:
        customer_id: Id of the customer.
    """
    db.get("customers", customer_id, "customer")
    lines = []
    for item in _cart_of(db, customer_id):
        p = db.get("products", item.product_id, "product")
        lines.append(
            CartLine(
                cart_item_id=item.id,
                product_id=p.id,
                name=p.name,
                unit_price=p.price,
                quantity=item.quantity,
                line_total=round(p.price * item.quantity, 2),
            )
        )
    return Cart(customer_id=customer_id, items=lines, total=round(sum(line.line_total for line in lines), 2))


@env.tool(kind="write")
def remove_from_cart(db: ShopDB, cart_item_id: str) -> CartItem:
    """Remove a line (all its units) from a cart; returns the removed line.

    Args:
        cart_item_id: Id of the cart line, as returned by add_to_cart or view_cart.
    """
    db.get("cart_items", cart_item_id, "cart item")
    return db.delete("cart_items", cart_item_id)


@env.tool(kind="write")
def checkout(db: ShopDB, customer_id: str) -> Order:
    """Order everything in a customer's cart at current prices; the units leave stock and the cart is emptied.

    Args:
        customer_id: Id of the customer.
    """
    db.get("customers", customer_id, "customer")
    items = _cart_of(db, customer_id)
    if not items:
        raise ConflictError(f"the cart of {customer_id} is empty")
    needed: dict[str, int] = {}
    for item in items:
        needed[item.product_id] = needed.get(item.product_id, 0) + item.quantity
    for product_id, units in needed.items():
        p = db.get("products", product_id, "product")
        if units > p.stock:
            raise ConflictError(f"only {p.stock} of {p.name} left in stock, the cart holds {units}")
    lines = []
    for item in items:
        p = db.get("products", item.product_id, "product")
        lines.append(OrderLine(product_id=p.id, name=p.name, unit_price=p.price, quantity=item.quantity))
    order = Order(
        id=db.new_id("ORD"),
        customer_id=customer_id,
        lines=lines,
        total=round(sum(line.unit_price * line.quantity for line in lines), 2),
        placed_at=db.now(),
    )
    for product_id, units in needed.items():
        db.update("products", product_id, stock=db.products[product_id].stock - units)
    for item in items:
        db.delete("cart_items", item.id)
    return db.create("orders", order.id, order)


@env.tool(kind="read")
def get_order(db: ShopDB, order_id: str) -> Order:
    """Get an order by its id: lines, total, status and delivery date.

    Args:
        order_id: Id of the order, as returned by checkout, e.g. "ORD-0001".
    """
    return db.get("orders", order_id, "order")


@env.tool(kind="write")
def cancel_order(db: ShopDB, order_id: str) -> Order:
    """Cancel an order that has not shipped yet; its units go back into stock.

    Args:
        order_id: Id of the order.
    """
    order = db.get("orders", order_id, "order")
    if order.status == "cancelled":
        raise ConflictError(f"order {order_id} is already cancelled")
    if order.status != "placed":
        raise ConflictError(f"order {order_id} is {order.status} and can no longer be cancelled; request a return")
    for line in order.lines:
        p = db.get("products", line.product_id, "product")
        db.update("products", p.id, stock=p.stock + line.quantity)
    return db.update("orders", order_id, status="cancelled")


@env.tool(kind="write")
def request_return(db: ShopDB, order_id: str, product_id: str, quantity: int, reason: str) -> ReturnRequest:
    """Request the return of units of a delivered order (within 30 days of delivery); the refund is their price paid.

    Args:
        order_id: Id of the delivered order.
        product_id: Id of the product to return; it must be a line of the order.
        quantity: Number of units to return.
        reason: Why the units are returned, e.g. "arrived damaged".
    """
    order = db.get("orders", order_id, "order")
    line = next((ln for ln in order.lines if ln.product_id == product_id), None)
    if line is None:
        raise ToolError(f"order {order_id} has no line for product '{product_id}'")
    if quantity < 1:
        raise ToolError(f"quantity must be at least 1, got {quantity}")
    if not reason.strip():
        raise ToolError("reason must not be empty")
    if order.status != "delivered" or order.delivered_at is None:
        raise ConflictError(f"order {order_id} is {order.status}; only delivered orders can be returned")
    deadline = order.delivered_at + timedelta(days=RETURN_WINDOW_DAYS)
    if db.now() > deadline:
        raise ConflictError(f"the return window of order {order_id} closed on {deadline.date()}")
    returned = sum(
        r.quantity for r in db.find("returns", order_id=order_id, product_id=product_id) if r.status != "rejected"
    )
    if returned + quantity > line.quantity:
        raise ConflictError(
            f"order {order_id} has {line.quantity} of {line.name} and {returned} already returned; "
            f"cannot return {quantity} more"
        )
    ret = ReturnRequest(
        id=db.new_id("RT"),
        order_id=order_id,
        product_id=product_id,
        quantity=quantity,
        reason=reason.strip(),
        refund_amount=round(line.unit_price * quantity, 2),
        requested_at=db.now(),
    )
    return db.create("returns", ret.id, ret)
