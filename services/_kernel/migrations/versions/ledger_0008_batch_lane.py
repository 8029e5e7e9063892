"""ledger_0008 (after ledger_0007): the batch lane.

Each turn's lane (Turn.lane, `interactive` or `batch`): a batch turn waiting for its Message Batch is not stuck
(turnstore.py, `IN_BATCH`); a row without one was started before: interactive. And the model service's record of each
call of a batch turn, from the moment its fence claim succeeds to its answer published: which submission took it,
which Message Batch holds it, and which replica polls that batch (services/_model/batch_store.py,
docs/decisions/batch-lane.md); created only where missing: a ledger made by `create_all` of this code has it already.
"""

import sqlalchemy as sa
from alembic import op

from roundtrip._kernel.migrations.adopt import create_index, create_table

revision = "ledger_0008"
down_revision = "ledger_0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("lane", sa.String(16)))
    create_table(
        "model_batch_calls",
        sa.Column("turn_id", sa.String(64), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("custom_id", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("grouping", sa.String(64), nullable=False),
        sa.Column("queued_at", sa.Float, nullable=False),
        sa.Column("submission", sa.String(40)),
        sa.Column("submitted_at", sa.Float),
        sa.Column("batch_id", sa.String(200)),
        sa.Column("lease_owner", sa.String(200)),
        sa.Column("lease_until", sa.Float),
        sa.Column("retried", sa.Integer, nullable=False),
        sa.Column("done_at", sa.Float),
        sa.Column("traceparent", sa.String(64)),
        sa.Column("command_json", sa.Text),
    )
    create_index("ix_model_batch_calls_status", "model_batch_calls", ["status"])
    create_index("ix_model_batch_calls_batch_id", "model_batch_calls", ["batch_id"])
