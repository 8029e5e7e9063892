"""Agent versions side by side (docs/decisions/agent-versions.md): the share of new conversations each named version
takes (the ramp; the default version takes the rest), which the operator sets (`roundtrip versions ramp`) and the
guard reads at each start; and what each version's turns did, from the ledger (`summary_of`, read by `roundtrip
versions` and the console alike)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from sqlalchemy import ColumnElement, Connection, delete, func, insert, literal_column, select, update

from roundtrip._kernel.storage.turnstore import ENDED, TurnStore, agent_versions, approvals, turns
from roundtrip._kernel.wire import topics

DEFAULT = ""  # the default version: today's topic names, and the share the named versions leave
DEFAULT_WORD = topics.DEFAULT_VERSION_WORD  # how the operator names it (`roundtrip versions drain default`)
SHOWN_DEFAULT = "(default)"  # how a table shows it
_ASKED = select(approvals.c.turn_id, func.count().label("asked")).group_by(approvals.c.turn_id).subquery()
# a row's version as recorded (None and "": the default version, merged in Python): sums, so groups add up
_PER_VERSION = (
    select(
        turns.c.agent_version,
        turns.c.status,
        turns.c.outcome,
        func.count().label("turns"),
        func.sum(turns.c.step).label("steps"),
        func.sum(turns.c.cost_usd).label("cost_usd"),
        func.sum(func.coalesce(_ASKED.c.asked, 0)).label("asked"),
    )
    .select_from(turns.outerjoin(_ASKED, _ASKED.c.turn_id == turns.c.turn_id))
    .group_by(turns.c.agent_version, turns.c.status, turns.c.outcome)
)
# the median of each version's ended turns' time from start to end: the middle one or two by rank (n odd: rank
# (n+1)/2; n even: n/2 and n/2+1), which is `2 rank` between n and n+2; window functions, so SQLite answers too
_VERSION_KEY = func.coalesce(turns.c.agent_version, literal_column("''"))
_TOOK = turns.c.ended_at - turns.c.started_at
_RANKED = (
    select(
        _VERSION_KEY.label("version"),
        _TOOK.label("took"),
        func.row_number().over(partition_by=_VERSION_KEY, order_by=_TOOK).label("rank"),
        func.count().over(partition_by=_VERSION_KEY).label("n"),
    )
    .where(turns.c.status == ENDED, turns.c.ended_at.is_not(None))
    .subquery("ranked")
)
_MEDIAN = (
    select(_RANKED.c.version, func.avg(_RANKED.c.took).label("p50"))
    .where((_RANKED.c.rank * 2).between(_RANKED.c.n, _RANKED.c.n + 2))
    .group_by(_RANKED.c.version)
)


class RampRefused(ValueError):
    """A ramp the fleet cannot take (one line for the operator)."""


@dataclass
class VersionRow:
    """One version: its share of new conversations (percent), whether it drains, its running turns, and its ended
    turns: by outcome, their model calls, cost and approvals asked all together, and the median turn's seconds."""

    version: str
    share: float
    draining: bool = False
    running: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    cost_usd: float = 0.0
    approvals: int = 0
    p50_s: float | None = None

    @property
    def ended(self) -> int:
        return sum(self.outcomes.values())

    @property
    def mix(self) -> str:
        """Its outcomes, the most frequent first: `end_turn 40, budget 2`."""
        return ", ".join(f"{outcome} {n}" for outcome, n in sorted(self.outcomes.items(), key=lambda o: (-o[1], o[0])))

    def cells(self) -> tuple[str, ...]:
        """Its figures as `roundtrip versions` and the console show them (COLUMNS after the version; `-`: no turn of
        it ended yet): means per ended turn, so versions with different shares compare."""
        n = self.ended

        def mean(total: float, digits: int) -> str:
            return f"{total / n:.{digits}f}" if n else "-"

        p50 = "-" if self.p50_s is None else f"{self.p50_s:.1f}"
        return (
            f"{self.share:g}",
            str(self.running),
            str(n),
            self.mix,
            mean(self.steps, 1),
            mean(self.cost_usd, 4),
            mean(self.approvals, 2),
            p50,
        )


COLUMNS = ("version", "share %", "running", "ended", "outcomes", "steps/turn", "$/turn", "approvals/turn", "p50 s")


def of_version(version: str) -> ColumnElement[bool]:
    """The turns of `version` (the default version's: also those a ledger recorded before versions, with none)."""
    mine = turns.c.agent_version == version
    return turns.c.agent_version.is_(None) | mine if version == DEFAULT else mine


def shown(version: str | None) -> str:
    return version or SHOWN_DEFAULT


def named(word: str) -> str:
    """The version an operator's word names: `default` is the default version."""
    return DEFAULT if word == DEFAULT_WORD else word


def summary_of(conn: Connection) -> list[VersionRow]:
    """Every version the ramp or the ledger names, the default first: share, running turns, its ended turns' figures.
    Two grouped reads of the turns (by version, status and outcome; the median by version) and the ramp."""
    ramp = conn.execute(select(agent_versions)).all()
    rows = {r.version: VersionRow(r.version, r.share, bool(r.draining)) for r in ramp}
    found = {DEFAULT: VersionRow(DEFAULT, max(0.0, 100 - sum(r.share for r in rows.values()))), **rows}
    for r in conn.execute(_PER_VERSION).all():
        version = r.agent_version or DEFAULT
        row = found.setdefault(version, VersionRow(version, 0.0))
        if r.status != ENDED:  # running, waiting for the API or a person, or ending
            row.running += r.turns
        elif r.outcome:
            row.outcomes[r.outcome] = row.outcomes.get(r.outcome, 0) + r.turns
            row.steps += int(r.steps or 0)
            row.cost_usd += float(r.cost_usd or 0.0)
            row.approvals += int(r.asked or 0)  # PostgreSQL sums counts as numeric
    for version, p50 in conn.execute(_MEDIAN).all():
        found.setdefault(version, VersionRow(version, 0.0)).p50_s = float(p50)
    return [found[v] for v in sorted(found)]


def checked_name(version: str) -> str:
    if not re.fullmatch(topics.VERSION_NAME, version) or version == DEFAULT_WORD:
        raise RampRefused(
            f"{version!r} is not a version name: 1 to 40 letters, digits, '-' or '_' (`{DEFAULT_WORD}` is the default "
            "version, which takes what the named ones leave)"
        )
    return version


def checked_share(share: float) -> float:
    if not 0 <= share <= 100:
        raise RampRefused(f"a share is a percent of new conversations, 0 to 100, not {share:g}")
    return share


class Shares(NamedTuple):
    """Each named version's percent of new conversations, and the versions that drain (their share is 0)."""

    shares: dict[str, float]
    draining: frozenset[str]


class Versions(TurnStore):
    """The ramp's table and the ledger's turns per version; the guard's ledger reads `shares` through it."""

    async def shares(self) -> Shares:
        rows = await self._run(lambda conn: conn.execute(select(agent_versions)).all(), single=True)
        draining = frozenset(r.version for r in rows if r.draining)
        return Shares({r.version: 0.0 if r.version in draining else r.share for r in rows}, draining)

    async def ramp(self, version: str, share: float) -> dict[str, float]:
        """Set `version`'s share of new conversations (a draining version ramped takes them again); the shares after.
        Refused when the named versions would take more than all of them; under all of them, a draining default version
        takes the rest again."""
        checked_name(version)
        checked_share(share)
        now = time.time()

        def work(conn: Connection) -> dict[str, float]:
            shares = {r.version: 0.0 if r.draining else r.share for r in conn.execute(select(agent_versions)).all()}
            others = sum(s for v, s in shares.items() if v != version)
            if others + share > 100:
                raise RampRefused(
                    f"the other versions take {others:g} % of new conversations: {version} can take at most "
                    f"{100 - others:g} % (ramp one of them down first)"
                )
            _upsert(conn, version, share, draining=False, now=now, known=version in shares)
            if others + share < 100 and DEFAULT in shares:
                conn.execute(delete(agent_versions).where(agent_versions.c.version == DEFAULT))
                del shares[DEFAULT]
            return {**shares, version: share}

        return await self._run(work, write=True)

    async def drain(self, version: str) -> None:
        """No new conversation for `version` from now on; its conversations' later turns go where the ramp says. The
        default version ("") drains only once the named versions take every new conversation."""
        if version != DEFAULT:
            checked_name(version)
        now = time.time()

        def work(conn: Connection) -> None:
            rows = {r.version: r for r in conn.execute(select(agent_versions)).all()}
            taken = sum(r.share for r in rows.values() if not r.draining)
            if version == DEFAULT and taken < 100:
                raise RampRefused(
                    f"the named versions take {taken:g} % of new conversations: the default version takes the rest "
                    "until they take 100 % (ramp them up first)"
                )
            _upsert(conn, version, 0.0, draining=True, now=now, known=version in rows)

        await self._run(work, write=True)

    async def summary(self) -> list[VersionRow]:
        """Every version the ramp or the ledger names, the default first: share, running turns, outcomes."""
        return await self._run(summary_of)

    async def running(self, version: str) -> int:
        """Turns of `version` not ended yet (one count: a drain asks it every few seconds)."""
        query = select(func.count()).select_from(turns).where(of_version(version), turns.c.status != ENDED)
        return int(await self._run(lambda conn: conn.execute(query).scalar_one(), single=True))


def _upsert(conn: Connection, version: str, share: float, *, draining: bool, now: float, known: bool) -> None:
    values = {"share": share, "draining": int(draining), "updated_at": now}
    if known:
        conn.execute(update(agent_versions).where(agent_versions.c.version == version).values(**values))
    else:
        conn.execute(insert(agent_versions).values(version=version, **values))
