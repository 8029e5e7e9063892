"""API errors shaped like the real Messages API, so the SDK raises its own exception classes.

Body: {"type": "error", "error": {"type": ..., "message": ...}, "request_id": ...}.
Status -> SDK class: 400 BadRequestError, 401 AuthenticationError, 404 NotFoundError,
429 RateLimitError, 500 InternalServerError, 529 OverloadedError (the SDK retries 429/5xx).
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "api_error",
    529: "overloaded_error",
}


class ApiError(Exception):
    """An error answer: HTTP status, error type and a precise message."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = ERROR_TYPES.get(status, "api_error")
        self.headers = headers or {}

    def body(self, request_id: str) -> dict[str, Any]:
        return {
            "type": "error",
            "error": {"type": self.error_type, "message": self.message},
            "request_id": request_id,
        }


def invalid(message: str) -> ApiError:
    """400 invalid_request_error: the request is malformed (usually a fleet bug)."""
    return ApiError(400, message)


def new_request_id() -> str:
    return f"req_sim_{uuid.uuid4().hex[:24]}"


def error_response(error: ApiError, request_id: str) -> Response:
    headers = {"request-id": request_id, **error.headers}
    return JSONResponse(error.body(request_id), status_code=error.status, headers=headers)


def authenticate(request: Request) -> None:
    if not request.headers.get("x-api-key") and not request.headers.get("authorization"):
        raise ApiError(401, "x-api-key header is required")


def header_number(request: Request, header: str, default: float) -> float:
    """The non-negative number a header gives, else `default`; 400 for anything else."""
    value = request.headers.get(header)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        raise invalid(f"{header}: expected a number, got {value!r}") from None
    if number < 0 or math.isnan(number):
        raise invalid(f"{header}: expected a non-negative number, got {value!r}")
    return number
