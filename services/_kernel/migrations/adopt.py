"""What the revisions made before migrations use: each creates or adds only what the database lacks.

The code before migrations created its tables at open (`create_all`) and added the later columns
and indexes with ALTER TABLE there. A database it made (tables, no `alembic_version`) therefore has
some prefix of what these revisions make; running them on it adds the rest and keeps every row.
Revisions after the adoption (later than ledger_0002 and conversations_0001) use `op` directly.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op


def _inspector() -> sa.Inspector:
    return sa.inspect(op.get_bind())  # a new one each time: it caches what it read


def create_table(name: str, *columns: sa.Column[Any]) -> None:
    if not _inspector().has_table(name):
        op.create_table(name, *columns)


def add_column(table: str, column: sa.Column[Any]) -> None:
    if column.name not in {c["name"] for c in _inspector().get_columns(table)}:
        op.add_column(table, column)


def create_index(name: str, table: str, columns: list[str]) -> None:
    if name not in {i["name"] for i in _inspector().get_indexes(table)}:
        op.create_index(name, table, columns)
