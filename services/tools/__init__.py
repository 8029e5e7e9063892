"""The tool registry and the support tool pack (handlers bound to schemas/tools/*.json)."""

from services.tools.context import ToolContext, ToolError
from services.tools.registry import Registry, RegistryError, ToolSpec, load_registry
from services.tools.shop_client import ShopClient

__all__ = ["Registry", "RegistryError", "ShopClient", "ToolContext", "ToolError", "ToolSpec", "load_registry"]
