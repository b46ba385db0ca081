"""Share links: a read-only snapshot of a conversation under an unguessable URL (issue 8)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from conversations.models import Conversation


class ShareLink(models.Model):
    """A public, read-only view of a conversation as it was at one moment.

    **Where it lives.** In the conversation's region database (``sharing`` is one of
    ``settings.CHAT_REGIONAL_APPS``), beside the turns it shows. An anonymous viewer has only the
    token, so the token names its region: three hex digits of the region's 12-bit tag (the
    same tag conversation ids carry, ``core.regions.region_tag``) followed by 192
    random bits (``secrets.token_urlsafe(24)``): the page goes straight to one database, with no
    global directory of links and no search through every region (sharing/tokens.py).

    **The snapshot is a boundary, not a copy.** ``through_at`` / ``through_turn_id`` are the
    ``(created_at, turn_id)`` of the newest turn the snapshot includes; the shared page shows the
    conversation's turns up to there. This is exact because the turn log is append-only
    (conversations/versions.py): turns are never updated, and an edit or a regeneration is a
    *new* turn written after the boundary, so the page keeps showing the versions that were
    current when the link was made (or last updated) and nothing said later. Not copying the
    text means the shared page can never outlive the conversation: deleting it (or its purge by
    retention) removes the turns the link points into, and the link with them (CASCADE). Only
    the title is copied (``title``), because a rename is an update in place, not an append.

    **Revocation.** ``revoked_at`` set: the link answers 404 for good (the row stays for the
    record; a token is never reused). The page also answers 404 whenever ``created_by`` can no
    longer read the conversation (sharing/selectors.py), e.g. after leaving its organisation.
    """

    # A UUID, not a sequence: links live in several region databases, and an id must name one
    # row wherever it is looked up (the owner's URLs also name the conversation; the admin
    # looks in every region).
    link_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # "<3 hex region tag><32 url-safe characters>" (sharing/tokens.py); unique: the page's key.
    token = models.CharField(max_length=64, unique=True, editable=False)
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="share_links"
    )
    # Accounts live in the global (default) database: no constraint across databases.
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        db_constraint=False,
        related_name="share_links",
    )
    # The conversation's title when the snapshot was taken (shown on the shared page).
    title = models.CharField(max_length=200, blank=True)
    # The snapshot's boundary: (created_at, turn_id) of the newest turn it includes.
    through_at = models.DateTimeField()
    through_turn_id = models.UUIDField()
    created_at = models.DateTimeField(default=timezone.now)
    # When the snapshot was last moved forward ("Update"); created_at until then.
    updated_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # A conversation's links (its share page), newest first.
            models.Index(fields=["conversation", "-created_at"], name="sharelink_conv_recent"),
            # A user's links across their conversations (the shared-links settings page).
            models.Index(fields=["created_by", "-created_at"], name="sharelink_creator_recent"),
        ]

    def __str__(self) -> str:
        return f"share link {self.token[:7]}… of {self.conversation_id}"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
