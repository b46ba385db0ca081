"""The ``/v1`` error shape: ``{"error": {"type", "message"}}`` with the right HTTP status."""

from __future__ import annotations

from django.http import JsonResponse


class ApiError(Exception):
    """Raised anywhere in a ``/v1`` view; rendered by :func:`error_response`.

    ``type`` is a stable machine-readable code (``invalid_request``, ``authentication``,
    ``not_found``, ``conflict``, ``method_not_allowed``, ``unsupported_media_type``,
    ``payload_too_large``, ``unavailable``); ``message`` is for a person.
    """

    def __init__(self, status: int, type: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.headers = headers or {}


def error_response(
    status: int, type: str, message: str, headers: dict | None = None, details: dict | None = None
) -> JsonResponse:
    """A JSON error response in the ``/v1`` shape; ``details`` adds fields to the error object
    (e.g. ``categories`` and ``turn_id`` of a message the moderation gate blocked)."""
    response = JsonResponse({"error": {"type": type, "message": message, **(details or {})}}, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def page_not_found(request, exception):
    """The project's 404 handler (``handler404`` in chatsite/urls.py): a ``/v1`` path that
    matches no route (an unknown endpoint, or an id that is not a UUID) gets the JSON error
    shape; every other path gets Django's own 404 page."""
    if request.path.startswith("/v1/"):
        return error_response(
            404, "not_found",
            f"Nothing at {request.path}: ids are UUIDs, and the endpoints are listed in "
            "/v1/openapi.json.",
        )  # fmt: skip
    from django.views.defaults import page_not_found as django_page_not_found  # noqa: PLC0415

    return django_page_not_found(request, exception)
