"""The per-conversation marker that makes memory extraction exactly-once (memory/extraction.py).

Kept apart from memory/models.py so that module stays the store's; memory/models.py imports
:class:`ExtractionMarker` from here so Django (and ``makemigrations``) sees it. The row lives in
its conversation's database (the ``memory`` app is regional, ``settings.CHAT_REGIONAL_APPS``), with
no foreign key to the conversation (a marker outlives a purged conversation harmlessly) nor a
database constraint to the user (users live in ``default``).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class ExtractionMarker(models.Model):
    """How far a conversation's turns have been mined for memory facts.

    ``extracted_through``: the conversation's ``last_turn_at`` the last stored extraction covered
    (None: never). ``claimed_until``: a run holds the conversation until then (None: free), so a
    redelivered copy of the task does not ask the model again meanwhile. ``queued_at``: when
    the sweep last queued it (it queues again only after ``CHAT_MEMORY_REQUEUE_AFTER_S``).
    """

    conversation_id = models.UUIDField(primary_key=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="memory_extraction_markers",
        db_constraint=False,  # the marker lives in its conversation's database, users in default
    )
    extracted_through = models.DateTimeField(null=True, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "memory"

    def __str__(self) -> str:
        return f"memory extraction of {self.conversation_id} through {self.extracted_through}"
