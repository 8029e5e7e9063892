"""Alembic's environment for the fleet's tables: it runs on the connection `roundtrip._kernel.migrations.upgrade` hands
it, inside that function's transaction (which holds the migration lock). `roundtrip db upgrade` is the way to run it."""

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "the fleet's migrations run through `roundtrip db upgrade` (services/_kernel/migrations), "
        "which gives them their connection and lock"
    )
context.configure(connection=connection)
with context.begin_transaction():  # the caller's transaction: this opens none of its own
    context.run_migrations()
