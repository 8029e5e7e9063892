"""API errors shaped like the real Messages API, so the SDK raises its own exception classes.

Body: {"type": "error", "error": {"type": ..., "message": ...}, "request_id": ...}.
Status -> SDK class: 400 BadRequestError, 401 AuthenticationError, 404 NotFoundError,
429 RateLimitError, 500 InternalServerError, 529 OverloadedError (the SDK retries 429/5xx).
"""

from __future__ import annotations

from typing import Any

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
