"""Privacy pages: your data (``/settings/data/``: download it), deleting your account
(``/settings/delete-account/``), and for an organisation's owners its export
(``/orgs/<slug>/export/``) and deletion (``/orgs/<slug>/delete/``).

Thin: parse, check, call privacy/export.py or privacy/services.py, render. Anonymous visitors
are sent to sign in. Organisation pages: owners only; admins and members get 403 with the
reason, anyone else 404 (workspaces/selectors.py ``seat_get_owning``). Downloads and deletions
are POSTs (CSRF-checked); a deletion asks for the account's password, counted against the same
failed-sign-in limit as the sign-in page (accounts/throttle.py: it is the same secret).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import IO

from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts import throttle
from accounts.request_info import client_ip
from audit.models import Action
from audit.services import audit_record
from conversations.selectors import conversation_get_for_user
from privacy import export, selectors, services
from privacy.conversation_export import (
    conversation_export_json,
    conversation_export_markdown,
    export_filename,
)
from privacy.forms import ConfirmForm
from workspaces.selectors import seat_get_owning

CHUNK = 256 * 1024  # bytes per read of the archive while it is sent


async def _chunks(file: IO[bytes]) -> AsyncIterator[bytes]:
    """The file's bytes, read in a worker thread (a large archive never blocks the event
    loop or sits in memory); the file (temporary: deleted on close) is closed at the end or
    when the client goes away."""
    try:
        while chunk := await asyncio.to_thread(file.read, CHUNK):
            yield chunk
    finally:
        file.close()


def archive_response(archive: export.Export) -> StreamingHttpResponse:
    """A download of ``archive`` (application/zip, as an attachment, never cached)."""
    response = StreamingHttpResponse(_chunks(archive.file), content_type="application/zip")
    response["Content-Length"] = str(archive.size)
    response["Content-Disposition"] = content_disposition_header(True, archive.filename)
    response["Cache-Control"] = "no-store"
    response["X-Content-Type-Options"] = "nosniff"
    return response


# One conversation's download (privacy/conversation_export.py): extension -> content type, builder.
CONVERSATION_FORMATS = {
    "md": ("text/markdown; charset=utf-8", conversation_export_markdown),
    "json": ("application/json", conversation_export_json),
}


@require_GET
@login_required
def conversation_export(request: HttpRequest, conversation_id, extension: str) -> HttpResponse:
    """``GET /c/<id>/export.md`` (the branch the page shows) or ``.json`` (the whole tree): one
    conversation as an attachment (privacy/conversation_export.py), never cached. Owner only:
    404 for anyone else, as on the other conversation routes (an organisation's conversation
    while a member); 404 for another extension."""
    if extension not in CONVERSATION_FORMATS:
        raise Http404("No such export format.")
    conversation = conversation_get_for_user(conversation_id=conversation_id, user=request.user)
    content_type, build = CONVERSATION_FORMATS[extension]
    response = HttpResponse(build(conversation=conversation), content_type=content_type)
    response["Content-Disposition"] = content_disposition_header(True, export_filename(conversation, extension))
    response["Cache-Control"] = "no-store"
    response["X-Content-Type-Options"] = "nosniff"
    return response


def _page(request: HttpRequest, template: str, context: dict, status: int = 200) -> HttpResponse:
    response = render(request, template, context, status=status)
    response["Cache-Control"] = "no-store"
    return response


def _owner_seat(request: HttpRequest, slug: str):
    """The request user's seat as an owner of ``slug``, or a 403 page (Http404 propagates)."""
    try:
        return seat_get_owning(slug=slug, user=request.user), None
    except PermissionDenied as exc:
        page = render(
            request,
            "workspaces/message.html",
            {"title": "Not allowed", "message": str(exc)},
            status=403,
        )
        return None, page


def _locked_out(request: HttpRequest, form: ConfirmForm) -> HttpResponse | None:
    """A 429 (with Retry-After and the sign-in page's message) while sign-ins to the account
    are locked: the password is then not checked at all, as on the sign-in page."""
    if not form.uses_password:
        return None
    lockout = throttle.login_lockout(username=request.user.get_username(), ip=client_ip(request))
    if lockout is None:
        return None
    response = HttpResponse(lockout.message, status=429, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(lockout.retry_after_s)
    return response


def _confirms(request: HttpRequest, form: ConfirmForm) -> bool:
    """Whether ``form`` is valid; a wrong password counts as a failed sign-in."""
    valid = form.is_valid()
    if form.password_failed:
        throttle.login_failed(username=request.user.get_username(), ip=client_ip(request))
    return valid


# --- your data --------------------------------------------------------------------------------


@require_GET
@login_required
def data_page(request: HttpRequest) -> HttpResponse:
    """What we hold about you and the button that downloads it."""
    return _page(request, "privacy/data.html", {"current": "data"})


@require_POST
@login_required
def data_export(request: HttpRequest) -> HttpResponse:
    """Build your archive (privacy/export.py) and send it; recorded in the audit log."""
    archive = export.user_export_build(user=request.user)
    audit_record(
        actor=request.user,
        action=Action.ACCOUNT_EXPORT,
        target_type="accounts.user",
        target_id=request.user.pk,
        details={"bytes": archive.size, "via": "web"},
    )
    return archive_response(archive)


@require_http_methods(["GET", "POST"])
@login_required
def account_delete(request: HttpRequest) -> HttpResponse:
    """``GET``: what deletion removes and keeps, what blocks it, and the form. ``POST``
    (password, or username for accounts without one): delete the account everywhere
    (privacy/services.py), sign out, and go to the goodbye page. 400 with the form's errors,
    409 while you are the last owner of an organisation (saying what to do), 429 while
    sign-ins to the account are locked."""
    user = request.user
    blockers = selectors.last_owner_orgs(user=user)
    form = ConfirmForm(request.POST or None, user=user)
    status = 200
    if request.method == "POST":
        refused = _locked_out(request, form)
        if refused is not None:
            return refused
        if not _confirms(request, form):
            status = 400
        else:
            try:
                services.account_delete(user=user)
            except services.DeletionBlocked as exc:
                blockers, status = exc.orgs, 409
            else:
                logout(request)
                return redirect("account-deleted")
    context = {"form": form, "blockers": blockers, "current": "data"}
    return _page(request, "privacy/delete_account.html", context, status=status)


@require_GET
def account_deleted(request: HttpRequest) -> HttpResponse:
    """The page after a deletion (no account any more, so no sign-in needed)."""
    return _page(request, "privacy/account_deleted.html", {})


# --- an organisation's data -----------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@login_required
def org_export(request: HttpRequest, slug: str) -> HttpResponse:
    """``GET``: what the organisation's archive holds. ``POST``: build and send it; recorded in
    the organisation's audit log. Owners only (403 for admins and members, 404 for others)."""
    seat, refused = _owner_seat(request, slug)
    if refused is not None:
        return refused
    if request.method == "GET":
        return _page(
            request, "privacy/org_export.html", {"seat": seat, "org": seat.org, "current": "export"}
        )
    archive = export.org_export_build(org=seat.org)
    audit_record(
        actor=request.user,
        action=Action.ORG_EXPORT,
        org=seat.org,
        target_type="accounts.organisation",
        target_id=seat.org.pk,
        details={"bytes": archive.size},
    )
    return archive_response(archive)


@require_http_methods(["GET", "POST"])
@login_required
def org_delete(request: HttpRequest, slug: str) -> HttpResponse:
    """``GET``: what deleting the organisation removes, and the form. ``POST`` (its URL name and
    your password): delete it with every conversation that belongs to it, in every region
    (privacy/services.py), then back to your organisations (303). 400 with the form's errors,
    429 while sign-ins to your account are locked. Owners only."""
    seat, refused = _owner_seat(request, slug)
    if refused is not None:
        return refused
    form = ConfirmForm(request.POST or None, user=request.user, slug=seat.org.slug)
    status = 200
    if request.method == "POST":
        refused = _locked_out(request, form)
        if refused is not None:
            return refused
        if _confirms(request, form):
            services.organisation_delete(org=seat.org, actor=request.user)
            messages.success(request, f"{seat.org.name} and its conversations are deleted.")
            response = redirect("org-list")
            response.status_code = 303
            return response
        status = 400
    context = {
        "seat": seat,
        "org": seat.org,
        "current": "delete",
        "form": form,
        "summary": selectors.org_deletion_summary(org=seat.org),
    }
    return _page(request, "privacy/org_delete.html", context, status=status)
