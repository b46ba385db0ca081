"""The project's 404 handler, in the ``/v1`` error shape for ``/v1`` paths (core/errors.py)."""

from __future__ import annotations

from core.errors import error_response


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
