"""``GET /v1/users/{id}/export``: your data archive over the API (issue 10), the same .zip as
the "Download my data" button (privacy/export.py). Another user's id is a 404, never a 403
(existence is not revealed), as for ``/v1/users/{id}/memory``."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import Http404, HttpRequest, HttpResponse

from core.http import api_view
from audit.models import Action
from audit.services import audit_record
from privacy import export
from privacy.views import archive_response


def _build(user) -> export.Export:
    archive = export.user_export_build(user=user)
    audit_record(
        actor=user, action=Action.ACCOUNT_EXPORT, target_type="accounts.user", target_id=user.pk,
        details={"bytes": archive.size, "via": "api"},
    )  # fmt: skip
    return archive


@api_view("GET")
async def user_export(request: HttpRequest, user_id: int) -> HttpResponse:
    """200 ``application/zip`` (``data.json``, one Markdown file per conversation, the
    attachments), streamed; 404 when ``user_id`` is not the caller's."""
    user = request.api_user
    if user_id != user.pk:
        raise Http404("No such user.")
    return archive_response(await sync_to_async(_build)(user))
