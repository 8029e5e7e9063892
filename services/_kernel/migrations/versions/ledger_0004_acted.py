"""ledger_0004 (after ledger_0003): the side effects each turn has had (storage/sideeffects.py)."""

import sqlalchemy as sa
from alembic import op

revision = "ledger_0004"
down_revision = "ledger_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("acted", sa.Text))
