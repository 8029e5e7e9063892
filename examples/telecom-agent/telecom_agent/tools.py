"""The carrier agent's handlers, ownership rule, policies, approval rule and settings.

Ownership: a line is visible to its account holder and to the members of its family plan (`resolve_line`, which
the gate calls for every `line_id` before anything runs); anyone else, and an invented id, get "not found".
Changing a line (its plan, porting its number out) is the holder's alone: `holder_only` is the policy of both.
Porting a number out always waits for a person (`roundtrip.always`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from roundtrip import ToolContext, ToolError, always
from telecom_agent.carrier import Carrier


class TelecomSettings(BaseSettings):
    """The agent's own settings (ROUNDTRIP_TELECOM_*)."""

    model_config = SettingsConfigDict(env_prefix="ROUNDTRIP_TELECOM_", extra="ignore")

    database: Path | None = Field(
        None, description="SQLite file of the carrier's lines; unset: telecom.db in the fleet's state_dir"
    )


def not_yours(line_id: str) -> str:
    return f"No line {line_id} was found for this customer. Call list_lines to see their lines; never guess a line id."


# -- handlers ---------------------------------------------------------------------------------------------------


async def list_lines(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    lines = await ctx.deps.carrier.lines_of(ctx.customer_id)
    return {"lines": [_shown(line) for line in lines], "count": len(lines)}


async def get_line(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    line = await ctx.deps.carrier.line_for(ctx.customer_id, args["line_id"])
    if line is None:
        raise ToolError(not_yours(args["line_id"]))
    return _shown(line)


async def change_plan(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    line = await ctx.deps.carrier.change_plan(ctx.customer_id, args["line_id"], args["plan"])
    if line is None:
        raise ToolError(f"The plan of line {args['line_id']} was not changed: only its account holder can change it.")
    return {"changed": True, "line": _shown(line), "note": "The new plan applies from the next billing cycle."}


async def port_out_number(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    request = await ctx.deps.carrier.port_out(
        ctx.customer_id, args["line_id"], args["new_carrier"], ctx.idempotency_key
    )
    if request is None:
        raise ToolError(f"Line {args['line_id']} cannot be ported out: it is not an active line this customer holds.")
    return {"ported": True, **request, "note": "Give the customer the transfer code for their new carrier."}


def _shown(line: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in line.items() if k != "holder_id"}


# -- the ownership rule and the policies --------------------------------------------------------------------------


async def resolve_line(line_id: str, ctx: ToolContext) -> dict[str, Any] | None:
    """The line as the principal may see it (holder or family-plan member), else None."""
    carrier: Carrier = ctx.deps.carrier  # the agent's dependency (Dependencies holds any client)
    return await carrier.line_for(ctx.customer_id, line_id)


async def holder_only(args: dict[str, Any], entities: dict[str, dict[str, Any]], ctx: ToolContext) -> str | None:
    line = entities.get("line_id")
    if line is None:
        return not_yours(args.get("line_id", "?"))
    if line.get("your_role") != "holder":
        return (
            f"Line {line['line_id']} is on a family plan this customer shares but does not hold: they may see it, "
            "but only the account holder can change it. Tell the customer to ask the account holder."
        )
    if line.get("status") != "active":
        return f"Line {line['line_id']} is {line.get('status')}; only an active line can be changed."
    return None


port_out_approval = always("porting a number out to another carrier is irreversible: a person confirms every port-out")
