"""A PostgreSQL login per service, and what each may do to the fleet's tables (docs/operating/deploy.md, "Database
roles"). The guard owns the ledger and the conversations (it migrates them); the executor and the model service
claim (an UPDATE of their claims' columns only), the model keeps its batch calls; the gate, gateway and console read.

`statements()` is what `roundtrip db roles` prints or applies; `excess()` is what a service asks the database at
start outside development: a login that may do more than its part is refused (one line naming the grant to remove).
The read-only sessions of `make_engine` stay a second line; these grants are the boundary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, text

from roundtrip._kernel.database import is_sqlite, make_engine, run_on
from roundtrip._kernel.migrations import CONVERSATIONS, LEDGER, UPGRADE
from roundtrip._kernel.migrations.schema import reaching
from roundtrip._kernel.settings.checks import InsecureConfiguration

OWNER = "guard"
PREFIX = "roundtrip_"
SCHEMA = "public"
VERSIONS = "alembic_version"  # every store's revision: each open reads it
TURNS, APPROVALS, BATCH_CALLS = "turns", "approvals", "model_batch_calls"
TABLES = {
    LEDGER: (TURNS, APPROVALS, BATCH_CALLS, "agent_versions"),
    CONVERSATIONS: ("conversations", "conversation_turns"),
}
WRITES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
BY_COLUMN = ("INSERT", "UPDATE", "REFERENCES")  # may be granted on some columns only
ROWS = ("SELECT", "INSERT", "UPDATE", "DELETE")  # what a part may do to a table of its own (`writes`)
ADMIN_ENV = "ROUNDTRIP_DB_ADMIN_URL"  # `roundtrip db roles --database-url`: the login that grants
LOGIN_ENV = "ROUNDTRIP_{service}_DATABASE_URL"  # the URL that service connects with (or its password)
STATUS_GUARD = "turns_status_guard"  # ledger_0007's trigger: the moves of a status the column grants cannot say


@dataclass(frozen=True)
class Part:
    """A service's part of the fleet's tables: what it reads, the columns its claims write, and the tables whose rows
    it keeps itself (`writes`: read, insert, update and delete)."""

    reads: tuple[str, ...]
    updates: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    writes: tuple[str, ...] = ()

    def may(self, privilege: str, table: str) -> bool:
        if table in self.writes:
            return privilege in ROWS
        if privilege == "SELECT":
            return table == VERSIONS or table in self.reads
        return False


PARTS: dict[str, Part] = {
    "gateway": Part(reads=(TURNS,)),
    "gate": Part(reads=(TURNS,)),
    "console": Part(reads=(*TABLES[LEDGER], *TABLES[CONVERSATIONS])),
    # Fence.claim_batch (the lease), record_acted (the step's side effects)
    "executor": Part(reads=(TURNS,), updates={TURNS: ("lease_step", "lease_until", "acted")}),
    # Fence.claim_model_call (the lease released), wait_for_capacity (a live turn to waiting); the batch lane's calls
    "model": Part(
        reads=(TURNS,),
        updates={TURNS: ("lease_until", "status", "last_progress_at", "flagged_at")},
        writes=(BATCH_CALLS,),
    ),
}


def role(service: str, prefix: str = PREFIX) -> str:
    return f"{prefix}{service}"


def _ident(name: str) -> str:
    if re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def creation(name: str, password: str | None = None) -> str:
    """CREATE ROLE when missing; the password only in what is applied, never in what is printed."""
    if password is not None:
        return f"CREATE ROLE {_ident(name)} LOGIN PASSWORD {_literal(password)}"
    return (
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {_literal(name)}) THEN "
        f"CREATE ROLE {_ident(name)} LOGIN; END IF; END $$"
    )


def grants(service: str, tables: Iterable[str], prefix: str) -> list[str]:
    """The statements that leave `service`'s role exactly its part of `tables` (those of this database)."""
    part, who = PARTS[service], _ident(role(service, prefix))
    present = list(tables)
    out = [
        f"REVOKE ALL ON ALL TABLES IN SCHEMA {SCHEMA} FROM {who}",
        f"REVOKE CREATE ON SCHEMA {SCHEMA} FROM {who}",
    ]
    readable = [t for t in (VERSIONS, *present) if part.may("SELECT", t)]
    if readable:
        out.append(f"GRANT SELECT ON {', '.join(map(_ident, readable))} TO {who}")
    for table, columns in part.updates.items():
        if table in present:
            out.append(f"GRANT UPDATE ({', '.join(map(_ident, columns))}) ON {_ident(table)} TO {who}")
    rows = [_ident(t) for t in part.writes if t in present]
    if rows:
        out.append(f"GRANT INSERT, UPDATE, DELETE ON {', '.join(rows)} TO {who}")
    return out


def statements(tables: Iterable[str], prefix: str, create: Mapping[str, str | None] | None = None) -> list[str]:
    """Every role's statements for one database holding `tables` (and the revisions table): roles created when
    missing (`create`: service -> password for those to create now; None: print the idempotent form for all),
    nothing left to PUBLIC on the fleet's tables, then each service's grants."""
    present = list(tables)
    if create is None:
        out = [creation(role(s, prefix)) for s in PARTS]
    else:
        out = [creation(role(s, prefix), password) for s, password in create.items()]
    out.append(f"REVOKE ALL ON {', '.join(map(_ident, (VERSIONS, *present)))} FROM PUBLIC")
    for service in PARTS:
        out += grants(service, present, prefix)
    return out


@dataclass(frozen=True)
class Excess:
    """One thing a login may do beyond its part, and the statement that takes it away."""

    login: str
    may: str
    remedy: str

    def refusal(self, service: str) -> str:
        return (
            f"{service} refuses to start: its database login {self.login} {self.may}; {self.remedy} "
            "(roundtrip db roles prints the grants)"
        )


_LOGIN = text("SELECT current_user, rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user")
_TABLES = text(
    "SELECT c.relname, pg_get_userbyid(c.relowner), pg_has_role(current_user, c.relowner, 'MEMBER') FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') "
    "ORDER BY c.relname"
)
_COLUMNS = text(
    "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attnum > 0 AND NOT attisdropped "
    "ORDER BY attnum"
)
_GUARDED = text(
    "SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass(:t) AND tgname = :n AND tgenabled IN ('O', 'A')"
)
_WIDE = text(
    "SELECT current_schema(), current_database(), has_schema_privilege(current_schema(), 'CREATE'), "
    "has_database_privilege(current_database(), 'CREATE')"
)


def _has(conn: Connection, privilege: str, table: str, column: str | None = None, whole: bool = False) -> bool:
    """`whole`: granted on the table itself, not only on some of its columns."""
    if column is not None:
        query, params = "SELECT has_column_privilege(:t, :c, :p)", {"t": table, "c": column, "p": privilege}
    elif not whole and (privilege in BY_COLUMN or privilege == "SELECT"):  # a grant on any one column counts
        query, params = "SELECT has_any_column_privilege(:t, :p)", {"t": table, "p": privilege}
    else:
        query, params = "SELECT has_table_privilege(:t, :p)", {"t": table, "p": privilege}
    return bool(conn.execute(text(query), params).scalar_one())


def excess(conn: Connection, service: str) -> list[Excess]:
    """What `service`'s login may do on this database beyond its part (the guard, the owner: only a superuser)."""
    login, superuser, createrole = conn.execute(_LOGIN).one()
    who = _ident(login)
    if superuser:
        return [Excess(login, "is a superuser", f"give {service} a login of its own, {role(service)}")]
    if service == OWNER:
        return []
    found = []
    part = PARTS[service]
    rows = conn.execute(_TABLES).all()
    tables = {table for table, _, _ in rows}
    for table, owner, member in rows:
        if member:
            verb = "owns" if owner == login else f"is a member of {owner}, which owns"
            found.append(Excess(login, f"{verb} {table}", f"give {service} a login of its own, {role(service)}"))
            continue
        for privilege in ("SELECT", *WRITES):
            if part.may(privilege, table) or not _has(conn, privilege, table):
                continue
            allowed = part.updates.get(table, ()) if privilege == "UPDATE" else ()
            if not allowed or _has(conn, privilege, table, whole=True):
                may = _saying(privilege, table) + (" (every column)" if allowed else "")
                found.append(Excess(login, may, f"REVOKE {privilege} ON {table} FROM {who}"))
                continue
            for (column,) in conn.execute(_COLUMNS, {"t": table}).all():
                if column not in allowed and _has(conn, privilege, table, column):
                    revoke = f"REVOKE UPDATE ({column}) ON {table} FROM {who}"
                    found.append(Excess(login, f"may UPDATE {table}.{column}", revoke))
    for table in part.updates:
        if table in tables and not conn.execute(_GUARDED, {"t": table, "n": STATUS_GUARD}).scalar_one():
            may = f"may write any turn in any state: {table} has no enabled trigger {STATUS_GUARD}"
            found.append(Excess(login, may, f"run `{UPGRADE}` (ledger_0007 installs it)"))
    if createrole:  # it could grant itself the owner's role
        found.append(Excess(login, "may CREATE ROLE", f"ALTER ROLE {who} NOCREATEROLE"))
    schema, database, in_schema, in_database = conn.execute(_WIDE).one()
    if in_schema:
        found.append(Excess(login, f"may CREATE in schema {schema}", f"REVOKE CREATE ON SCHEMA {schema} FROM {who}"))
    if in_database:
        revoke = f"REVOKE CREATE ON DATABASE {database} FROM {who}"
        found.append(Excess(login, f"may CREATE in database {database}", revoke))
    return found


def _saying(privilege: str, table: str) -> str:
    return {
        "SELECT": f"may read {table}",
        "INSERT": f"may INSERT into {table}",
        "DELETE": f"may DELETE from {table}",
    }.get(privilege, f"may {privilege} {table}")


def password_of(value: str, name: str) -> str:
    """A role's password from its setting: the password itself, or a database URL of that login (its password)."""
    if "://" not in value:
        return value
    from sqlalchemy.engine import make_url

    url = make_url(value)
    if url.username != name or not url.password:
        raise ValueError(f"the URL given for {name} is not {name}'s with a password (it names {url.username!r})")
    return str(url.password)


def present(conn: Connection) -> list[str]:
    """The fleet's tables this database holds, in the order of TABLES."""
    found = set(conn.execute(_TABLES).scalars())
    return [t for store in TABLES.values() for t in store if t in found]


def missing_roles(conn: Connection, prefix: str) -> list[str]:
    names = [role(s, prefix) for s in PARTS]
    existing = set(conn.execute(text("SELECT rolname FROM pg_roles WHERE rolname = ANY(:n)"), {"n": names}).scalars())
    return [s for s in PARTS if role(s, prefix) not in existing]


def apply(conn: Connection, passwords: Mapping[str, str], prefix: str) -> list[str]:
    """Run `statements` in this transaction; roles created with the given passwords. What was done, one line each
    (no password)."""
    tables = present(conn)
    create = {s: passwords.get(s) for s in missing_roles(conn, prefix)}
    lacking = [s for s, p in create.items() if p is None]
    if lacking:
        raise ValueError(
            f"{', '.join(role(s, prefix) for s in lacking)} missing: set "
            + ", ".join(LOGIN_ENV.format(service=s.upper()) for s in lacking)
            + " (its password, or its database URL) to create them"
        )
    for statement in statements(tables, prefix, create):
        conn.exec_driver_sql(statement)  # not text(): a password's ':' is no bind parameter
    said = [f"created {role(s, prefix)}" for s in create]
    for service, part in PARTS.items():
        reads = [t for t in (VERSIONS, *tables) if part.may("SELECT", t)]
        updates = [f"{t}({', '.join(c)})" for t, c in part.updates.items() if t in tables]
        rows = [t for t in part.writes if t in tables]
        said.append(
            f"{role(service, prefix)}: SELECT {', '.join(reads)}"
            + (f"; UPDATE {', '.join(updates)}" if updates else "")
            + (f"; INSERT, UPDATE, DELETE {', '.join(rows)}" if rows else "")
            + "; nothing else"
        )
    return said


def passwords_from(environ: Mapping[str, str], prefix: str) -> dict[str, str]:
    """Each service's password from its LOGIN_ENV variable, where set."""
    found = {}
    for service in PARTS:
        value = environ.get(LOGIN_ENV.format(service=service.upper()), "").strip()
        if value:
            found[service] = password_of(value, role(service, prefix))
    return found


async def apply_to(url: str, passwords: Mapping[str, str], prefix: str) -> list[str]:
    with reaching(url):
        return await run_on(make_engine(url), lambda conn: apply(conn, passwords, prefix), write=True)


def shown_statements(statements_: Iterable[str]) -> str:
    return "".join(f"{s};\n" for s in statements_)


async def refuse_excess(settings: Any, service: str) -> None:
    """Raise InsecureConfiguration (one line) when `service`'s database login may do more than its part; outside
    development on PostgreSQL only, unless ROUNDTRIP_DATABASE_ALLOW_SHARED_LOGIN says one login serves on purpose."""
    if settings.development or settings.database_allow_shared_login or service not in (OWNER, *PARTS):
        return
    urls = [settings.ledger_db_url]
    if service in (OWNER, "console"):
        urls.append(settings.conversations_db_url)
    for url in dict.fromkeys(u for u in urls if not is_sqlite(u)):
        with reaching(url):
            found = await run_on(make_engine(url, read_only=True), lambda conn: excess(conn, service))
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            raise InsecureConfiguration(found[0].refusal(service) + more)
