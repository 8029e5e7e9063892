"""What an agent author imports: `from roundtrip import Agent, Entity, McpServer, ToolContext, ToolError, tool, always,
approval_rule`.

An agent is one `Agent(...)` object (services/_sdk/agent.py says what each field is); the fleet loads it from
`ROUNDTRIP_AGENT=package.module:attribute` (or an entry point in the group `roundtrip.agents`). The demo shop's
agent, services/_shop/agent/, is the example. Its tools come from tool sources, any mix in `tools=[...]`
(services/_sdk/sources.py): JSON Schema documents in a `SchemaFolder(path, handlers=...)` (or `tools_dir`), Python
functions (`@tool`, an entity id marked `Annotated[str, Entity("kind")]`: services/_sdk/functions.py), `McpServer`s. Its tests
run turns in-process with services/testing/__init__.py; `roundtrip agent check` lists every problem of it.
"""

from roundtrip._sdk.agent import Agent, AgentError, always, approval_rule, load_agent
from roundtrip._sdk.context import Dependencies, ToolContext, ToolError
from roundtrip._sdk.functions import Entity, FunctionTool, tool
from roundtrip._sdk.mcp import McpServer
from roundtrip._sdk.registry import allow
from roundtrip._sdk.sources import SchemaFolder, ToolSource

__all__ = ["Agent", "AgentError", "Dependencies", "Entity", "FunctionTool", "McpServer", "SchemaFolder", "ToolContext", "ToolError",
           "ToolSource", "allow", "always", "approval_rule", "load_agent", "tool"]
