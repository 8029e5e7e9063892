"""The index the sweeper deletes ended turns by, oldest first, after ROUNDTRIP_LEDGER_RETENTION_S.

On PostgreSQL the index is built by a plain CREATE INDEX, which holds writes to `turns` while it builds: seconds
for millions of rows. On a ledger too large for that, build it first by hand with
`CREATE INDEX CONCURRENTLY ix_turns_ended_at ON turns (ended_at)`; this migration then finds it and adds nothing.

Revision ID: ledger_0005
Revises: ledger_0004
"""

from roundtrip._kernel.migrations.adopt import create_index

revision = "ledger_0005"
down_revision = "ledger_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_index("ix_turns_ended_at", "turns", ["ended_at"])
