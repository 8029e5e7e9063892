"""Agent versions side by side (docs/decisions/agent-versions.md): the share of new conversations each named version
takes (the ramp; the default version takes the rest), which the operator sets (`roundtrip versions ramp`) and the
guard reads at each start; and what each version's turns did, from the ledger."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from sqlalchemy import Connection, delete, func, insert, select, update

from roundtrip._kernel.storage.turnstore import ENDED, TurnStore, agent_versions, turns
from roundtrip._kernel.wire import topics

DEFAULT = ""  # the default version: today's topic names, and the share the named versions leave
DEFAULT_WORD = "default"  # how the operator names the default version (`roundtrip versions drain default`)
_PER_VERSION = select(turns.c.agent_version, turns.c.status, turns.c.outcome, func.count()).group_by(
    turns.c.agent_version, turns.c.status, turns.c.outcome
)


class RampRefused(ValueError):
    """A ramp the fleet cannot take (one line for the operator)."""


@dataclass
class VersionRow:
    """One version: its share of new conversations (percent), whether it drains, its running turns, its ended turns
    by outcome."""

    version: str
    share: float
    draining: bool = False
    running: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def ended(self) -> int:
        return sum(self.outcomes.values())


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

        def work(conn: Connection) -> list[VersionRow]:
            ramp = conn.execute(select(agent_versions)).all()
            rows = {r.version: VersionRow(r.version, r.share, bool(r.draining)) for r in ramp}
            found = {DEFAULT: VersionRow(DEFAULT, max(0.0, 100 - sum(r.share for r in rows.values()))), **rows}
            for version, status, outcome, n in conn.execute(_PER_VERSION).all():
                row = found.setdefault(version or DEFAULT, VersionRow(version or DEFAULT, 0.0))
                if status != ENDED:  # running, waiting for the API or a person, or ending
                    row.running += n
                elif outcome:
                    row.outcomes[outcome] = row.outcomes.get(outcome, 0) + n
            return [found[v] for v in sorted(found)]

        return await self._run(work)


def _upsert(conn: Connection, version: str, share: float, *, draining: bool, now: float, known: bool) -> None:
    values = {"share": share, "draining": int(draining), "updated_at": now}
    if known:
        conn.execute(update(agent_versions).where(agent_versions.c.version == version).values(**values))
    else:
        conn.execute(insert(agent_versions).values(version=version, **values))
