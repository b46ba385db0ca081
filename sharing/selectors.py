"""Every read of share links, permission-checked.

Two kinds of reader:

- the conversation's owner, managing its links: :func:`share_link_list`,
  :func:`share_link_get_for_owner` (the view has already fetched the conversation through
  ``conversations.selectors.conversation_get_for_user``), :func:`share_link_list_for_user`;
- anyone holding a token, signed in or not: :func:`snapshot_get`. It raises Http404 alike for a
  token that is malformed, unknown, revoked, whose conversation is gone, or whose creator can no
  longer read the conversation (:func:`creator_can_read`), so a token never reveals more than
  "this works" or "this does not".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

from django.db.models import QuerySet
from django.http import Http404

from accounts.models import Membership, User
from conversations import selectors as conversation_selectors
from conversations.models import Conversation, Turn
from conversations.selectors import ToolUse, conversation_zero_retention
from core import regions
from sharing import tokens
from sharing.models import ShareLink

NOT_FOUND = "This shared link does not exist or is no longer shared."


@dataclass(frozen=True)
class SharedExchange:
    """One place of a shared conversation: the message as it read at snapshot time and the
    answer shown to it then (None: none had been written yet)."""

    question: Turn
    answer: Turn | None
    tool_uses: tuple[ToolUse, ...] = ()  # the tool rounds the answer was written after


@dataclass(frozen=True)
class Snapshot:
    """What a share link shows: its title and exchanges, oldest first."""

    link: ShareLink
    title: str
    exchanges: list[SharedExchange]


def _turn_key(turn: Turn) -> tuple:
    return (turn.created_at, str(turn.turn_id))  # the turn log's order (selectors.turn_order)


def snapshot_exchanges(
    turns: Iterable[Turn], *, through_at, through_turn_id: UUID
) -> list[SharedExchange]:
    """The exchanges of a snapshot whose newest turn is ``(through_at, through_turn_id)``.

    Pure: ``turns`` is the conversation's log (any order, later turns included). Only turns at
    or before the boundary count, grouped into positions (conversations/versions.py), so each
    position shows the message version and the newest answer that existed at the boundary;
    edits and regenerations made later are not seen. Positions whose message the input gate
    blocked are left out (it never reached the model and its text was flagged). An answer
    written after tool calls carries them (``tool_uses``), as on the chat page.
    """
    boundary = (through_at, str(through_turn_id))
    included = [t for t in turns if _turn_key(t) <= boundary]
    by_id = {t.turn_id: t for t in included}
    results = conversation_selectors.results_by_call_turn(included)
    return [
        SharedExchange(
            question=p.question, answer=p.answer,
            tool_uses=(
                tuple(conversation_selectors.tool_uses(p.answer, by_id, results))
                if p.answer is not None
                else ()
            ),
        )  # fmt: skip
        for p in conversation_selectors.positions_build(included)
        if p.question.status != Turn.Status.BLOCKED
    ]


def newest_turn(*, conversation: Conversation) -> Turn | None:
    """The newest turn of the conversation (stored, or held in Redis awaiting write-back), the
    boundary a snapshot taken now would have; None when it has no turns."""
    turns = conversation_selectors.turn_list(conversation=conversation)
    return max(turns, key=_turn_key) if turns else None


def creator_can_read(*, conversation: Conversation, creator_id: int) -> bool:
    """Whether the user ``creator_id`` can still read ``conversation`` now.

    The rule is the conversations app's read access (``conversations.selectors.
    conversation_view_for_user``: whatever it allows that user, their link may show), so when
    access rules change there, links follow without a change here. On top of it, for a
    conversation of an organisation the creator must still be a member of that organisation:
    removing someone from an organisation takes away their links to its conversations at that
    moment (issue 8), also where the read rule still lets an owner read their own conversation.
    A deactivated account's links stop too. Every call reads afresh (no cache).
    """
    creator = User.objects.filter(pk=creator_id, is_active=True).first()
    if creator is None:
        return False
    try:
        conversation_selectors.conversation_view_for_user(
            conversation_id=conversation.conversation_id, user=creator
        )
    except Http404:
        return False
    if conversation.org_id is not None:
        return Membership.objects.filter(
            user_id=creator_id, organisation_id=conversation.org_id
        ).exists()
    return True


def snapshot_get(*, token: str) -> Snapshot:
    """The snapshot a share token shows. Raises Http404 (one message for every case) when the
    token is malformed or unknown, the link is revoked, its conversation deleted, its creator
    can no longer read the conversation (:func:`creator_can_read`), or the conversation's
    organisation has since switched to zero retention (it publishes nothing).

    The link and its conversation are read from the region's primary (the token names the
    region: sharing/tokens.py), so a revocation or deletion is seen by the very next request
    even with lagging replicas.
    """
    db = tokens.db_for_token(token)
    if db is None:
        raise Http404(NOT_FOUND)
    link = (
        ShareLink.objects.using(db)
        .select_related("conversation")
        .filter(token=token, revoked_at__isnull=True)
        .first()
    )
    if link is None:
        raise Http404(NOT_FOUND)
    conversation = link.conversation
    if not creator_can_read(conversation=conversation, creator_id=link.created_by_id):
        raise Http404(NOT_FOUND)
    if conversation_zero_retention(conversation):
        raise Http404(NOT_FOUND)
    turns = conversation_selectors.turn_list(conversation=conversation)
    exchanges = snapshot_exchanges(
        turns, through_at=link.through_at, through_turn_id=link.through_turn_id
    )
    return Snapshot(link=link, title=link.title, exchanges=exchanges)


@regions.routed
def share_link_list(*, conversation: Conversation) -> QuerySet[ShareLink]:
    """The conversation's links that still work (not revoked), newest first. For its owner's
    share page: the caller has checked that the conversation is theirs."""
    return conversation.share_links.filter(revoked_at__isnull=True).order_by("-created_at", "-pk")


@regions.routed
def share_link_get_for_owner(*, conversation: Conversation, link_id: UUID) -> ShareLink:
    """One not-revoked link of ``conversation`` (already checked to be the caller's). Raises
    Http404 if there is none with that id (another conversation's, revoked, or missing)."""
    link = conversation.share_links.filter(pk=link_id, revoked_at__isnull=True).first()
    if link is None:
        raise Http404("No such share link for this conversation.")
    return link


def share_link_list_for_user(*, user: User) -> list[ShareLink]:
    """Every working link ``user`` created, newest first, from every region's database, each
    with its conversation loaded (``link.conversation``). Links to an organisation's
    conversations are left out once the user is no longer a member (they answer 404 anyway)."""
    memberships = Membership.objects.filter(user_id=user.pk)
    member_of = set(memberships.values_list("organisation_id", flat=True))
    links = regions.merged(
        [
            objects.filter(created_by_id=user.pk, revoked_at__isnull=True)
            .select_related("conversation")
            .order_by("-created_at", "-pk")
            for objects in regions.managers(ShareLink, user=user)
        ],
        key=lambda link: (link.created_at, link.pk),
        reverse=True,
    )
    return [
        link for link in links
        if link.conversation.org_id is None or link.conversation.org_id in member_of
    ]  # fmt: skip
