"""A small MCP server for the tests, run as its own process: one tool, over streamable HTTP, logging every call.

`python -m tests.mcp_server PORT LOG` serves http://127.0.0.1:PORT/mcp (`start` runs that, `answers` tells when it is
up). The tool is `gift_wrap_order(order_id, message)`; each call the server receives is one JSON line of LOG ({"tool",
"arguments", "customer_id"}), written before it answers, so a test can tell which calls reached it. A message "out of
paper" gets an `isError` result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

TOOL = "gift_wrap_order"


def build(log: Path) -> MCPServer:
    server = MCPServer("giftwrap", log_level="WARNING")

    @server.tool(name=TOOL)
    def gift_wrap_order(order_id: str, message: Annotated[str, Field(max_length=80)], ctx: Context) -> dict[str, Any]:
        """Gift-wrap one of the customer's orders, with a card carrying a short message."""
        meta = ctx.request_context.meta or {}
        with log.open("a", encoding="utf-8") as out:
            out.write(
                json.dumps(
                    {
                        "tool": TOOL,
                        "arguments": {"order_id": order_id, "message": message},
                        "customer_id": meta.get("roundtrip/customer_id"),
                    }
                )
                + "\n"
            )
        if message == "out of paper":
            raise ToolError("The wrapping station is out of paper; nothing was wrapped.")
        return {"order_id": order_id, "gift_wrapped": True, "card": message}

    return server


def calls(log: Path) -> list[dict[str, Any]]:
    """Every call the server received, in order."""
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []


def start(port: int, log: Path, out: Path) -> subprocess.Popen:
    """The server as its own process on this port, logging calls to `log`, its output appended to `out`."""
    with out.open("ab") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.mcp_server", str(port), str(log)], stdout=sink, stderr=sink
        )
    return process


def answers(url: str) -> bool:
    """Something answers HTTP at this URL."""
    try:
        httpx.get(url, timeout=1)
    except httpx.TransportError:
        return False
    return True


if __name__ == "__main__":
    build(Path(sys.argv[2])).run("streamable-http", port=int(sys.argv[1]))
