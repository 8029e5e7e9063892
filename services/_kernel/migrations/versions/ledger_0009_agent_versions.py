"""ledger_0009 (after ledger_0008): agent versions side by side (docs/decisions/agent-versions.md): the version each
turn runs on, and the share of new conversations each version takes (the ramp `roundtrip versions ramp` sets)."""

import sqlalchemy as sa
from alembic import op

revision = "ledger_0009"
down_revision = "ledger_0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("agent_version", sa.String(40)))
    op.create_table(
        "agent_versions",
        sa.Column("version", sa.String(40), primary_key=True),
        sa.Column("share", sa.Float, nullable=False),
        sa.Column("draining", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
