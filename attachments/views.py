"""The permission-checked download of an attached file (never a public media URL)."""

from __future__ import annotations

import logging
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET

from attachments import selectors
from attachments.services import attachment_storage

logger = logging.getLogger(__name__)


@require_GET
@login_required
def attachment_download(request: HttpRequest, conversation_id: UUID, attachment_id: UUID) -> HttpResponse:
    """The file as uploaded, to whoever may see its conversation (404 for anyone else, and for
    ids that do not exist; signed-out visitors go to sign in).

    Never run as a page: ``Content-Disposition: attachment``, ``X-Content-Type-Options:
    nosniff``, a content type decided from the content at upload (``text/plain; charset=utf-8``
    or ``application/pdf`` only), and a CSP that allows nothing, should a browser render it
    anyway."""
    attachment = selectors.attachment_get_for_user(
        conversation_id=conversation_id, attachment_id=attachment_id, user=request.user
    )
    try:
        # Read whole (at most CHAT_ATTACHMENT_MAX_BYTES): a streamed file response would be
        # read whole anyway under ASGI (a synchronous iterator), with a warning each time.
        storage = attachment_storage(conversation_id=attachment.conversation_id)
        with storage.open(attachment.storage_name, "rb") as handle:
            data = handle.read()
    except OSError:  # FileNotFoundError included
        logger.error("attachment %s: file %s missing from storage", attachment.pk, attachment.storage_name)
        raise Http404("This file is no longer stored.") from None
    content_type = attachment.content_type
    if content_type.startswith("text/"):
        content_type += "; charset=utf-8"
    response = HttpResponse(data, content_type=content_type)
    response["Content-Disposition"] = content_disposition_header(True, attachment.name)
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = "private, no-store"
    return response
