"""conversations_0001, the first: who owns each conversation, and the exchanges of its earlier turns."""

import sqlalchemy as sa

from roundtrip._kernel.migrations.adopt import create_index, create_table

revision = "conversations_0001"
down_revision = None
branch_labels = ("conversations",)
depends_on = None


def upgrade() -> None:
    create_table(
        "conversations",
        sa.Column("conversation_id", sa.String(200), primary_key=True),
        sa.Column("customer_id", sa.String(200), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("turns", sa.Integer, nullable=False),
        sa.Column("dropped_turns", sa.Integer, nullable=False),
    )
    create_index("ix_conversations_customer_id", "conversations", ["customer_id"])
    create_index("ix_conversations_updated_at", "conversations", ["updated_at"])
    create_table(
        "conversation_turns",
        sa.Column("turn_id", sa.String(64), primary_key=True),
        sa.Column("conversation_id", sa.String(200), nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("messages", sa.Text),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("outcome", sa.String(40)),
    )
    create_index("ix_conversation_turns_conversation", "conversation_turns", ["conversation_id", "started_at"])
