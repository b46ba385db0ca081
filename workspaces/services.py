"""Writes for workspaces: creating an organisation, invitations (by link or email), members
leaving, being removed or changing role, the organisation's policies, and sharing a
conversation with the workspace. Keyword-only; one transaction each.

Who may do what is decided by workspaces/selectors.py (:class:`~workspaces.selectors.Seat`);
the services re-check it and add the rules that need the current rows: an organisation always
keeps an owner (checked under a lock on the organisation row, so two owners demoting or
removing each other at the same moment cannot both succeed).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import smtplib
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core import mail
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from accounts.models import Membership, Organisation, User
from accounts.services import training_opt_out_record
from audit.models import Action
from audit.services import audit_record
from conversations import regions
from conversations.models import Conversation
from sharing.services import share_links_revoke_for
from workspaces.models import Invitation
from workspaces.selectors import Role, Seat

logger = logging.getLogger(__name__)

TOKEN_BYTES = 32  # 256 bits of secret per invitation
MAX_NAME_CHARS = 200
MAX_SLUG_CHARS = 50


# --- organisations ----------------------------------------------------------------------------


def name_clean(name: str) -> str:
    """An organisation name with whitespace runs collapsed (no newlines: it goes into email
    subjects). Raises ValidationError if it is blank or over 200 characters."""
    text = " ".join((name or "").replace("\x00", "").split())
    if not text:
        raise ValidationError("Give the organisation a name.", code="empty")
    if len(text) > MAX_NAME_CHARS:
        raise ValidationError(
            f"An organisation name can be at most {MAX_NAME_CHARS} characters.", code="too_long"
        )
    return text


def slug_clean(slug: str, *, name: str) -> str:
    """The organisation's URL name: ``slug`` if given, else derived from ``name``; lower-case
    letters, digits and hyphens, at most 50 characters. Raises ValidationError if nothing usable
    is left (e.g. a name in a script slugify drops) or ``slug`` has other characters."""
    raw = (slug or "").strip()
    if raw:
        cleaned = slugify(raw)
        if cleaned != raw.lower() or not cleaned:
            raise ValidationError(
                "A URL name may only have lower-case letters, digits and hyphens "
                f"(e.g. {slugify(raw) or 'my-team'!r}).",
                code="bad_slug",
            )
    else:
        cleaned = slugify(name)
        if not cleaned:
            raise ValidationError(
                "Choose a URL name for the organisation: letters, digits and hyphens.",
                code="no_slug",
            )
    if len(cleaned) > MAX_SLUG_CHARS:
        raise ValidationError(
            f"A URL name can be at most {MAX_SLUG_CHARS} characters.", code="slug_too_long"
        )
    return cleaned


def region_clean(region: str) -> str:
    """A region conversations can be stored in here (conversations/regions.py
    ``db_for_region``). Raises ValidationError (RegionUnavailable) naming the regions on offer."""
    regions.db_for_region(region)
    return region


@transaction.atomic
def organisation_create(
    *, creator: User, name: str, slug: str = "", region: str = ""
) -> Organisation:
    """Create an organisation with ``creator`` as its owner.

    Its tier is the creator's (staff raise it in the admin): creating an organisation never
    buys a better tier, pool pin or limit than one's own. ``region`` (blank: the creator's) is
    where its conversations are stored. Note that a person's conversations belong to their
    first organisation's workspace (conversations/regions.py ``home_region``).
    Raises ValidationError for a bad name, slug or region, or a slug already taken.
    """
    name = name_clean(name)
    slug = slug_clean(slug, name=name)
    region = region_clean(region or creator.region)
    if Organisation.objects.filter(slug=slug).exists():
        raise ValidationError(f"The URL name {slug!r} is taken; choose another.", code="slug_taken")
    try:
        with transaction.atomic():
            org = Organisation.objects.create(
                name=name, slug=slug, tier=creator.tier, region=region
            )
    except IntegrityError:  # taken at the same moment
        raise ValidationError(
            f"The URL name {slug!r} is taken; choose another.", code="slug_taken"
        ) from None
    Membership.objects.create(organisation=org, user=creator, role=Role.OWNER)
    audit_record(
        actor=creator, action=Action.ORG_CREATE, org=org, target_type="accounts.organisation",
        target_id=org.pk, details={"region": region, "tier": org.tier},
    )  # fmt: skip
    return org


@transaction.atomic
def organisation_policy_update(*, seat: Seat, changes: dict) -> Organisation:
    """Store policy fields of the seat's organisation (workspaces/forms.py ``PolicyForm``
    validates them): any of ``pinned_pool``, ``retention_days``, ``region``,
    ``zero_retention``, ``not_for_training``, ``share_prefix_cache``, ``rate_limit_rpm``,
    ``rate_limit_tpm``. Only
    those columns are written, so an edit of other fields in the meantime (the moderation
    page) is not overwritten, and only the fields whose value changes: a save that changes
    nothing writes nothing and records nothing. Each takes effect from the next turn: every
    turn reads its organisation afresh (accounts/callers.py ``caller_for``,
    conversations/retention.py, accounts/selectors.py ``turn_training_eligible``); nothing
    caches them. Audit: ``org.policy_change`` with the changed fields' new values, and for a
    change of ``not_for_training`` also ``org.training_opt_out`` with its old and new value
    (accounts/services.py ``training_opt_out_record``). Raises PermissionDenied unless the
    seat is an owner's, ValueError for another field."""
    allowed = {
        "pinned_pool", "retention_days", "region", "zero_retention", "not_for_training",
        "share_prefix_cache", "rate_limit_rpm", "rate_limit_tpm",
    }  # fmt: skip
    if not seat.can_manage_policies:
        raise PermissionDenied("Only this organisation's owners change its policies.")
    unknown = set(changes) - allowed
    if unknown:
        raise ValueError(f"not policy fields: {sorted(unknown)}")
    org = Organisation.objects.select_for_update().get(pk=seat.org.pk)
    changed = {field: value for field, value in changes.items() if getattr(org, field) != value}
    was_not_for_training = org.not_for_training
    for field, value in changed.items():
        setattr(org, field, value)
    if changed:
        actor = seat.membership.user_id
        org.save(update_fields=sorted(changed))
        audit_record(
            actor=actor, action=Action.ORG_POLICY_CHANGE, org=org,
            target_type="accounts.organisation", target_id=org.pk, details={"changes": changed},
        )  # fmt: skip
        training_opt_out_record(
            actor=actor, subject=org, old=was_not_for_training, new=org.not_for_training
        )
    return org


# --- invitations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class IssuedInvitation:
    """A new invitation: ``token`` is the secret for its link, never stored (only its hash)."""

    invitation: Invitation
    token: str


class InvitationRefused(Exception):
    """An invitation that cannot be accepted: ``status`` (HTTP: 404 unknown, 410 spent,
    expired or withdrawn, 403 someone else's, 409 already a member) and ``message`` (for the
    person, saying what to do)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def token_hash(token: str) -> str:
    """SHA-256 (hex) of an invitation token: what is stored and looked up. A 256-bit random
    secret needs no slow hash (nothing to guess), as for API keys."""
    return hashlib.sha256(token.encode()).hexdigest()


def email_clean(email: str) -> str:
    """An email address, trimmed and with its domain lower-cased; "" stays "" (a link
    invitation). Raises ValidationError for an address that is not one."""
    text = (email or "").strip()
    if not text:
        return ""
    try:
        validate_email(text)
    except ValidationError:
        raise ValidationError(
            f"{text[:100]!r} is not an email address; leave it blank for an invitation link.",
            code="bad_email",
        ) from None
    local, _, domain = text.rpartition("@")
    return f"{local}@{domain.lower()}"


@transaction.atomic
def invitation_create(*, seat: Seat, role: str = Role.MEMBER, email: str = "") -> IssuedInvitation:
    """Invite someone into the seat's organisation with ``role``: by link (``email`` blank:
    whoever opens the link and is signed in may accept it, once) or for one email address
    (only an account with that address, or one with none, may accept; see
    :func:`invitation_accept`). Expires after ``settings.CHAT_WORKSPACE_INVITATION_TTL_DAYS``.

    Owners invite as member or admin, admins as member (selectors.Seat.invitable_roles); an
    owner is made once they have joined (:func:`member_role_set`). Sending the email is
    :func:`invitation_email_send`, after this has committed. Raises PermissionDenied for a
    seat that may not invite (or not with ``role``), ValidationError for a bad address.
    """
    if not seat.can_manage_members:
        raise PermissionDenied("Only this organisation's owners and admins invite people.")
    if role not in dict(seat.invitable_roles()):
        allowed = ", ".join(label.lower() for _, label in seat.invitable_roles())
        raise PermissionDenied(f"You can invite people as: {allowed}.")
    email = email_clean(email)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    invitation = Invitation.objects.create(
        organisation=seat.org,
        email=email,
        role=role,
        token_hash=token_hash(token),
        created_by=seat.membership.user,
        expires_at=timezone.now() + timedelta(days=settings.CHAT_WORKSPACE_INVITATION_TTL_DAYS),
    )
    audit_record(
        actor=seat.membership.user_id, action=Action.ORG_INVITATION_CREATE, org=seat.org,
        target_type="workspaces.invitation", target_id=invitation.pk,
        details={"role": role, "by_email": bool(email)},
    )  # fmt: skip
    return IssuedInvitation(invitation=invitation, token=token)


def invitation_email_send(*, issued: IssuedInvitation, accept_url: str) -> bool:
    """Email the invitation to its address through Django's mail API (``EMAIL_BACKEND``; the
    console backend unless configured). ``accept_url``: the absolute URL of its link. Call it
    after :func:`invitation_create` has committed, so no email names an invitation that was
    rolled back. Returns whether the backend took the message; a failure (no mail server) is
    logged and returns False, so the inviter can pass the link on themselves."""
    invitation = issued.invitation
    org = invitation.organisation
    inviter = invitation.created_by.username if invitation.created_by else "Someone"
    expires = invitation.expires_at.strftime("%d %B %Y, %H:%M UTC")
    body = (
        f"{inviter} invited you to join the organisation {org.name} as {invitation.role}.\n\n"
        f"Accept the invitation here (sign in or create an account first if you need to):\n"
        f"{accept_url}\n\n"
        f"The link works once and until {expires}. If you did not expect it, ignore this email.\n"
    )
    try:
        sent = mail.send_mail(
            subject=f"Invitation to join {' '.join(org.name.split())}",  # one header line
            message=body,
            from_email=None,  # settings.DEFAULT_FROM_EMAIL
            recipient_list=[invitation.email],
        )
    except (smtplib.SMTPException, OSError) as exc:
        logger.warning("invitation %s: email to its address failed: %s", invitation.pk, exc)
        return False
    return sent == 1


@transaction.atomic
def invitation_revoke(*, seat: Seat, invitation: Invitation) -> Invitation:
    """Withdraw an invitation of the seat's organisation (idempotent); its link stops working
    at once. An accepted one stays accepted (remove the member instead). Raises
    PermissionDenied unless the seat manages members, ValueError for another organisation's."""
    if not seat.can_manage_members:
        raise PermissionDenied("Only this organisation's owners and admins withdraw invitations.")
    if invitation.organisation_id != seat.org.pk:
        raise ValueError("the invitation belongs to another organisation")
    if invitation.revoked_at is None and invitation.accepted_at is None:
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
        audit_record(
            actor=seat.membership.user_id, action=Action.ORG_INVITATION_REVOKE, org=seat.org,
            target_type="workspaces.invitation", target_id=invitation.pk,
            details={"role": invitation.role},
        )  # fmt: skip
    return invitation


def mask_email(email: str) -> str:
    """``"bob@example.com"`` -> ``"b**@example.com"``: enough for its owner to recognise,
    not enough to harvest from a link that reached someone else."""
    local, _, domain = email.rpartition("@")
    return f"{local[:1]}{'*' * max(2, len(local) - 1)}@{domain}"


def invitation_find(*, token: str) -> Invitation:
    """The invitation a link's token names, whatever its state, with its organisation.
    Raises InvitationRefused 404 for a token that names none."""
    invitation = (
        Invitation.objects.select_related("organisation", "created_by")
        .filter(token_hash=token_hash(token or ""))
        .first()
    )
    if invitation is None:
        raise InvitationRefused(
            404,
            "This invitation link is not valid. Check that you copied all of it, or ask the "
            "organisation for a new invitation.",
        )
    return invitation


def invitation_problem(*, invitation: Invitation, user: User, now=None) -> InvitationRefused | None:
    """Why ``user`` cannot accept ``invitation`` now, or None if they can. In order: withdrawn
    (410), used (410), expired (410), for another address (403), already a member (409).

    An email invitation is for the account whose email is that address (case-insensitive).
    An account with no email address may accept it too: the link reached them through that
    mailbox (sign-up asks for no address, so demanding one would lock new people out)."""
    org = invitation.organisation
    now = now or timezone.now()
    if invitation.revoked_at is not None:
        return InvitationRefused(
            410, f"This invitation to {org.name} was withdrawn. Ask its owners for a new one."
        )
    if invitation.accepted_at is not None and invitation.accepted_by_id == user.pk:
        return InvitationRefused(409, f"You already joined {org.name} with this invitation.")
    if invitation.accepted_at is not None:
        return InvitationRefused(
            410,
            f"This invitation to {org.name} has already been used; each invitation works "
            "once. Ask its owners for a new one.",
        )
    if invitation.expires_at <= now:
        when = invitation.expires_at.strftime("%d %B %Y")
        return InvitationRefused(
            410, f"This invitation to {org.name} expired on {when}. Ask its owners for a new one."
        )
    own = (user.email or "").strip()
    if invitation.email and own and own.casefold() != invitation.email.casefold():
        return InvitationRefused(
            403,
            f"This invitation is for {mask_email(invitation.email)}, but you are signed in as "
            f"{user.username} ({own}). Sign in with the account that uses that address, or ask "
            f"{org.name}'s owners to invite {own}.",
        )
    if Membership.objects.filter(organisation=org, user=user).exists():
        return InvitationRefused(409, f"You are already a member of {org.name}.")
    return None


@transaction.atomic
def invitation_accept(*, token: str, user: User) -> Membership:
    """Accept the invitation ``token`` names as ``user``: they become a member of its
    organisation with its role, and the invitation is spent (single use). The invitation row is
    locked, so two people (or two clicks) racing for one link cannot both join with it.
    Raises InvitationRefused (see :func:`invitation_find`, :func:`invitation_problem`)."""
    found = invitation_find(token=token)
    invitation = (
        Invitation.objects.select_for_update().select_related("organisation").get(pk=found.pk)
    )
    problem = invitation_problem(invitation=invitation, user=user)
    if problem is not None:
        raise problem
    try:
        with transaction.atomic():
            membership = Membership.objects.create(
                organisation=invitation.organisation, user=user, role=invitation.role
            )
    except IntegrityError:  # joined at this moment through another invitation
        raise InvitationRefused(
            409, f"You are already a member of {invitation.organisation.name}."
        ) from None
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    audit_record(
        actor=user, action=Action.ORG_INVITATION_ACCEPT, org=invitation.organisation_id,
        target_type="workspaces.invitation", target_id=invitation.pk,
        details={"role": invitation.role},
    )  # fmt: skip
    return membership


# --- members ----------------------------------------------------------------------------------


def _lock_org(org: Organisation) -> Organisation:
    """Lock the organisation row: membership changes of one organisation run one at a time,
    so the "keeps an owner" check holds when two run at once."""
    return Organisation.objects.select_for_update().get(pk=org.pk)


def _owner_count(org: Organisation) -> int:
    return Membership.objects.filter(organisation=org, role=Role.OWNER).count()


def _last_owner_error(org: Organisation, *, you: bool) -> ValidationError:
    who = "You are" if you else "They are"
    return ValidationError(
        f"{who} the only owner of {org.name}; make another member an owner first.",
        code="last_owner",
    )


@transaction.atomic
def member_remove(*, seat: Seat, membership: Membership) -> None:
    """Remove ``membership`` (someone else's) from the seat's organisation. From the next
    request on they can no longer open the workspace, its shared conversations or links to its
    conversations (every check reads memberships afresh: conversations/selectors.py
    ``conversation_view_for_user``, sharing/selectors.py), and conversations they shared stop
    being shown to the workspace. Share links they made to the organisation's conversations
    are revoked as well (:func:`_share_links_revoke`).

    Raises PermissionDenied unless the seat may remove them (selectors.Seat.can_remove),
    ValidationError for oneself (use :func:`member_leave`) or the last owner.
    """
    if membership.organisation_id != seat.org.pk:
        raise ValueError("the membership belongs to another organisation")
    if membership.user_id == seat.membership.user_id:
        raise ValidationError("To leave the organisation yourself, use Leave.", code="self")
    if not seat.can_remove(membership):
        raise PermissionDenied("Admins can remove members only; ask an owner.")
    org = _lock_org(seat.org)
    current = Membership.objects.filter(pk=membership.pk).first()
    if current is None:
        return  # removed meanwhile
    if current.role == Role.OWNER and _owner_count(org) <= 1:
        raise _last_owner_error(org, you=False)
    current.delete()
    audit_record(
        actor=seat.membership.user_id, action=Action.ORG_MEMBER_REMOVE, org=org,
        target_type="accounts.user", target_id=current.user_id, details={"role": current.role},
    )  # fmt: skip
    _share_links_revoke(user_id=current.user_id, org_id=org.pk)


@transaction.atomic
def member_leave(*, seat: Seat) -> None:
    """The seat's holder leaves its organisation (access ends as for :func:`member_remove`).
    Raises ValidationError if they are its only owner."""
    org = _lock_org(seat.org)
    current = Membership.objects.filter(pk=seat.membership.pk).first()
    if current is None:
        return
    if current.role == Role.OWNER and _owner_count(org) <= 1:
        raise _last_owner_error(org, you=True)
    current.delete()
    audit_record(
        actor=current.user_id, action=Action.ORG_MEMBER_LEAVE, org=org, target_type="accounts.user",
        target_id=current.user_id, details={"role": current.role},
    )  # fmt: skip
    _share_links_revoke(user_id=current.user_id, org_id=org.pk)


@transaction.atomic
def member_role_set(*, seat: Seat, membership: Membership, role: str) -> Membership:
    """Give ``membership`` the role ``role`` (owner, admin or member); from the next request.
    Raises PermissionDenied unless the seat is an owner's, ValidationError for an unknown
    role or for demoting the last owner (oneself included)."""
    if not seat.can_manage_policies:
        raise PermissionDenied("Only this organisation's owners change roles.")
    if membership.organisation_id != seat.org.pk:
        raise ValueError("the membership belongs to another organisation")
    if role not in Role.values:
        raise ValidationError(
            f"Unknown role {role[:20]!r}; choose owner, admin or member.", code="bad_role"
        )
    org = _lock_org(seat.org)
    current = Membership.objects.select_related("user").filter(pk=membership.pk).first()
    if current is None:
        raise ValidationError("That person is no longer a member.", code="gone")
    if current.role == role:
        return current
    if current.role == Role.OWNER and _owner_count(org) <= 1:
        raise _last_owner_error(org, you=current.user_id == seat.membership.user_id)
    audit_record(
        actor=seat.membership.user_id, action=Action.ORG_ROLE_CHANGE, org=org,
        target_type="accounts.user", target_id=current.user_id,
        details={"from": current.role, "to": role},
    )  # fmt: skip
    current.role = role
    current.save(update_fields=["role"])
    return current


def _share_links_revoke(*, user_id: int, org_id: int) -> None:
    """Revoke the share links user ``user_id`` made to organisation ``org_id``'s
    conversations (sharing/services.py ``share_links_revoke_for``, every region), once this
    transaction has committed: they stay revoked if the person is invited back. (They already
    answer 404 from the moment the membership is gone: the shared page checks its maker's
    membership on every view, sharing/selectors.py ``creator_can_read``; so a failure here is
    logged, not raised, and takes nobody's access back.)"""
    transaction.on_commit(lambda: share_links_revoke_for(user=user_id, org=org_id), robust=True)


# --- conversations in the workspace -----------------------------------------------------------


@transaction.atomic
@regions.atomic
def conversation_share_set(*, conversation: Conversation, user: User, shared: bool) -> Conversation:
    """Share ``conversation`` (``user``'s own, checked by the caller with
    ``conversations.selectors.conversation_get_for_user``) with its organisation's workspace, or
    stop sharing it: members read it from the next request. Raises ValidationError if it
    belongs to no organisation, or ``user`` is no longer a member of it (only to stop sharing
    is still allowed then)."""
    if conversation.owner_id != user.pk:
        raise PermissionDenied("Only a conversation's owner shares it with the workspace.")
    if conversation.org_id is None:
        raise ValidationError(
            "This conversation is not in an organisation's workspace, so there is no one to "
            "share it with.",
            code="no_org",
        )
    if shared and conversation.temporary:
        raise ValidationError(
            "A temporary chat is not kept, so it cannot be shared.", code="temporary"
        )
    if (
        shared
        and not Membership.objects.filter(
            organisation_id=conversation.org_id, user_id=user.pk
        ).exists()
    ):
        raise ValidationError(
            "You are no longer a member of this conversation's organisation.", code="not_member"
        )
    Conversation.objects.filter(pk=conversation.pk).update(shared_with_org=shared)
    conversation.shared_with_org = shared
    return conversation
