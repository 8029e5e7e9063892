"""The side effects each turn has had (services/_kernel/storage/sideeffects.py): JSON lines the executor appends.

Revision ID: ledger_0004
Revises: ledger_0003
"""

import sqlalchemy as sa
from alembic import op

revision = "ledger_0004"
down_revision = "ledger_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("acted", sa.Text))
