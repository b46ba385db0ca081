"""The site's error pages: 404, 403 and 500 (``handler404`` etc. in chatsite/urls.py).

A ``/v1`` path gets the API's JSON error shape (core/errors.py); every other path gets the
styled page (templates/404.html, 403.html, 500.html) with a way back. A handler must never fail
itself: if its page cannot be rendered (the database is down, so the signed-in user cannot be
loaded; a template breaks) it logs that and answers with a plain page of the same status.

The 500 page is rendered without the request: whatever broke the view (often the database) must
not be needed to say so, so it shows the system colour scheme and no account menu.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string

from core.errors import error_response

logger = logging.getLogger(__name__)

PLAIN = {
    403: "<!doctype html><title>Not allowed</title><h1>You cannot open this page</h1>"
    '<p><a href="/">Back to your chats</a></p>',
    404: "<!doctype html><title>Page not found</title><h1>Nothing here</h1>"
    '<p><a href="/">Back to your chats</a></p>',
    500: "<!doctype html><title>Something went wrong</title><h1>Something went wrong</h1>"
    '<p>Try again in a moment. <a href="/">Back to your chats</a></p>',
}


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/v1/")


def _page(status: int, render_page) -> HttpResponse:
    """``render_page()``'s response, or the plain page for ``status`` when rendering fails."""
    try:
        response = render_page()
    except Exception:  # noqa: BLE001 - an error page must not raise
        logger.exception("the %s page could not be rendered; sent the plain one", status)
        return HttpResponse(PLAIN[status], status=status, content_type="text/html; charset=utf-8")
    response.status_code = status
    return response


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404: an unknown path, or something the user may not know exists (a conversation that is
    not theirs is "missing" too: selectors never reveal existence)."""
    if _is_api(request):
        return error_response(
            404, "not_found",
            f"Nothing at {request.path}: ids are UUIDs, and the endpoints are listed in "
            "/v1/openapi.json.",
        )  # fmt: skip
    return _page(404, lambda: render(request, "404.html", {"request_path": request.path}))


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """403: the user is known but may not do this (e.g. a member's page for a non-admin)."""
    message = str(exception) if exception is not None and str(exception) else ""
    if _is_api(request):
        return error_response(403, "permission_denied", message or "Not allowed.")
    return _page(403, lambda: render(request, "403.html", {"message": message}))


def server_error(request: HttpRequest) -> HttpResponse:
    """500: an unhandled error (Django has logged it). Rendered without the request."""
    if _is_api(request):
        return error_response(500, "server_error", "Something went wrong on our side. Try again.")
    return _page(500, lambda: HttpResponse(render_to_string("500.html")))
