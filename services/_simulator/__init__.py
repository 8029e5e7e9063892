"""A local stand-in for the Anthropic Messages API that plays a support agent.

The real `anthropic` SDK talks to it through `base_url`, so the fleet's model code path runs
offline. Each reply is a pure function of (persona, request body); see personas/ for the
personas, app.py for the headers that choose persona, latency and faults.
"""

from .app import create_app
from .server import running_simulator

__all__ = ["create_app", "running_simulator"]
