"""ledger_0005 (after ledger_0004): the index retention deletes ended turns by. A plain CREATE INDEX holds writes
while it builds: on a large PostgreSQL ledger build it first with CREATE INDEX CONCURRENTLY; this then adds nothing.
"""

from roundtrip._kernel.migrations.adopt import create_index

revision = "ledger_0005"
down_revision = "ledger_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_index("ix_turns_ended_at", "turns", ["ended_at"])
