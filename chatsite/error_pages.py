"""The site's error pages: 404, 403, 500 (``handler404`` etc. in chatsite/urls.py) and 503
while the database cannot be reached (:func:`unavailable_response`, issue 26).

A ``/v1`` path gets the API's JSON error shape (core/errors.py); every other path gets the
styled page (templates/404.html, 403.html, 500.html) with a way back. A handler must never fail
itself: if its page cannot be rendered (the database is down, so the signed-in user cannot be
loaded; a template breaks) it logs that and answers with a plain page of the same status.

The 500 and 503 pages are rendered without the request: whatever broke the view (often the database) must
not be needed to say so, so it shows the system colour scheme and no account menu.
"""

from __future__ import annotations

import json
import logging
import sys

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string

from core.errors import error_response
from core.unavailable import unavailable_error

logger = logging.getLogger(__name__)

PLAIN = {
    403: "<!doctype html><title>Not allowed</title><h1>You cannot open this page</h1>"
    '<p><a href="/">Back to your chats</a></p>',
    404: "<!doctype html><title>Page not found</title><h1>Nothing here</h1>"
    '<p><a href="/">Back to your chats</a></p>',
    500: "<!doctype html><title>Something went wrong</title><h1>Something went wrong</h1>"
    '<p>Try again in a moment. <a href="/">Back to your chats</a></p>',
    503: "<!doctype html><title>Back in a moment</title><h1>Back in a moment</h1>"
    '<p>The service cannot reach its database right now. Try again shortly. '
    '<a href="">Try again</a></p>',
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


def unavailable_response(request: HttpRequest, exc: BaseException) -> HttpResponse | None:
    """503 with ``Retry-After`` when ``exc`` means the database cannot be reached
    (core/unavailable.py), else None. ``/v1``: the API's JSON error. An htmx request: no swap
    (``HX-Reswap: none``) and a ``chat:unavailable`` event carrying the message, which the page
    shows above the message box or in its notice (static/chat/layout.js), so nothing the
    person typed is replaced. Any other page: templates/503.html, rendered without the request
    (loading the signed-in user needs the database)."""
    error = unavailable_error(exc)
    if error is None:
        return None
    logger.warning("%s %s: database unavailable, answered 503: %s", request.method, request.path, exc)
    if _is_api(request):
        response = error_response(error.status, error.type, error.message, error.headers, error.details)
    elif request.headers.get("HX-Request") == "true":
        response = HttpResponse(status=503)
        response["HX-Reswap"] = "none"
        response["HX-Trigger"] = json.dumps({"chat:unavailable": {"message": error.message}})
    else:
        response = _page(503, lambda: HttpResponse(render_to_string("503.html", {"message": error.message})))
    for name, value in error.headers.items():
        response[name] = value
    return response


def server_error(request: HttpRequest) -> HttpResponse:
    """500: an unhandled error (Django has logged it). Rendered without the request. An error
    that means the database cannot be reached, raised where no view could catch it (a
    middleware loading the session), is a 503 instead (:func:`unavailable_response`; Django
    calls this handler inside its ``except`` block, so the error is ``sys.exc_info()``'s)."""
    exc = sys.exc_info()[1]
    unavailable = unavailable_response(request, exc) if exc is not None else None
    if unavailable is not None:
        return unavailable
    if _is_api(request):
        return error_response(500, "server_error", "Something went wrong on our side. Try again.")
    return _page(500, lambda: HttpResponse(render_to_string("500.html")))
