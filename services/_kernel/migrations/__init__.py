"""Migrations of the fleet's own tables (Alembic), one line of revisions per store (`ledger`, `conversations`) so
each can live in its own database. A store's `open` refuses a database behind or ahead of this code's head and runs
no DDL; `roundtrip db upgrade` applies revisions under a lock, so pods started at once upgrade one after the other.
"""

from __future__ import annotations

LEDGER, CONVERSATIONS = "ledger", "conversations"
STORES = (LEDGER, CONVERSATIONS)
UPGRADE = "roundtrip db upgrade"


class SchemaMismatch(RuntimeError):
    """The database's schema is not the one this code needs (one line, for the operator)."""


class DatabaseUnreachable(RuntimeError):
    """The database cannot be reached or opened (one line)."""
