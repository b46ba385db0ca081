"""Writes for workspace invitations: issuing one (a link, or an email), revoking it, and
accepting it; keyword-only, one transaction each. The invitation's token is shown once and
only its SHA-256 is stored (:func:`token_hash`).

Who may invite is decided by workspaces/selectors.py (:class:`~workspaces.selectors.Seat`);
the other workspace writes (organisations, members, policies) are in workspaces/services.py.
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

from accounts.models import Membership, User
from audit.models import Action
from audit.services import audit_record
from workspaces.models import Invitation
from workspaces.selectors import Role, Seat

logger = logging.getLogger(__name__)

TOKEN_BYTES = 32  # 256 bits of secret per invitation


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
    seat that may not invite (or not with ``role``), ValidationError for a bad address, an
    address of a member (code ``already_member``) or one with a pending invitation (code
    ``already_invited``: a second would stay pending after the first is used).
    """
    if not seat.can_manage_members:
        raise PermissionDenied("Only this organisation's owners and admins invite people.")
    if role not in dict(seat.invitable_roles()):
        allowed = ", ".join(label.lower() for _, label in seat.invitable_roles())
        raise PermissionDenied(f"You can invite people as: {allowed}.")
    email = email_clean(email)
    if email:
        _address_check(seat=seat, email=email)
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


def _address_check(*, seat: Seat, email: str) -> None:
    """Raise ValidationError if ``email`` (any case) is a member's address or has a pending
    invitation to the seat's organisation, saying what to do instead."""
    org = seat.org
    if Membership.objects.filter(organisation=org, user__email__iexact=email).exists():
        raise ValidationError(
            f"{email} is already a member of {org.name}.", code="already_member"
        )
    pending = Invitation.objects.filter(
        organisation=org, email__iexact=email, accepted_at__isnull=True, revoked_at__isnull=True,
        expires_at__gt=timezone.now(),
    )  # fmt: skip
    if pending.exists():
        raise ValidationError(
            f"{email} already has a pending invitation (listed below); withdraw it to send a "
            "new one.",
            code="already_invited",
        )


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
