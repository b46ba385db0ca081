"""What region routing (core/regions.py) needs to know about this app's models and the
organisation memberships: the :class:`~core.regions.RegionLocator` registered in
conversations/apps.py ``ready()``. core/ imports no app, so the lookups that name a model are
here."""

from __future__ import annotations

from uuid import UUID

from django.core.exceptions import ValidationError

from accounts.models import Membership, Organisation, User
from conversations.models import Conversation


class ConversationRegionLocator:
    """Answers core/regions.py's questions with the conversations and accounts models."""

    def is_conversation(self, value: object) -> bool:
        """Whether ``value`` is a :class:`Conversation` (not a turn or a row beside one)."""
        return isinstance(value, Conversation)

    def conversation_exists(self, conversation_id: UUID, *, db: str) -> bool:
        """Whether the primary alias ``db`` holds conversation ``conversation_id`` (one
        ``EXISTS`` query there)."""
        return Conversation.objects.using(db).filter(pk=conversation_id).exists()

    def home_organisation(
        self, *, owner: User, org: Organisation | None = None
    ) -> Organisation | None:
        """The organisation a new conversation of ``owner`` belongs to: ``org`` when given,
        else the owner's first organisation (oldest membership), else None (data residency is
        the organisation's policy, so its region wins over the owner's). Raises
        ValidationError (code ``not_member``) if ``owner`` is not a member of ``org``."""
        if org is None:
            membership = (
                Membership.objects.filter(user=owner).select_related("organisation")
                .order_by("joined_at", "pk").first()
            )  # fmt: skip
            return membership.organisation if membership else None
        if not Membership.objects.filter(user=owner, organisation=org).exists():
            raise ValidationError("You are not a member of that organisation.", code="not_member")
        return org
