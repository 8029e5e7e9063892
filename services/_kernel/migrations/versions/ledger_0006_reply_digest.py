"""ledger_0006 (after ledger_0005): the SHA-256 of an ended turn's reply text, recorded with its end: the gateway
answers a turn.outcomes end only when its text is the one the guard recorded (turnstore.py, `reply_digest`)."""

import sqlalchemy as sa
from alembic import op

revision = "ledger_0006"
down_revision = "ledger_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("reply_sha256", sa.String(64)))
