"""ledger_0001, the first: the turn table."""

import sqlalchemy as sa

from roundtrip._kernel.migrations.adopt import create_index, create_table

revision = "ledger_0001"
down_revision = None
branch_labels = ("ledger",)
depends_on = None


def upgrade() -> None:
    create_table(
        "turns",
        sa.Column("turn_id", sa.String(64), primary_key=True),
        sa.Column("request_id", sa.String(200), nullable=False),
        sa.Column("conversation_id", sa.String(200), nullable=False),
        sa.Column("customer_id", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("last_progress_at", sa.Float, nullable=False),
        sa.Column("flagged_at", sa.Float),
        sa.Column("ended_at", sa.Float),
        sa.Column("outcome", sa.String(40)),
        sa.Column("input_tokens", sa.Integer, nullable=False),
        sa.Column("output_tokens", sa.Integer, nullable=False),
        sa.Column("cache_creation_input_tokens", sa.Integer, nullable=False),
        sa.Column("cache_read_input_tokens", sa.Integer, nullable=False),
        sa.Column("cost_usd", sa.Float, nullable=False),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("traceparent", sa.String(64)),
        sa.Column("turn_json", sa.Text, nullable=False),
        sa.Column("pending", sa.Text),
    )
    create_index("ix_turns_customer_id", "turns", ["customer_id"])
    create_index("ix_turns_status", "turns", ["status"])
