"""Reads for the privacy pages: what blocks an account's deletion, and what an organisation's
deletion would remove."""

from __future__ import annotations

from django.db.models import Count

from accounts.models import Membership, Organisation, User
from conversations.models import Conversation
from core import regions

Role = Membership.Role


def last_owner_orgs(*, user: User, lock: bool = False) -> list[Organisation]:
    """The organisations ``user`` is the only owner of, by name: an organisation always keeps
    an owner (workspaces/services.py), so these block the account's deletion. ``lock``: lock
    the organisations' rows (in a transaction), the lock every membership change takes, so no
    role change slips in between this check and the deletion."""
    owned = list(
        Membership.objects.filter(user=user, role=Role.OWNER).values_list(
            "organisation_id", flat=True
        )
    )
    orgs = Organisation.objects.filter(pk__in=owned).order_by("name", "pk")
    if lock:
        orgs = orgs.select_for_update()
    orgs = list(orgs)
    owners = dict(
        Membership.objects.filter(organisation__in=orgs, role=Role.OWNER)
        .values("organisation").annotate(n=Count("id")).values_list("organisation", "n")
    )  # fmt: skip
    return [org for org in orgs if owners.get(org.pk, 0) <= 1]


def org_deletion_summary(*, org: Organisation) -> dict:
    """What deleting ``org`` removes: ``{"conversations", "members"}`` (conversations counted
    in every region's database)."""
    conversations = sum(
        Conversation.objects.using(db).filter(org_id=org.pk).count() for db in regions.region_dbs()
    )
    return {
        "conversations": conversations,
        "members": Membership.objects.filter(organisation=org).count(),
    }
