"""What an agent author imports: `from services.agent import Agent, Entity, McpServer, ToolContext, ToolError, tool, always,
approval_rule`.

An agent is one `Agent(...)` object (services/tools/agent.py says what each field is); the fleet loads it from
`ROUNDTRIP_AGENT=package.module:attribute` (or an entry point in the group `roundtrip.agents`). The demo shop's
agent, services/shop/agent/, is the example. Tools are JSON Schema documents in the agent's `tools_dir`, or Python
functions (`@tool`, an entity id marked `Annotated[str, Entity("kind")]`: services/tools/functions.py). Its tests
run turns in-process with services/testing.py; `roundtrip agent check` lists every problem of it.
"""

from services.tools.agent import Agent, AgentError, always, approval_rule, load_agent
from services.tools.context import Dependencies, ToolContext, ToolError
from services.tools.functions import Entity, FunctionTool, tool
from services.tools.mcp import McpServer
from services.tools.registry import allow

__all__ = ["Agent", "AgentError", "Dependencies", "Entity", "FunctionTool", "McpServer", "ToolContext", "ToolError", "allow",
           "always", "approval_rule", "load_agent", "tool"]
