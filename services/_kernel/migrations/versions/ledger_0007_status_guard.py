"""ledger_0007 (after ledger_0006): on PostgreSQL, a trigger that lets a login other than the owner of `turns` (the
guard's) move a turn's status only as the claims do (turnstore.py: a live turn to waiting, `wait_for_capacity`), and
change a turn that is not live only as a claim's aftermath does: the executor's side effects appended, the model's
release of an ending turn's lease. The grants say which columns each login may write; this says which moves.
SQLite has no logins: nothing there.
"""

from alembic import op

revision = "ledger_0007"
down_revision = "ledger_0006"
branch_labels = None
depends_on = None

TRIGGER, FUNCTION = "turns_status_guard", "roundtrip_turns_status_guard"

# search_path pinned: the function runs as the session's login, which must not shadow what it calls (pg_temp).
GUARD = f"""
CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    live CONSTANT text[] := ARRAY['running', 'stuck', 'waiting'];
    table_owner oid := (SELECT relowner FROM pg_catalog.pg_class WHERE oid = TG_RELID);
BEGIN
    IF pg_catalog.pg_has_role(current_user, table_owner, 'MEMBER') THEN
        RETURN NEW;
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        IF OLD.status = ANY (live) AND NEW.status = 'waiting' THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'roundtrip: % may not move turn % from % to %', current_user, OLD.turn_id, OLD.status,
            NEW.status USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF OLD.status = ANY (live) OR (
        (to_jsonb(NEW) - 'lease_until' - 'acted') = (to_jsonb(OLD) - 'lease_until' - 'acted')
        AND (NEW.lease_until IS NOT DISTINCT FROM OLD.lease_until OR (OLD.status = 'ending' AND NEW.lease_until IS NULL))
        AND (NEW.acted IS NOT DISTINCT FROM OLD.acted
             OR left(NEW.acted, length(coalesce(OLD.acted, ''))) = coalesce(OLD.acted, ''))
    ) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'roundtrip: % may not change turn % while it is %', current_user, OLD.turn_id, OLD.status
        USING ERRCODE = 'insufficient_privilege';
END
$$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(GUARD)
    op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON turns")
    op.execute(f"CREATE TRIGGER {TRIGGER} BEFORE UPDATE ON turns FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()")

