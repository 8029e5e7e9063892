"""Alembic's environment: it runs on the connection and in the locked transaction `schema.upgrade` hands it."""

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "the fleet's migrations run through `roundtrip db upgrade` (services/_kernel/migrations), "
        "which gives them their connection and lock"
    )
context.configure(connection=connection)
with context.begin_transaction():  # the caller's: this opens none of its own
    context.run_migrations()
