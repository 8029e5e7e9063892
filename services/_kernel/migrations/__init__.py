"""Migrations of the fleet's own tables (Alembic): what `roundtrip db upgrade` applies, and the check each store makes
when it opens.

Two stores, `ledger` and `conversations`, each its own line of revisions and its own `alembic_version` row, so each
can live in its own database. A store's `open` refuses a database behind or ahead of this code's head; no store runs
DDL. `schema.upgrade` runs under a lock, so the upgrades of several pods started at once run one after the other.
A database made before migrations is adopted in place, rows kept (adopt.py).
"""

from __future__ import annotations

LEDGER, CONVERSATIONS = "ledger", "conversations"
STORES = (LEDGER, CONVERSATIONS)
UPGRADE = "roundtrip db upgrade"


class SchemaMismatch(RuntimeError):
    """The database's schema is not the one this code needs (one line, for the operator)."""


class DatabaseUnreachable(RuntimeError):
    """The database cannot be reached or opened (one line)."""
