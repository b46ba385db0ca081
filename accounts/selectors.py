"""Reads for accounts: the signed-in sessions page; whether a turn written now may be used for
training (the user's and the organisation's opt-outs)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from django.http import Http404
from ua_parser import parse as parse_user_agent

from accounts.models import Membership, Organisation, User, UserSession


@dataclass(frozen=True)
class SessionListing:
    """One row of the sessions page. ``device``: "Firefox on Linux", "Mobile Safari on iOS
    (iPhone)", or "Unknown device"; ``user_agent`` the raw header (autoescaped when shown)."""

    id: int
    device: str
    user_agent: str
    ip: str | None
    created_at: datetime
    last_seen_at: datetime
    is_current: bool


@lru_cache(maxsize=1024)
def device_label(user_agent: str) -> str:
    """A short name for the browser and system a User-Agent header describes, by ua-parser
    (uap-core's regexes, the data Browserscope and others use); "Unknown device" when it finds
    neither."""
    if not user_agent:
        return "Unknown device"
    result = parse_user_agent(user_agent)
    browser = result.user_agent.family if result.user_agent else None
    system = result.os.family if result.os else None
    device = result.device.family if result.device else None
    browser = None if browser in (None, "Other") else browser
    system = None if system in (None, "Other") else system
    if not browser and not system:
        return "Unknown device"
    label = " on ".join(part for part in (browser, system) if part)
    if device and device not in ("Other", "Spider") and device != system:
        label += f" ({device})"
    return label


def user_session_list(*, user: User, current_session_key: str | None) -> list[SessionListing]:
    """The user's signed-in sessions, the current one first, then by last seen (newest first)."""
    rows = [
        SessionListing(
            id=row.pk,
            device=device_label(row.user_agent),
            user_agent=row.user_agent,
            ip=row.ip,
            created_at=row.created_at,
            last_seen_at=row.last_seen_at,
            is_current=bool(current_session_key) and row.session_key == current_session_key,
        )
        for row in UserSession.objects.filter(user=user).order_by("-last_seen_at")
    ]
    return sorted(rows, key=lambda r: not r.is_current)  # stable: keeps last-seen order


def user_session_get_for_user(*, session_id: int, user: User) -> UserSession:
    """The user's session row ``session_id``. Raises Http404 if missing *or* not theirs."""
    row = UserSession.objects.filter(pk=session_id, user=user).first()
    if row is None:
        raise Http404("No such session.")
    return row


def turn_training_eligible(*, owner_id: int | None, org_id: int | None, owner: User | None = None) -> bool:
    """``Turn.training_eligible`` for a turn written now in a conversation of user ``owner_id``
    in organisation ``org_id`` (None: a personal conversation). False when either has opted
    out (``User.training_opt_out``, ``Organisation.not_for_training``): either opt-out wins
    (issue 20; DESIGN.md "Training opt-out"). Read afresh for every turn (one indexed query
    each, none for a missing id), so a change applies from the next turn and turns already
    stored keep their tag. Zero-retention and temporary chats store no turn at all
    (conversations/selectors.py ``conversation_zero_retention``), so they need no tag.
    ``owner``: the owner's row, when the caller loaded it for this very write (then its flag is
    read with no query on the global database)."""
    if owner is not None and owner.pk == owner_id:
        if owner.training_opt_out:
            return False
    elif owner_id is not None and User.objects.filter(pk=owner_id, training_opt_out=True).exists():
        return False
    return (
        org_id is None or not Organisation.objects.filter(pk=org_id, not_for_training=True).exists()
    )


def orgs_not_for_training(*, user: User) -> list[Organisation]:
    """The organisations ``user`` belongs to that have opted out of training
    (``not_for_training``), by name: the settings page says their turns in those workspaces are
    not used whatever the user's own choice."""
    return list(
        Organisation.objects.filter(membership__user=user, not_for_training=True).order_by("name")
    )


def org_get_for_admin(*, slug: str, user: User) -> Organisation:
    """The organisation ``slug`` if ``user`` is its owner or admin. Raises Http404 when the
    organisation is missing *or* the user is not an owner/admin of it (a plain member, another
    organisation's owner, an anonymous user): its existence is not revealed."""
    if not getattr(user, "is_authenticated", False):
        raise Http404("No such organisation.")
    membership = (
        Membership.objects.select_related("organisation")
        .filter(
            organisation__slug=slug,
            user=user,
            role__in=(Membership.Role.OWNER, Membership.Role.ADMIN),
        )
        .first()
    )
    if membership is None:
        raise Http404("No such organisation.")
    return membership.organisation
