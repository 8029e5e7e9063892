"""Which agent started each turn: the digest of its system prompt and tools (Agent.digest).

Revision ID: ledger_0003
Revises: ledger_0002
"""

import sqlalchemy as sa
from alembic import op

revision = "ledger_0003"
down_revision = "ledger_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("agent_digest", sa.String(32)))
