"""Every write of share links: create, update (move the snapshot forward), revoke, revoke all of
a user's links to an organisation's conversations, and copy a snapshot into a viewer's account
("Continue this conversation"). Keyword-only, one transaction each."""

from __future__ import annotations

from datetime import timedelta

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from accounts.models import Organisation, User
from audit.models import Action
from audit.services import audit_record
from conversations import services as conversation_services
from conversations.models import Conversation, Turn
from conversations.selectors import conversation_zero_retention
from core import regions
from sharing import selectors, tokens
from sharing.models import ShareLink

# Working links one conversation may have at once (each is a separate URL to hand out and to
# revoke; more than this is a mistake or a script, and a clear error beats an endless list).
MAX_ACTIVE_LINKS_PER_CONVERSATION = 20

COPIED_TITLE = "Shared conversation"


def _shareable_boundary(conversation: Conversation) -> Turn:
    """The newest turn of ``conversation``, the boundary of a snapshot taken now. Raises
    ValidationError when it cannot be shared: a zero-retention organisation's (its turns must
    not outlive ``CHAT_ZDR_TTL_S`` in Redis, let alone be published), or one with no turns."""
    if conversation_zero_retention(conversation):
        raise ValidationError(
            "This conversation belongs to an organisation that keeps no conversation history, "
            "so it cannot be shared.",
            code="zero_retention",
        )
    newest = selectors.newest_turn(conversation=conversation)
    if newest is None:
        raise ValidationError("Nothing to share yet: send a message first.", code="empty")
    return newest


def _owner_check(conversation: Conversation, user: User) -> None:
    if conversation.owner_id != user.pk:
        raise PermissionDenied("Only the conversation's owner can share it.")


@transaction.atomic
@regions.atomic
def share_link_create(*, conversation: Conversation, user: User) -> ShareLink:
    """A new share link to ``conversation`` as it is now (up to its newest turn), made by its
    owner ``user``; stored in the conversation's region database with a fresh token naming
    that region (sharing/tokens.py).

    Raises PermissionDenied if ``user`` is not the owner (callers fetch the conversation with
    ``conversations.selectors.conversation_get_for_user`` first), ValidationError if it cannot be
    shared (:func:`_shareable_boundary`) or already has MAX_ACTIVE_LINKS_PER_CONVERSATION
    working links (code ``too_many``).
    """
    _owner_check(conversation, user)
    boundary = _shareable_boundary(conversation)
    # The conversation's row is the lock: two creations at once are counted one after the other.
    Conversation.objects.select_for_update().filter(pk=conversation.pk).first()
    active = ShareLink.objects.filter(conversation=conversation, revoked_at__isnull=True).count()
    if active >= MAX_ACTIVE_LINKS_PER_CONVERSATION:
        raise ValidationError(
            f"This conversation already has {MAX_ACTIVE_LINKS_PER_CONVERSATION} shared links; "
            "revoke one before making another.",
            code="too_many",
        )
    now = timezone.now()
    return ShareLink.objects.create(
        token=tokens.token_new(conversation.region),
        conversation=conversation,
        created_by=user,
        title=conversation.title,
        through_at=boundary.created_at,
        through_turn_id=boundary.turn_id,
        created_at=now,
        updated_at=now,
    )


@transaction.atomic
@regions.atomic
def share_link_update(*, conversation: Conversation, link: ShareLink, user: User) -> ShareLink:
    """Move ``link``'s snapshot forward to the conversation's newest turn and current title
    (same URL). Raises PermissionDenied unless ``user`` owns the conversation, ValidationError
    if the link is revoked (code ``revoked``) or the conversation can no longer be shared."""
    _owner_check(conversation, user)
    boundary = _shareable_boundary(conversation)
    locked = ShareLink.objects.select_for_update().get(pk=link.pk, conversation=conversation)
    if locked.revoked_at is not None:
        raise ValidationError("This link was revoked; make a new one instead.", code="revoked")
    locked.title = conversation.title
    locked.through_at = boundary.created_at
    locked.through_turn_id = boundary.turn_id
    locked.updated_at = timezone.now()
    locked.save(update_fields=["title", "through_at", "through_turn_id", "updated_at"])
    return locked


@transaction.atomic
@regions.atomic
def share_link_revoke(*, conversation: Conversation, link: ShareLink, user: User) -> None:
    """Revoke ``link`` at once (its page answers 404 from the next request on, for good).
    Revoking a revoked link changes nothing. Raises PermissionDenied unless ``user`` owns the
    conversation."""
    _owner_check(conversation, user)
    revoked = ShareLink.objects.filter(
        pk=link.pk, conversation=conversation, revoked_at__isnull=True
    ).update(revoked_at=timezone.now())
    if revoked:
        audit_record(
            actor=user, action=Action.SHARE_LINK_REVOKE, org=conversation.org_id,
            target_type="sharing.sharelink", target_id=link.pk,
            details={"conversation_id": conversation.pk}, region=conversation.region,
        )  # fmt: skip


def share_links_revoke_for(*, user: User | int, org: Organisation | int) -> int:
    """Revoke every working link that ``user`` made to a conversation of ``org`` (instances or
    primary keys), in every region's database; returns how many were revoked.

    For the workspaces app to call when a member is removed from an organisation (issue 8): the
    links stop at once and stay revoked if the person rejoins later. (Until it is called they
    already answer 404, because the shared page checks the creator's membership on every view:
    selectors.creator_can_read; this makes it permanent and visible on the links' lists.)
    Each region's update is its own transaction, so call it after the membership change is
    committed, e.g. from ``transaction.on_commit``.
    """
    user_id = getattr(user, "pk", user)
    org_id = getattr(org, "pk", org)
    now = timezone.now()
    revoked = 0
    for db in regions.region_dbs():
        with transaction.atomic(using=db):
            revoked += ShareLink.objects.using(db).filter(
                created_by_id=user_id, conversation__org_id=org_id, revoked_at__isnull=True
            ).update(revoked_at=now)
    return revoked


def _copied_pairs(snapshot: selectors.Snapshot) -> list[tuple[Turn, Turn]]:
    """(question, answer) of the snapshot's exchanges that can be continued from: answered,
    with text, not failed and not withdrawn by moderation (a cancelled answer keeps its partial
    text). An exchange without such an answer is left out: in the viewer's conversation an
    unanswered message would be answered anew (the chat page resumes unanswered messages)."""
    pairs = []
    for exchange in snapshot.exchanges:
        answer = exchange.answer
        if answer is None or not answer.content:
            continue
        if answer.status not in (Turn.Status.COMPLETE, Turn.Status.CANCELLED):
            continue
        pairs.append((exchange.question, answer))
    return pairs


@transaction.atomic
def share_continue(*, token: str, user: User) -> Conversation:
    """"Continue this conversation": copy the snapshot behind ``token`` into a new
    conversation of ``user`` (the viewer), returned; the shared conversation is not touched.

    The copy is created like any of the viewer's conversations (their home region,
    conversations.services.conversation_create), titled like the snapshot, with the snapshot's
    answered exchanges as new turns of the viewer's (fresh ids and times, in order; no usage or
    cost: the viewer paid for none of it). The original's system prompt and model are not
    copied (they are its owner's settings). The copied turns are marked as already mined for
    long-term memory, so what someone else said never becomes a fact about the viewer; only
    what the viewer writes next is.

    Raises Http404 like :func:`sharing.selectors.snapshot_get`; ValidationError when the viewer's
    conversations cannot hold it: their organisation keeps no history (code
    ``zero_retention``), or their home region has no database here.
    """
    snapshot = selectors.snapshot_get(token=token)
    region, org = regions.home_region(owner=user)
    if org is not None and org.zero_retention:
        raise ValidationError(
            "Your organisation keeps no conversation history, so a shared conversation cannot "
            "be copied into your account.",
            code="zero_retention",
        )
    db = regions.db_for_region(region)
    with transaction.atomic(using=db):  # the conversation and its turns: all or nothing
        copy = conversation_services.conversation_create(
            owner=user, title=snapshot.title or COPIED_TITLE, org=org
        )
        last = _turns_copy(conversation=copy, pairs=_copied_pairs(snapshot))
    if last is not None:
        from memory.models import ExtractionMarker  # noqa: PLC0415

        ExtractionMarker.objects.using(db).update_or_create(
            conversation_id=copy.pk, defaults={"user_id": user.pk, "extracted_through": last}
        )
    return copy


@regions.atomic
def _turns_copy(*, conversation: Conversation, pairs: list[tuple[Turn, Turn]]):
    """Append copies of ``pairs`` to ``conversation`` (new and empty), oldest first, one
    microsecond apart from now; returns the last copied turn's time (None: nothing copied)."""
    if not pairs:
        return None
    start = timezone.now()
    rows = []
    for index, (question, answer) in enumerate(pairs):
        asked = Turn(
            conversation=conversation, role=Turn.Role.USER, content=question.content,
            token_count=question.token_count, created_at=start + timedelta(microseconds=2 * index),
        )  # fmt: skip
        rows.append(asked)
        rows.append(
            Turn(
                conversation=conversation, role=Turn.Role.ASSISTANT, content=answer.content,
                status=answer.status, token_count=answer.token_count, reply_to=asked,
                created_at=start + timedelta(microseconds=2 * index + 1),
            )  # fmt: skip
        )
    Turn.objects.bulk_create(rows)
    last = rows[-1].created_at
    Conversation.objects.filter(pk=conversation.pk).update(last_turn_at=last)
    conversation.last_turn_at = last
    return last
