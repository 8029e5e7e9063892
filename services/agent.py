"""What an agent author imports: `from services.agent import Agent, McpServer, ToolContext, ToolError, always, approval_rule`.

An agent is one `Agent(...)` object (services/tools/agent.py says what each field is); the fleet loads it from
`ROUNDTRIP_AGENT=package.module:attribute` (or an entry point in the group `roundtrip.agents`). The demo shop's
agent, services/shop/agent/, is the example.
"""

from services.tools.agent import Agent, AgentError, always, approval_rule, load_agent
from services.tools.context import Dependencies, ToolContext, ToolError
from services.tools.mcp import McpServer
from services.tools.registry import allow

__all__ = ["Agent", "AgentError", "Dependencies", "McpServer", "ToolContext", "ToolError", "allow", "always", "approval_rule",
           "load_agent"]
