"""conversations_0002 (after conversations_0001): the agent version a conversation was assigned at its first turn,
which its later turns keep (docs/decisions/agent-versions.md); none: the default version."""

import sqlalchemy as sa
from alembic import op

revision = "conversations_0002"
down_revision = "conversations_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("conversations", sa.Column("agent_version", sa.String(40)))
