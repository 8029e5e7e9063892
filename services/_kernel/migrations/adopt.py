"""What the revisions made before migrations use: each creates or adds only what the database lacks, so a database
the older code made (some prefix of these tables, no `alembic_version`) is completed with every row kept.
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
