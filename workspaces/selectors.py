"""Reads for workspaces, permission-checked: an organisation as one of its members sees it,
who may do what there, its members and invitations, its shared conversations, and the
not-for-training policy as a turn is written.

Who may do what (the one table the views and tests follow)::

    action                                   owner     admin       member
    overview, members list, shared chats     yes       yes         yes
    invite, withdraw an invitation           yes       yes (1)     no
    remove a member                          yes (2)   yes (1)     no
    change a member's role                   yes (2)   no          no
    change the organisation's policies       yes       no          no
    leave                                    yes (2)   yes         yes

    (1) admins invite as member only, and remove plain members only.
    (2) never the last owner: an organisation always keeps one.

Anyone else (another organisation's member, a removed member) gets 404 for every workspace URL,
whether or not the organisation exists; a member lacking the role gets 403 with the reason.
Every check reads the membership afresh (no cache), so a change applies to the next request.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.utils import timezone

from accounts.models import Membership, Organisation, User
from conversations.models import Conversation
from core import regions
from workspaces.models import Invitation

NOT_FOUND = "No such organisation."
Role = Membership.Role


@dataclass(frozen=True)
class Seat:
    """A signed-in user's place in an organisation: the organisation and their membership."""

    org: Organisation
    membership: Membership

    @property
    def role(self) -> str:
        return self.membership.role

    @property
    def is_owner(self) -> bool:
        return self.role == Role.OWNER

    @property
    def can_manage_members(self) -> bool:
        """Owners and admins invite people and remove members."""
        return self.role in (Role.OWNER, Role.ADMIN)

    @property
    def can_manage_policies(self) -> bool:
        """Only owners change roles and the organisation's policies."""
        return self.is_owner

    def invitable_roles(self) -> list[tuple[str, str]]:
        """The roles this person may invite as: owners any but owner (make someone an owner
        once they have joined), admins member only."""
        if self.is_owner:
            return [(Role.MEMBER, Role.MEMBER.label), (Role.ADMIN, Role.ADMIN.label)]
        if self.role == Role.ADMIN:
            return [(Role.MEMBER, Role.MEMBER.label)]
        return []

    def can_remove(self, membership: Membership) -> bool:
        """Whether this person may remove ``membership`` (someone else's) from the
        organisation: owners anyone, admins plain members (the last owner is checked by
        services.member_remove)."""
        if membership.user_id == self.membership.user_id:
            return False  # leaving is its own action
        if self.is_owner:
            return True
        return self.role == Role.ADMIN and membership.role == Role.MEMBER


def seat_get(*, slug: str, user: User) -> Seat:
    """``user``'s seat in organisation ``slug``. Raises Http404 when the organisation is
    missing *or* ``user`` is not a member of it now (anonymous, another organisation's member,
    removed): its existence is not revealed."""
    if not getattr(user, "is_authenticated", False):
        raise Http404(NOT_FOUND)
    membership = (
        Membership.objects.select_related("organisation")
        .filter(organisation__slug=slug, user_id=user.pk)
        .first()
    )
    if membership is None:
        raise Http404(NOT_FOUND)
    return Seat(org=membership.organisation, membership=membership)


def seat_get_managing_members(*, slug: str, user: User) -> Seat:
    """:func:`seat_get`, for an owner or admin. Raises Http404 for non-members and
    PermissionDenied (403, with the reason) for a plain member."""
    seat = seat_get(slug=slug, user=user)
    if not seat.can_manage_members:
        raise PermissionDenied("Only this organisation's owners and admins manage its members.")
    return seat


def seat_get_owning(*, slug: str, user: User) -> Seat:
    """:func:`seat_get`, for an owner. Raises Http404 for non-members and PermissionDenied
    (403, with the reason) for admins and members."""
    seat = seat_get(slug=slug, user=user)
    if not seat.is_owner:
        raise PermissionDenied(
            "Only this organisation's owners change its roles and policies; ask one of them."
        )
    return seat


def seats_of(*, user: User) -> list[Seat]:
    """The organisations ``user`` belongs to, with their role, by organisation name."""
    memberships = (
        Membership.objects.select_related("organisation")
        .filter(user_id=user.pk)
        .order_by("organisation__name", "organisation_id")
    )
    return [Seat(org=m.organisation, membership=m) for m in memberships]


def member_list(*, org: Organisation) -> list[Membership]:
    """The organisation's memberships with their users: owners, then admins, then members,
    each by username."""
    order = {Role.OWNER: 0, Role.ADMIN: 1, Role.MEMBER: 2}
    memberships = list(Membership.objects.select_related("user").filter(organisation=org))
    memberships.sort(key=lambda m: (order.get(m.role, 3), m.user.username.casefold()))
    return memberships


def membership_get(*, org: Organisation, user_id: int) -> Membership:
    """The membership of user ``user_id`` in ``org``. Raises Http404 if they are not a member."""
    membership = (
        Membership.objects.select_related("user").filter(organisation=org, user_id=user_id).first()
    )
    if membership is None:
        raise Http404("That person is not a member of this organisation.")
    return membership


def invitation_list_pending(*, org: Organisation) -> list[Invitation]:
    """The organisation's invitations that can still be accepted (not accepted, revoked or
    expired), newest first."""
    return list(
        Invitation.objects.select_related("created_by")
        .filter(
            organisation=org,
            accepted_at__isnull=True,
            revoked_at__isnull=True,
            expires_at__gt=timezone.now(),
        )
        .order_by("-created_at", "-pk")
    )


def invitation_get_for_org(*, org: Organisation, invitation_id: int) -> Invitation:
    """One invitation of ``org``. Raises Http404 if ``org`` has none with that id."""
    invitation = Invitation.objects.filter(organisation=org, pk=invitation_id).first()
    if invitation is None:
        raise Http404("No such invitation in this organisation.")
    return invitation


# Most shared conversations the workspace page lists.
SHARED_LIST_LIMIT = 200


def shared_conversation_list(
    *, org: Organisation, limit: int = SHARED_LIST_LIMIT
) -> list[Conversation]:
    """The conversations shared with ``org``'s workspace whose owner is still a member, most
    recently active first, at most ``limit``; from every region's database (an organisation's
    conversations are in its region, but its region may have changed since older ones were
    written), through the partial index ``conv_org_shared_recent``. The caller has checked that
    the reader is a member (:func:`seat_get`). Each conversation's ``owner_name`` attribute is
    its owner's username (accounts live in the global database: one query for all)."""
    members = dict(
        Membership.objects.filter(organisation=org).values_list("user_id", "user__username")
    )
    if not members:
        return []
    rows = regions.merged(
        [
            objects.filter(
                org_id=org.pk, shared_with_org=True, owner_id__in=list(members)
            ).order_by("-last_turn_at", "-created_at")[:limit]
            for objects in (regions.manager(Conversation, db) for db in regions.region_dbs())
        ],
        key=lambda c: (c.last_turn_at, c.created_at),
        reverse=True,
    )
    conversations = list(rows)[:limit]
    for conversation in conversations:
        conversation.owner_name = members.get(conversation.owner_id, "")
    return conversations


def own_unshared_list(
    *, org: Organisation, user: User, limit: int = SHARED_LIST_LIMIT
) -> list[Conversation]:
    """``user``'s conversations in ``org``'s workspace that are not shared with it, most
    recently active first (the workspace page offers to share them)."""
    rows = regions.merged(
        [
            objects.filter(org_id=org.pk, owner_id=user.pk, shared_with_org=False).order_by(
                "-last_turn_at", "-created_at"
            )[:limit]
            for objects in regions.managers(Conversation, user=user)
        ],
        key=lambda c: (c.last_turn_at, c.created_at),
        reverse=True,
    )
    return list(rows)[:limit]

