"""The organisation audit log page (``/orgs/<slug>/audit/``): owners only. A workspace page,
so it lives here and reads the log through audit/selectors.py (audit/ is the log every app
records into and imports no app's pages).

Anonymous visitors are sent to sign in; a signed-in person who is not a member gets 404 (the
organisation's existence is not revealed); an admin or member gets 403 saying who may see it
(workspaces/selectors.py ``seat_get_owning``). Staff read the whole log in the admin.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from audit import selectors
from workspaces.selectors import seat_get_owning


def _refused(request: HttpRequest, title: str, message: str, status: int, org=None) -> HttpResponse:
    return render(
        request, "workspaces/message.html", {"title": title, "message": message, "org": org},
        status=status,
    )  # fmt: skip


@require_GET
@login_required
def org_audit(request: HttpRequest, slug: str) -> HttpResponse:
    """``GET ?action=&before=``: the organisation's audit log, newest first, 50 a page
    (``before``: the id the "older" link carries; ``action``: one action, or ``admin`` for the
    site administrators'). 400 for a malformed ``before`` or an unknown ``action``."""
    try:
        seat = seat_get_owning(slug=slug, user=request.user)
    except PermissionDenied as exc:
        return _refused(request, "Not allowed", str(exc), 403)
    choices = selectors.action_choices()
    action = request.GET.get("action", "")
    if action and action not in dict(choices):
        return _refused(
            request,
            "Unknown filter",
            f"There is no action {action[:50]!r} to filter by.",
            400,
            seat.org,
        )
    raw_before = request.GET.get("before", "")
    before = None
    if raw_before:
        if not raw_before.isdigit() or len(raw_before) > 19:
            return _refused(request, "Bad page", "'before' must be an entry number.", 400, seat.org)
        before = int(raw_before)
    rows, next_before = selectors.audit_page_for_org(org=seat.org, before=before, action=action)
    context = {
        "seat": seat, "org": seat.org, "current": "audit", "rows": rows, "next_before": next_before,
        "action": action, "choices": choices, "paged": before is not None,
    }  # fmt: skip
    response = render(request, "audit/org_audit.html", context)
    response["Cache-Control"] = "no-store"
    return response
