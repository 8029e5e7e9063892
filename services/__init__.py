"""roundtrip: the fleet that runs the tool-calling loop of your support agent. What an agent author imports:

    from roundtrip import Agent, tool, Entity, ToolContext, ToolError, McpServer, always, approval_rule
    from roundtrip.testing import ScriptedModel, FunctionModel, call, run_turn

`Agent(...)` is your agent, declared once, loaded from `ROUNDTRIP_AGENT=package.module:attribute` or an entry point in
the group `roundtrip.agents`. Its tools come from any mix of tool sources: a `SchemaFolder` of JSON Schema documents,
Python functions (`@tool`, an entity id marked `Annotated[str, Entity("kind")]`) and MCP servers (`McpServer`). Its
handlers, resolvers and policies get a `ToolContext` and raise `ToolError` for a result the model reads as an error;
`always(reason)` and `@approval_rule(can_hold=...)` hold calls for a person. `roundtrip.testing` runs a turn of it
in-process through the fleet's own code, with a scripted model. The manual is docs/agent/index.md; `roundtrip agent
init NAME` writes a working agent. Every other module is private (an underscore in its path).
"""

from roundtrip._sdk.agent import Agent, AgentError, FleetSettings, always, approval_rule, load_agent
from roundtrip._sdk.context import Dependencies, ToolContext, ToolError
from roundtrip._sdk.functions import Entity, FunctionTool, tool
from roundtrip._sdk.mcp import McpServer
from roundtrip._sdk.mcp_auth import BearerToken, ClientCredentials
from roundtrip._sdk.registry import allow
from roundtrip._sdk.sources import SchemaFolder, ToolSource

__all__ = [
    "Agent",
    "AgentError",
    "BearerToken",
    "ClientCredentials",
    "Dependencies",
    "Entity",
    "FleetSettings",
    "FunctionTool",
    "McpServer",
    "SchemaFolder",
    "ToolContext",
    "ToolError",
    "ToolSource",
    "allow",
    "always",
    "approval_rule",
    "load_agent",
    "tool",
]
