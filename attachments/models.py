"""Files attached to a user's message (issue 8): plain text, Markdown, source code, PDF."""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

from conversations.models import Conversation, Turn


class Attachment(models.Model):
    """One uploaded file and the text extracted from it.

    **Where it lives.** The row is in its conversation's region database (``attachments`` is one
    of ``settings.CHAT_REGIONAL_APPS``); the bytes are in Django storage
    (``settings.CHAT_ATTACHMENT_STORAGE``, by default a FileSystemStorage under
    ``MEDIA_ROOT/attachments``) under ``storage_name``, never at a public URL: only the
    permission-checked download view hands them out (attachments/views.py).

    **Life.** Uploaded through ``/v1`` first (``turn`` null: not sent yet), or together with the
    message in the chat page; then linked to the user turn it was sent with. An edit of that
    message takes its files along (attachments/services.py ``attachments_link``). Deleted with
    its conversation (rows by CASCADE, files once the deletion is committed).

    **Text.** ``text`` is what joins the prompt: the extracted text cut to at most
    ``settings.CHAT_ATTACHMENT_MAX_TOKENS`` tokens, with no truncation notice in it (the notice is
    added when the prompt is assembled, attachments/prompt.py). ``tokens``: the whole extracted
    text's length in tokens; ``prompt_tokens``: how many of them went into the prompt of the
    message it was sent with (fewer than ``tokens``: the file was cut).
    """

    class Kind(models.TextChoices):
        TEXT = "text", "Text"
        PDF = "pdf", "PDF"

    attachment_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="attachments"
    )
    # The user turn it was sent with; null while uploaded but not sent yet. The turn log is
    # partitioned (its database key is (turn_id, created_at)), so no database constraint.
    turn = models.ForeignKey(
        Turn,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    # The file's name as uploaded, cleaned (attachments/files.py clean_name): shown and used
    # for downloads only; the type is decided by the content, never by the name.
    name = models.CharField(max_length=255)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    size = models.PositiveBigIntegerField()  # bytes as uploaded
    sha256 = models.CharField(max_length=64)
    storage_name = models.CharField(max_length=255)
    text = models.TextField()
    tokens = models.PositiveIntegerField()
    # A very long text's ``tokens`` is estimated from its start (attachments/files.py
    # count_tokens): counting megabytes exactly would cost seconds of CPU per upload.
    tokens_estimated = models.BooleanField(default=False)
    prompt_tokens = models.PositiveIntegerField()
    # PDFs: pages in the document; None for text.
    pages = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["conversation", "turn"], name="attachment_conv_turn"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def content_type(self) -> str:
        """``text/plain`` or ``application/pdf``: the only types a download is ever sent as
        (decided by the content; never HTML, never what the uploader claimed)."""
        return "application/pdf" if self.kind == self.Kind.PDF else "text/plain"

    @property
    def truncated(self) -> bool:
        """Whether only part of the file's text went into the prompt."""
        return self.prompt_tokens < self.tokens
