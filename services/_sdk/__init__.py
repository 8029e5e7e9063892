"""The tool registry, the tool context and the agent declaration every service loads (public: services/__init__.py)."""

from roundtrip._sdk.context import Dependencies, ToolContext, ToolError
from roundtrip._sdk.registry import Registry, RegistryError, ToolSpec

__all__ = ["Dependencies", "Registry", "RegistryError", "ToolContext", "ToolError", "ToolSpec"]
