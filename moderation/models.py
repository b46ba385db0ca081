"""Verdicts are stored on the turns they judged (``Turn.moderation_verdict``,
moderation/verdicts.py ``Verdict.as_json``); the proxy ``ModeratedTurn`` is how the admin lists
them (moderation/admin.py). ``WithdrawnAnswer`` keeps the text of an answer the output gate
withdrew, for review (issue 28)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from conversations.models import Turn


class ModeratedTurn(Turn):
    """A turn with a moderation verdict (flagged or clean): the admin's list of verdicts.

    A proxy (no table): its rows are turns, in their conversation's region database. The app
    label is ``moderation``, which is not in ``settings.CHAT_REGIONAL_APPS``, so every query of
    it names its database explicitly (``conversations.regional_admin.RegionalAdmin``) and loads the
    conversation in the same query (``select_related``)."""

    class Meta:
        proxy = True
        verbose_name = "moderated turn"
        verbose_name_plural = "moderated turns"


class WithdrawnAnswer(models.Model):
    """An answer the output gate withdrew, kept for review (issue 28): its text as streamed
    until it was stopped, the window that fired, and the verdict. Reviewed by the owner's
    organisation's owners and admins (``/orgs/<slug>/moderation/review/``), or by the site's
    admins for a user without an organisation (the Django admin). "This was fine" records a
    labelled false positive (``fine``, who, when).

    Lives with its conversation, in that conversation's region's database
    (``settings.CHAT_REGIONAL_MODELS``), and goes with it: a deletion or the retention purge of
    the conversation (the organisation's retention) deletes it (cascade). Never written for a
    zero-retention conversation (moderation/services.py)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(
        "conversations.Conversation", on_delete=models.CASCADE, related_name="withdrawn_answers"
    )
    turn_id = models.UUIDField(unique=True)
    # Users and organisations live in the global database: no constraint across databases.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.DO_NOTHING,
                              db_constraint=False, related_name="+")
    org = models.ForeignKey("accounts.Organisation", null=True, blank=True,
                            on_delete=models.DO_NOTHING, db_constraint=False, related_name="+")
    text = models.TextField(blank=True)
    window = models.TextField(blank=True)
    verdict = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)
    fine = models.BooleanField(default=False)
    reviewed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.DO_NOTHING, db_constraint=False,
                                    related_name="+")
    reviewed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)
        indexes = [models.Index(fields=["org", "created_at"], name="withdrawn_org_created")]

    def __str__(self) -> str:
        return f"withdrawn answer {self.turn_id} ({', '.join(self.categories) or '-'})"

    @property
    def categories(self) -> list[str]:
        """The categories that withdrew it (from the verdict)."""
        return list((self.verdict or {}).get("categories") or [])
