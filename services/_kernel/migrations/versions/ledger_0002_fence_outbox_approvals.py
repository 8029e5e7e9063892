"""ledger_0002 (after ledger_0001): the fence's lease and deadline, the outbox's time, approvals, a conversation index."""

import sqlalchemy as sa

from roundtrip._kernel.migrations.adopt import add_column, create_index, create_table

revision = "ledger_0002"
down_revision = "ledger_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    add_column("turns", sa.Column("deadline_at", sa.Float))
    add_column("turns", sa.Column("lease_step", sa.Integer))
    add_column("turns", sa.Column("lease_until", sa.Float))
    add_column("turns", sa.Column("pending_at", sa.Float))
    create_index("ix_turns_conversation_id", "turns", ["conversation_id"])
    create_table(
        "approvals",
        sa.Column("approval_id", sa.String(64), primary_key=True),
        sa.Column("turn_id", sa.String(64), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("tool_use_id", sa.String(200), nullable=False),
        sa.Column("tool", sa.String(64), nullable=False),
        sa.Column("input_sha256", sa.String(64), nullable=False),
        sa.Column("customer_id", sa.String(200), nullable=False),
        sa.Column("conversation_id", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("requested_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("decided_by", sa.String(200)),
        sa.Column("decided_at", sa.Float),
        sa.Column("decision_reason", sa.Text),
        sa.Column("traceparent", sa.String(64)),
        sa.Column("request_json", sa.Text, nullable=False),
    )
    create_index("ix_approvals_turn_id", "approvals", ["turn_id"])
    create_index("ix_approvals_status", "approvals", ["status"])
