"""Where a page may send its visitor back to: the ``next`` a form or link carries."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils.http import url_has_allowed_host_and_scheme


def next_on_site(request: HttpRequest, target: str) -> str:
    """``target`` when it is a URL on this site (this request's host, or a path; https when the
    request is), else "". Django's ``url_has_allowed_host_and_scheme`` decides, so what browsers
    read as another site ("//evil.example", "/\\evil.example", a tab inside "//") is refused."""
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return ""
