"""Every write of attachments: store uploads, link them to the message they were sent with,
discard them, and delete their files with their conversation.

Rows live in the conversation's region database (``regions.atomic`` pins each service to it);
files in Django storage (:func:`attachment_storage`). A file is written before its row and
removed again if the row cannot be; files of deleted rows are removed only once the deletion is
committed (``transaction.on_commit``), so a rolled-back deletion never loses a file.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.db import transaction

from attachments import prompt
from attachments.files import AttachmentRejected, Extracted, upload_read
from attachments.models import Attachment
from conversations.models import Conversation, Turn
from conversations.selectors import conversation_zero_retention
from core import regions

logger = logging.getLogger(__name__)

def attachment_storage(*, conversation_id: UUID | str | None = None) -> Storage:
    """The storage holding the attachment files of conversation ``conversation_id``:
    ``settings.CHAT_ATTACHMENT_STORAGE`` (a STORAGES entry: ``{"BACKEND", "OPTIONS"}``; by
    default FileSystemStorage under ``MEDIA_ROOT/attachments``), with its ``location`` set to
    the region's root when the region the conversation id names has one in
    ``settings.CHAT_REGION_ATTACHMENT_ROOTS`` (issue 20, "Region-scoped stores": a region's
    files stay on its own disk). Without an id, or for a region without a root of its own: the
    configured location. Built per call, so a settings change takes effect."""
    entry = settings.CHAT_ATTACHMENT_STORAGE
    region = regions.region_of_id(conversation_id) if conversation_id is not None else None
    root = getattr(settings, "CHAT_REGION_ATTACHMENT_ROOTS", {}).get(region) if region else None
    if root:
        entry = {**entry, "OPTIONS": {**entry.get("OPTIONS", {}), "location": root}}
    return storages.create_storage(entry)


def _storage_of(name: str) -> Storage:
    """The storage holding the file stored as ``name`` (``<conversation id>/<attachment id>``:
    the conversation id says its region)."""
    return attachment_storage(conversation_id=name.split("/", 1)[0])


def _encode_text():
    """The serving model's tokenizer (text -> token ids), for counting uploads' tokens. The
    default pools share this model; a prompt for a pool with another model is re-fitted with
    that pool's tokenizer (attachments/prompt.py)."""
    from inference.engine import get_engine  # noqa: PLC0415 - the engine layer loads lazily

    return get_engine().encode_text


def uploads_read(*, files: Sequence) -> list[Extracted]:
    """Check and extract uploaded files (Django ``UploadedFile``s; attachments/files.py) before
    anything is stored. Raises AttachmentRejected (400 for more than
    ``settings.CHAT_ATTACHMENT_MAX_FILES`` files, and see ``files.file_read``)."""
    limit = settings.CHAT_ATTACHMENT_MAX_FILES
    if len(files) > limit:
        raise AttachmentRejected(
            400, "too_many_files",
            f"You attached {len(files)} files; one message can carry at most {limit}.",
        )  # fmt: skip
    if not files:
        return []
    encode_text = _encode_text()
    return [upload_read(upload, encode_text=encode_text) for upload in files]


def _check_attachable(conversation: Conversation, adding: int) -> None:
    """Raise AttachmentRejected unless ``adding`` more files may be stored in ``conversation``:
    403 in a zero-retention organisation's conversation (nothing of it may be kept), 409 past
    ``settings.CHAT_ATTACHMENT_MAX_PER_CONVERSATION`` files."""
    if conversation_zero_retention(conversation):
        raise AttachmentRejected(
            403, "attachments_not_allowed",
            "Your organisation keeps no conversation data, so files cannot be attached here. "
            "Paste the text you need into your message instead.",
        )  # fmt: skip
    limit = settings.CHAT_ATTACHMENT_MAX_PER_CONVERSATION
    stored = Attachment.objects.filter(conversation=conversation).count()
    if stored + adding > limit:
        raise AttachmentRejected(
            409, "too_many_attachments",
            f"This conversation already has {stored} files; it can hold at most {limit}. Start a "
            "new conversation to attach more.",
        )  # fmt: skip


@transaction.atomic
@regions.atomic
def attachments_create(*, conversation: Conversation, uploads: Sequence[Extracted]) -> list[Attachment]:
    """Store checked files (:func:`uploads_read`) in ``conversation``, not yet sent with any
    message (``turn`` null). Files first, then rows, in one transaction; a failure removes
    the files written. Raises AttachmentRejected 403 / 409 (:func:`_check_attachable`)."""
    if not uploads:
        return []
    _check_attachable(conversation, len(uploads))
    storage = attachment_storage(conversation_id=conversation.pk)
    written: list[str] = []
    try:
        created = []
        for upload in uploads:
            attachment_id = uuid.uuid4()
            name = storage.save(f"{conversation.pk}/{attachment_id}", ContentFile(upload.data))
            written.append(name)
            created.append(
                Attachment.objects.create(
                    attachment_id=attachment_id, conversation=conversation, name=upload.name,
                    kind=upload.kind, size=len(upload.data), sha256=upload.sha256,
                    storage_name=name, text=upload.text, tokens=upload.tokens,
                    tokens_estimated=upload.tokens_estimated, prompt_tokens=upload.prompt_tokens,
                    pages=upload.pages,
                )  # fmt: skip
            )
        return created
    except BaseException:
        _delete_files(written)
        raise


def attachment_create(*, conversation: Conversation, upload: Extracted) -> Attachment:
    """:func:`attachments_create` for one file."""
    return attachments_create(conversation=conversation, uploads=[upload])[0]


@transaction.atomic
@regions.atomic
def attachments_discard(*, conversation: Conversation, attachments: Iterable[Attachment]) -> None:
    """Delete attachments (rows now, files once committed), e.g. files stored for a message
    that was then refused."""
    ids = [a.attachment_id for a in attachments]
    if ids:
        db = regions.conversation_db(conversation)
        attachment_files_forget(conversation_ids=[conversation.pk], attachment_ids=ids, using=db)
        Attachment.objects.filter(conversation=conversation, attachment_id__in=ids).delete()


@transaction.atomic
@regions.atomic
def attachments_link(
    *,
    conversation: Conversation,
    question: Turn,
    attachments: Iterable[Attachment] = (),
    fitted: dict[UUID, int] | None = None,
) -> None:
    """Link files to the user turn ``question`` they were sent with: ``attachments`` (sent with
    it), and the files of the message it edits (``question.replaces``: an edit keeps the files).
    ``fitted``: tokens of each file that went into the prompt (attachments/prompt.py), stored as
    its ``prompt_tokens`` so the page shows the cut."""
    fitted = fitted or {}
    ids = [a.attachment_id for a in attachments]
    if question.replaces_id is not None:
        ids += Attachment.objects.filter(
            conversation=conversation, turn_id=question.replaces_id
        ).values_list("attachment_id", flat=True)
    for attachment_id in ids:
        changes = {"turn_id": question.turn_id}
        if attachment_id in fitted:
            changes["prompt_tokens"] = fitted[attachment_id]
        Attachment.objects.filter(conversation=conversation, attachment_id=attachment_id).update(**changes)


def attachments_delete(*, queryset) -> int:
    """Delete the attachments of ``queryset`` (one database: its own), rows now and files once
    committed (the admin's delete actions). Returns how many rows."""
    db = queryset.db
    with transaction.atomic(using=db):
        rows = list(queryset.values_list("storage_name", flat=True))
        if rows:
            transaction.on_commit(lambda: _delete_files(rows), using=db)
        queryset.delete()
    return len(rows)


def attachment_files_forget(
    *, conversation_ids: Sequence[UUID], using: str, attachment_ids: Sequence[UUID] | None = None
) -> None:
    """Delete from storage, once the current transaction on database ``using`` commits, the files
    of the conversations ``conversation_ids`` (only ``attachment_ids`` among them, if given).
    Call it in the transaction that deletes the rows (conversation deletion and the retention
    purge call it just before deleting the conversations)."""
    if not conversation_ids:
        return
    query = Attachment.objects.using(using).filter(conversation_id__in=list(conversation_ids))
    if attachment_ids is not None:
        query = query.filter(attachment_id__in=list(attachment_ids))
    names = list(query.values_list("storage_name", flat=True))
    if names:
        transaction.on_commit(lambda: _delete_files(names), using=using)


def _delete_files(names: Iterable[str]) -> None:
    """Remove files from storage; a failure is logged (the row is gone: a leftover file is
    unreachable through the app) and the rest are still removed."""
    for name in names:
        try:
            _storage_of(name).delete(name)
        except Exception:  # noqa: BLE001 - one file's failure must not keep the others
            logger.exception("could not delete attachment file %s", name)


# --- sending files with a message -------------------------------------------------------------


@regions.routed
def _pending_get(*, conversation: Conversation, attachment_ids: Sequence[UUID]) -> list[Attachment]:
    """The conversation's unsent attachments ``attachment_ids``, in the given order. Raises
    AttachmentRejected 400 for too many or for one already sent with another message, 404 for
    one that is not in this conversation (or does not exist: the two are not told apart)."""
    ids = list(dict.fromkeys(attachment_ids))
    limit = settings.CHAT_ATTACHMENT_MAX_FILES
    if len(ids) > limit:
        raise AttachmentRejected(
            400, "too_many_files", f"A message can carry at most {limit} attachments; it names {len(ids)}."
        )
    rows = Attachment.objects.filter(conversation=conversation, attachment_id__in=ids)
    found = {a.attachment_id: a for a in rows}
    for attachment_id in ids:
        attachment = found.get(attachment_id)
        if attachment is None:
            raise AttachmentRejected(
                404, "attachment_not_found",
                f"No attachment {attachment_id} in this conversation. Upload the file with POST "
                f"/v1/conversations/{conversation.pk}/attachments and send the id it returns.",
            )  # fmt: skip
        if attachment.turn_id is not None:
            raise AttachmentRejected(
                400, "attachment_already_sent",
                f"Attachment {attachment_id} ({attachment.name}) was already sent with another "
                "message; upload the file again to send it again.",
            )  # fmt: skip
    return [found[i] for i in ids]


class TurnAttachments:
    """What :func:`turn_attachments` yields: the files going with the message."""

    def __init__(self, conversation: Conversation, sending: prompt.Sending):
        self.conversation = conversation
        self.sending = sending

    @property
    def attachments(self) -> list[Attachment]:
        return self.sending.attachments

    async def link(self, question: Turn) -> None:
        """Link the files to ``question``, the stored message they went with (and carry over
        those of the message it edits)."""
        if not self.attachments and question.replaces_id is None:
            return
        await sync_to_async(attachments_link)(
            conversation=self.conversation, question=question,
            attachments=self.attachments, fitted=dict(self.sending.fitted),
        )  # fmt: skip


@contextlib.asynccontextmanager
async def turn_attachments(
    *,
    conversation: Conversation,
    uploads: Sequence[Extracted] = (),
    attachment_ids: Sequence[UUID] = (),
) -> AsyncIterator[TurnAttachments]:
    """Send files with the message submitted in the block (``streaming.turn_submit``); call
    ``link(question)`` on what it yields once the message is stored.

    ``uploads``: files that came with the request (the chat page), stored now and deleted
    again if the block raises (the message was refused: nothing is left behind).
    ``attachment_ids``: files uploaded earlier (``/v1``), checked to be unsent files of this
    conversation; they stay for a retry if the block raises. The message's prompt gets their
    text (attachments/prompt.py, through :data:`prompt.sending`). A message the input gate
    blocked (its exception carries the stored ``question``) keeps its files.
    Raises AttachmentRejected (400 / 403 / 404 / 409) before the block runs.
    """
    pending, created = [], []
    if attachment_ids:
        pending = await sync_to_async(_pending_get)(conversation=conversation, attachment_ids=attachment_ids)
    if uploads:
        created = await sync_to_async(attachments_create)(conversation=conversation, uploads=uploads)
    state = TurnAttachments(conversation, prompt.Sending(attachments=[*pending, *created]))
    token = prompt.sending.set(state.sending)
    try:
        yield state
    except BaseException as exc:
        question = getattr(exc, "question", None)  # ContentBlocked: stored, with its verdict
        if isinstance(question, Turn):
            await state.link(question)
        elif created:
            await sync_to_async(attachments_discard)(conversation=conversation, attachments=created)
        raise
    finally:
        prompt.sending.reset(token)
