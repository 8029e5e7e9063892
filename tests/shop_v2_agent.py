"""Version 2 of the demo shop's agent, as the package ships it (roundtrip._shop.agent.v2): another system prompt, and
its help center search renamed (`search_faq`); the rest as the shop's. `ROUNDTRIP_AGENT=tests.shop_v2_agent:AGENT`.
"""

from __future__ import annotations

from roundtrip._shop.agent.v2 import AGENT, RENAMED, SYSTEM_PROMPT

__all__ = ["AGENT", "RENAMED", "SYSTEM_PROMPT"]
