"""The demo shop's seed: its customers and their orders, as `seed_demo_data` inserts them and `/admin/reset` puts
them back (db.py)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


DEMO_CUSTOMERS = [
    {"customer_id": "cus_1001", "name": "Alice Martin", "email": "alice.martin@example.com"},
    {"customer_id": "cus_1002", "name": "Bob Okafor", "email": "bob.okafor@example.com"},
    {"customer_id": "cus_1003", "name": "Carol Nguyen", "email": "carol.nguyen@example.com"},
]


def _item(sku: str, name: str, quantity: int, unit_price_cents: int) -> dict[str, Any]:
    return {"sku": sku, "name": name, "quantity": quantity, "unit_price_cents": unit_price_cents}


def _order(
    order_id: str,
    customer_id: str,
    status: str,
    placed_at: str,
    items: list[dict[str, Any]],
    carrier: str | None = None,
    tracking_number: str | None = None,
    eta: str | None = None,
) -> dict[str, Any]:
    return {
        "order_id": order_id,
        "customer_id": customer_id,
        "status": status,
        "placed_at": _ts(placed_at),
        "total_cents": sum(i["quantity"] * i["unit_price_cents"] for i in items),
        "currency": "EUR",
        "items": items,
        "carrier": carrier,
        "tracking_number": tracking_number,
        "eta": date.fromisoformat(eta) if eta else None,
        "cancel_reason": None,
        "cancelled_at": None,
    }


DEMO_ORDERS = [
    _order(
        "ord_a1000001",
        "cus_1001",
        "delivered",
        "2026-09-01T09:12:00",
        [_item("SKU-KETTLE-01", "Electric kettle", 1, 3999)],
        carrier="DHL",
        tracking_number="JD014600003271906547",
        eta="2026-09-04",
    ),
    _order(
        "ord_a1000002",
        "cus_1001",
        "shipped",
        "2026-10-20T17:45:00",
        [_item("SKU-HEADPH-02", "Wireless headphones", 1, 8999), _item("SKU-CABLE-USB", "USB-C cable", 2, 999)],
        carrier="UPS",
        tracking_number="1Z999AA10123456784",
        eta="2026-10-24",
    ),
    _order(
        "ord_a1000004", "cus_1001", "processing", "2026-11-10T11:03:00", [_item("SKU-LAMP-03", "Desk lamp", 1, 4550)]
    ),
    _order(
        "ord_a1000003",
        "cus_1001",
        "pending",
        "2026-11-25T20:31:00",
        [_item("SKU-BOOT-41", "Rain boots, size 41", 1, 6900), _item("SKU-SOCK-3P", "Wool socks (3 pairs)", 1, 1800)],
    ),
    # Bob Okafor: ord_9f3c4e21 is the plausible id a careless model invents for someone else.
    _order(
        "ord_9f3c4e21",
        "cus_1002",
        "processing",
        "2026-11-26T08:15:00",
        [_item("SKU-CHAIR-07", "Ergonomic office chair", 1, 24900)],
    ),
    _order(
        "ord_b2000001",
        "cus_1002",
        "delivered",
        "2026-08-15T14:22:00",
        [_item("SKU-MUG-SET", "Ceramic mug set", 1, 2999)],
        carrier="DPD",
        tracking_number="01234567890123",
        eta="2026-08-19",
    ),
    _order(
        "ord_c3000001",
        "cus_1003",
        "shipped",
        "2026-11-20T10:00:00",
        [_item("SKU-JACKET-M", "Winter jacket, M", 1, 15900)],
        carrier="DHL",
        tracking_number="JD014600009876543210",
        eta="2026-11-28",
    ),
    _order(
        "ord_c3000002",
        "cus_1003",
        "delivered",
        "2026-07-02T16:40:00",
        [_item("SKU-BOOK-PY", "Python cookbook", 1, 4499)],
        carrier="La Poste",
        tracking_number="6A12345678901",
        eta="2026-07-05",
    ),
]
