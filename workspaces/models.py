"""Invitations into an organisation's workspace (issue 8).

Memberships, roles and the organisation's policies live on accounts.Organisation and
accounts.Membership; this app adds the invitation that turns into a membership.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from accounts.models import Membership, Organisation


class Invitation(models.Model):
    """An invitation to join ``organisation`` with ``role``: by link (no ``email``) or sent to
    an email address. Single use: accepted once, then spent.

    The secret is 256 random bits, shown once (in the link the inviter copies, or in the email)
    and stored only as its SHA-256 (``token_hash``), like API keys (accounts.models.ApiKey): a
    leaked database holds no working invitation. An invitation is usable while it is neither
    accepted, revoked nor past ``expires_at`` (workspaces/invitations.py ``invitation_accept``).
    """

    organisation = models.ForeignKey(
        Organisation, on_delete=models.CASCADE, related_name="invitations"
    )
    # Blank: a link invitation (anyone signed in who holds the link may accept it once).
    email = models.EmailField(blank=True)
    role = models.CharField(
        max_length=16, choices=Membership.Role.choices, default=Membership.Role.MEMBER
    )
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        on_delete=models.SET_NULL,
        related_name="invitations_sent",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="invitations_accepted",
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at",)
        indexes = [
            models.Index(fields=["organisation", "-created_at"], name="invitation_org_recent"),
        ]

    def __str__(self) -> str:
        to = self.email or "link"
        return f"invitation to {self.organisation} ({to}, {self.role})"

    @property
    def kind(self) -> str:
        """``"email"`` or ``"link"``."""
        return "email" if self.email else "link"
