"""The tool registry, the tool context and the agent declaration every service loads (services/agent.py is its public face)."""

from services.tools.context import Dependencies, ToolContext, ToolError
from services.tools.registry import Registry, RegistryError, ToolSpec, load_registry

__all__ = ["Dependencies", "Registry", "RegistryError", "ToolContext", "ToolError", "ToolSpec", "load_registry"]
