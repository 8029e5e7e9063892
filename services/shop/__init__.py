"""The demo shop: the order system the support tools call (its own database, its own HTTP API)."""

from services.shop.app import create_app, main

__all__ = ["create_app", "main"]
