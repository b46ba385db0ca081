"""``POST /v1/conversations/{id}/attachments``: upload a file to send with a later turn.

The body is ``multipart/form-data`` with the file in the field ``file`` (one file per request).
Answers 201 with :func:`attachment_json`; the turn then names it:
``POST /v1/conversations/{id}/turns {"role": "user", "content": ..., "attachments": [id]}``.
Errors in the ``/v1`` shape: 400 (no file, empty, no text, corrupt or locked PDF), 403 (a
zero-retention organisation), 404 (not your conversation), 409 (the conversation's file limit),
413 (too large), 415 (not multipart, or not text / PDF by content).
"""

from __future__ import annotations

from uuid import UUID

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError

from core.errors import ApiError
from core.http import api_view
from attachments import services
from attachments.models import Attachment
from conversations import selectors as conversation_selectors
from conversations.models import Conversation

FIELD = "file"


def attachment_json(attachment: Attachment) -> dict:
    """An attachment in the ``/v1`` shape: ``attachment_id``, ``name``, ``content_type``
    (``text/plain`` or ``application/pdf``, by content), ``size`` (bytes), ``tokens`` (of its
    text that go into the prompt), ``total_tokens`` (the whole extracted text; estimated from
    its start for very long texts: ``total_tokens_estimated``), ``truncated`` (``tokens <
    total_tokens``: the prompt gets "[file truncated: first N of M tokens]")."""
    return {
        "attachment_id": str(attachment.attachment_id),
        "name": attachment.name,
        "content_type": attachment.content_type,
        "size": attachment.size,
        "tokens": attachment.prompt_tokens,
        "total_tokens": attachment.tokens,
        "total_tokens_estimated": attachment.tokens_estimated,
        "truncated": attachment.truncated,
    }


def _upload(request: HttpRequest, conversation: Conversation) -> Attachment:
    """Parse the multipart body, check and store its one file. Raises ApiError 400 / 413 / 415
    for the body, AttachmentRejected for the file."""
    if request.content_type != "multipart/form-data":
        raise ApiError(
            415, "unsupported_media_type",
            f"Send the file as multipart/form-data, in the field '{FIELD}'.",
        )  # fmt: skip
    try:
        files = request.FILES.getlist(FIELD)
    except RequestDataTooBig:
        raise ApiError(413, "payload_too_large", "The request's form fields are too large.") from None
    except (MultiPartParserError, SuspiciousOperation) as exc:
        raise ApiError(400, "invalid_request", f"The multipart body could not be read: {exc}") from None
    if len(files) != 1:
        raise ApiError(
            400, "invalid_request",
            f"Send exactly one file, in the multipart field '{FIELD}' (this request has {len(files)}).",
        )  # fmt: skip
    (extracted,) = services.uploads_read(files=files)
    return services.attachment_create(conversation=conversation, upload=extracted)


@api_view("POST")
async def attachments(request: HttpRequest, conversation_id: UUID) -> HttpResponse:
    """Upload one file into the caller's conversation -> 201 :func:`attachment_json` (module
    docstring for the errors)."""
    conversation = await conversation_selectors.aconversation_get_for_user(
        conversation_id=conversation_id, user=request.api_user
    )
    attachment = await sync_to_async(_upload)(request, conversation)
    return JsonResponse(attachment_json(attachment), status=201)
