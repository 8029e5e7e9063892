"""An MCP server for the tests that requires credentials, run as its own process, through the `mcp` package's own
resource-server support (a TokenVerifier, AuthSettings: its bearer middleware answers 401 with the
`WWW-Authenticate` that points at its protected-resource metadata, which names the authorization server).

    python -m tests.mcp_auth_server PORT LOG TOOL token FILE      the token must be FILE's content (read per request)
    python -m tests.mcp_auth_server PORT LOG TOOL oauth ISSUER    the token must be active at ISSUER's /introspect
    ... [SPANS]                                                   its spans appended to the span file SPANS

With SPANS, the `mcp` package's own server spans (one per request, a child of the trace context the request's
`_meta` carries) are exported as a company's MCP server would export them to its collector: here to the fleet's span
file, which `roundtrip trace` reads, as service `mcp-TOOL`.

Its one tool, TOOL(order_id, message), serves http://127.0.0.1:PORT/mcp; each call it receives is one JSON line of LOG
({"tool", "arguments", "customer_id", "client_id", "traceparent"}: who called, and the trace context its `_meta`
carried), written before it answers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import httpx
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field


class FileToken:
    """Accepts the token in a file (changing the file revokes the old one)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def verify_token(self, token: str) -> AccessToken | None:
        if token != self.path.read_text(encoding="utf-8").strip():
            return None
        return AccessToken(token=token, client_id="static", scopes=[])


class Introspected:
    """Accepts a token the authorization server says is active (RFC 7662)."""

    def __init__(self, issuer: str) -> None:
        self.issuer = issuer

    async def verify_token(self, token: str) -> AccessToken | None:
        async with httpx.AsyncClient(timeout=10) as http:
            answer = (await http.post(f"{self.issuer}/introspect", data={"token": token})).json()
        if not answer.get("active"):
            return None
        return AccessToken(
            token=token, client_id=answer["client_id"], scopes=answer["scope"].split(), expires_at=answer["exp"]
        )


def build(port: int, log: Path, tool: str, mode: str, arg: str) -> MCPServer:
    verifier = FileToken(Path(arg)) if mode == "token" else Introspected(arg)
    issuer = arg if mode == "oauth" else f"http://127.0.0.1:{port}"  # a bearer token is not OAuth: any issuer does
    server = MCPServer(
        tool,
        log_level="WARNING",
        token_verifier=verifier,
        auth=AuthSettings(
            issuer_url=issuer, resource_server_url=f"http://127.0.0.1:{port}/mcp", validate_token_resource=False
        ),
    )

    @server.tool(name=tool)
    def wrap(order_id: str, message: Annotated[str, Field(max_length=80)], ctx: Context) -> dict[str, Any]:
        """Gift-wrap one of the customer's orders, with a card carrying a short message."""
        meta = ctx.request_context.meta or {}
        from mcp.server.auth.middleware.auth_context import get_access_token

        token = get_access_token()
        with log.open("a", encoding="utf-8") as out:
            line = {
                "tool": tool,
                "arguments": {"order_id": order_id, "message": message},
                "customer_id": meta.get("roundtrip/customer_id"),
                "client_id": token.client_id if token else None,
                "traceparent": meta.get("traceparent"),
            }
            out.write(json.dumps(line) + "\n")
        return {"order_id": order_id, "gift_wrapped": True, "card": message}

    return server


def export_spans(tool: str, spans: Path) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from roundtrip._kernel.observability.span_file import JsonLinesSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": f"mcp-{tool}"}))
    exporter = JsonLinesSpanExporter(spans, max_bytes=0, backups=0)  # 0: never rotated
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # written as each span ends
    trace.set_tracer_provider(provider)


if __name__ == "__main__":
    port, log, tool, mode, arg = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    if len(sys.argv) > 6:
        export_spans(tool, Path(sys.argv[6]))
    build(port, log, tool, mode, arg).run("streamable-http", port=port)
