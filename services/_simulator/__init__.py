"""A local stand-in for the Anthropic Messages API that plays a support agent: the real `anthropic` SDK talks to it
through `base_url`, so the fleet's model code path runs offline."""

from .app import create_app
from .server import running_simulator

__all__ = ["create_app", "running_simulator"]
