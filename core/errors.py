"""The ``/v1`` error shape: ``{"error": {"type", "message"}}`` with the right HTTP status.

``ApiError`` is the base of every refusal a view renders (gateway/gate.py ``Refused`` is one)."""

from __future__ import annotations

from django.http import JsonResponse


class ApiError(Exception):
    """Raised anywhere in a ``/v1`` view; rendered by :func:`error_response`.

    ``type`` is a stable machine-readable code (``invalid_request``, ``authentication``,
    ``not_found``, ``conflict``, ``method_not_allowed``, ``unsupported_media_type``,
    ``payload_too_large``, ``unavailable``); ``message`` is for a person.
    """

    def __init__(
        self, status: int, type: str, message: str, headers: dict | None = None, details: dict | None = None
    ):
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.headers = headers or {}
        # Extra fields for the error object (e.g. a moderation verdict's categories).
        self.details = details or {}


def error_response(
    status: int, type: str, message: str, headers: dict | None = None, details: dict | None = None
) -> JsonResponse:
    """A JSON error response in the ``/v1`` shape; ``details`` adds fields to the error object
    (e.g. ``categories`` and ``turn_id`` of a message the moderation gate blocked)."""
    response = JsonResponse({"error": {"type": type, "message": message, **(details or {})}}, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response
