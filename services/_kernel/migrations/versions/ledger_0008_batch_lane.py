"""ledger_0008 (after ledger_0007): each turn's lane (Turn.lane, `interactive` or `batch`): a batch turn waiting for
its Message Batch is not stuck (turnstore.py, `IN_BATCH`). A row without one was started before: interactive."""

import sqlalchemy as sa
from alembic import op

revision = "ledger_0008"
down_revision = "ledger_0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("lane", sa.String(16)))
