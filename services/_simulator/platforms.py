"""The Messages API in each cloud platform's shape (Bedrock, Vertex AI, Foundry), so the SDK's own platform clients
can be tested against it.

Each platform carries the same body in its own envelope, with its own authentication and error answers, and answers a
throttle without any `anthropic-ratelimit-*` header. Routes and base URLs: docs/decisions/simulator.md.
"""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .errors import ApiError, invalid

ANTHROPIC_VERSIONS = {"bedrock": "bedrock-2023-05-31", "vertex": "vertex-2023-10-16"}
BEDROCK_ERRORS = {
    400: "ValidationException",
    401: "UnrecognizedClientException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    413: "ValidationException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    529: "ServiceUnavailableException",
}
GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
THROTTLED = {
    "bedrock": "Too many requests, please wait before trying again.",
    "vertex": "Resource exhausted. Please try again later. Please refer to "
    "https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more details.",
}


@dataclass(frozen=True)
class Platform:
    name: str
    authenticate: Callable[[Request], None]
    error: Callable[[ApiError, str], Response]
    event_stream: bool = False  # its stream is AWS's event-stream framing, not server-sent events

    def body(self, request: Request, body: Any) -> Any:
        """The Messages API body of a platform's request: its model (and, on Bedrock, `stream`) from the path."""
        if self.name in ANTHROPIC_VERSIONS and isinstance(body, dict):
            if body.pop("anthropic_version", None) is None:
                raise invalid("anthropic_version: Field required")
            if "model" in body:
                raise invalid("model: Extra inputs are not permitted (the model is in the path)")
            path = request.path_params
            body["model"] = _bedrock_model(path["model"]) if self.name == "bedrock" else path["model"]
            if self.name == "bedrock":
                if "stream" in body:
                    raise invalid("stream: Extra inputs are not permitted")
                body["stream"] = request.url.path.endswith("/invoke-with-response-stream")
        return body


def _bedrock_model(model_id: str) -> str:
    """The model a Bedrock id names, as its answer's `model` says it: without the inference profile's geography, the
    `anthropic.` and the version (`-v1:0`); an ARN names a profile the simulator cannot resolve: plain `claude`."""
    if model_id.startswith("arn:"):
        return "claude"
    name = re.sub(r"^(?:[a-z]{2,6}\.)?anthropic\.", "", model_id)
    return re.sub(r"-v\d+(?::\d+)?$", "", name)


def _bedrock_auth(request: Request) -> None:
    authorization = request.headers.get("authorization", "")
    if not (authorization.startswith("AWS4-HMAC-SHA256 Credential=") or authorization.startswith("Bearer ")):
        raise ApiError(403, "Missing Authentication Token (a SigV4 Authorization header or a Bedrock API key)")
    if authorization.startswith("AWS4-HMAC-SHA256") and not request.headers.get("x-amz-date"):
        raise ApiError(403, "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.")


def _bedrock_error(error: ApiError, request_id: str) -> Response:
    status = 503 if error.status == 529 else error.status
    kind = BEDROCK_ERRORS.get(error.status, "InternalServerException")
    message = THROTTLED["bedrock"] if error.status == 429 else error.message
    headers = {"x-amzn-requestid": request_id, "x-amzn-errortype": f"{kind}:http://internal.amazon.com/coral/"}
    return JSONResponse({"message": message}, status_code=status, headers=headers)


def _bearer(request: Request) -> None:
    if not request.headers.get("authorization", "").startswith("Bearer "):
        raise ApiError(401, "Request is missing required authentication credential. Expected OAuth 2 access token.")


def _google_error(error: ApiError, request_id: str) -> Response:
    status = 503 if error.status == 529 else error.status
    message = THROTTLED["vertex"] if status == 429 else error.message
    body = {"error": {"code": status, "message": message, "status": GOOGLE_STATUS.get(status, "UNKNOWN")}}
    return JSONResponse(body, status_code=status, headers={"x-request-id": request_id})


def _foundry_auth(request: Request) -> None:
    if not (
        request.headers.get("api-key")
        or request.headers.get("x-api-key")
        or request.headers.get("authorization", "").startswith("Bearer ")
    ):
        raise ApiError(401, "Access denied due to missing subscription key or Entra ID token.")


def _foundry_error(error: ApiError, request_id: str) -> Response:
    kept = {k: v for k, v in error.headers.items() if k.lower() in ("retry-after", "retry-after-ms")}
    return JSONResponse(error.body(request_id), status_code=error.status, headers={"request-id": request_id, **kept})


def event_frame(event: str, data: dict[str, Any]) -> bytes:
    """One event of a Bedrock stream in AWS event-stream framing, the payload a `chunk` with the API event's JSON in
    `bytes`."""
    raw = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    payload = json.dumps({"bytes": base64.b64encode(raw).decode()}).encode()
    headers = b"".join(
        struct.pack("!B", len(name)) + name.encode() + struct.pack("!BH", 7, len(value)) + value.encode()
        for name, value in ((":event-type", "chunk"), (":content-type", "application/json"), (":message-type", "event"))
    )
    prelude = struct.pack("!II", 16 + len(headers) + len(payload), len(headers))
    message = prelude + struct.pack("!I", zlib.crc32(prelude)) + headers + payload
    return message + struct.pack("!I", zlib.crc32(message))


BEDROCK = Platform("bedrock", _bedrock_auth, _bedrock_error, event_stream=True)
VERTEX = Platform("vertex", _bearer, _google_error)
FOUNDRY = Platform("foundry", _foundry_auth, _foundry_error)
