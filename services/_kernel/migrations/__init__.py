"""Migrations of the fleet's own tables (Alembic): what `roundtrip db upgrade` applies, and the check each store makes
when it opens.

Two stores, each its own line of revisions in versions/ (an Alembic base with a branch label) and
its own row in the database's `alembic_version` table, so each can live in its own database:
* `ledger`: the turn table and the approvals (services/_kernel/storage/turnstore.py): the guard, the model
  service and the executor open it;
* `conversations`: the guard's conversation store (services/_guard/conversations.py), by default in
  the ledger's database.

A store's `open` reads its revision (`schema.require`) and refuses a database behind or ahead of this
code's head with `SchemaMismatch` (one line: the database, both revisions, what to run); no store
runs DDL. `schema.upgrade` applies what is missing in one transaction that first takes a lock (PostgreSQL:
an advisory lock; SQLite: BEGIN IMMEDIATE), so upgrades started at once (the init containers of
several pods) run one after the other and the later ones find nothing to do.

A database that cannot be reached (or opened) is `DatabaseUnreachable`, one line too.

A database made before migrations (tables, no `alembic_version`) is adopted in place, rows kept:
the revisions of that time create or add only what it lacks (adopt.py).
"""

from __future__ import annotations

LEDGER, CONVERSATIONS = "ledger", "conversations"
STORES = (LEDGER, CONVERSATIONS)
UPGRADE = "roundtrip db upgrade"


class SchemaMismatch(RuntimeError):
    """The database's schema is not the one this code needs (the message is one line, for the operator)."""


class DatabaseUnreachable(RuntimeError):
    """The database cannot be reached or opened (the message is one line: the database, the reason)."""
