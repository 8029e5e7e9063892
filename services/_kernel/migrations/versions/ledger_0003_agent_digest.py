"""ledger_0003 (after ledger_0002): which agent started each turn (Agent.digest of its prompt and tools)."""

import sqlalchemy as sa
from alembic import op

revision = "ledger_0003"
down_revision = "ledger_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("agent_digest", sa.String(32)))
