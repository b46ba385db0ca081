"""Writes for workspaces: creating an organisation, members leaving, being removed or changing
role, the organisation's policies, and sharing a conversation with the workspace. Keyword-only;
one transaction each. Invitations (by link or email) are written by workspaces/invitations.py.

Who may do what is decided by workspaces/selectors.py (:class:`~workspaces.selectors.Seat`);
the services re-check it and add the rules that need the current rows: an organisation always
keeps an owner (checked under a lock on the organisation row, so two owners demoting or
removing each other at the same moment cannot both succeed).
"""

from __future__ import annotations


from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from accounts.models import Membership, Organisation, User
from accounts.services import training_opt_out_record
from audit.models import Action
from audit.services import audit_record
from conversations.models import Conversation
from core import regions
from sharing.services import share_links_revoke_for
from workspaces.selectors import Role, Seat


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


def _slugify(text: str) -> str:
    """Django's ``slugify`` with underscores made hyphens: a URL name is lower-case letters,
    digits and hyphens (slugify keeps ``_``)."""
    return slugify(text).replace("_", "-")


def slug_clean(slug: str, *, name: str) -> str:
    """The organisation's URL name: ``slug`` if given, else derived from ``name``; lower-case
    letters, digits and hyphens, at most 50 characters. Raises ValidationError if nothing usable
    is left (e.g. a name in a script slugify drops) or ``slug`` has other characters."""
    raw = (slug or "").strip()
    if raw:
        cleaned = _slugify(raw)
        if cleaned != raw.lower() or not cleaned:
            raise ValidationError(
                "A URL name may only have lower-case letters, digits and hyphens "
                f"(e.g. {cleaned or 'my-team'!r}).",
                code="bad_slug",
            )
    else:
        cleaned = _slugify(name)
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
    """A region conversations can be stored in here (core/regions.py
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
    first organisation's workspace (core/regions.py ``home_region``).
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
