"""Reads of the moderation app: the withdrawn answers an organisation's admins review."""

from __future__ import annotations

from uuid import UUID

from django.http import Http404

from core import regions
from moderation.models import WithdrawnAnswer

REVIEW_PAGE_ROWS = 200


def withdrawn_answers_for_org(*, org, limit: int = REVIEW_PAGE_ROWS) -> list[WithdrawnAnswer]:
    """The newest ``limit`` withdrawn answers of ``org``'s members' turns (the organisation the
    turn was charged to), from every regional database, newest first. The caller checked that
    the reader administers ``org`` (accounts.selectors.org_get_for_admin)."""
    rows: list[WithdrawnAnswer] = []
    for db in regions.region_dbs():
        rows += list(WithdrawnAnswer.objects.using(db).filter(org_id=org.pk)
                     .order_by("-created_at")[:limit])
    rows.sort(key=lambda r: r.created_at, reverse=True)
    return rows[:limit]


def withdrawn_answer_get_for_org(*, review_id: UUID, org) -> WithdrawnAnswer:
    """The withdrawn answer ``review_id`` of ``org``. Raises Http404 when it is missing *or*
    another organisation's (its existence is not revealed)."""
    for db in regions.region_dbs():
        review = WithdrawnAnswer.objects.using(db).filter(pk=review_id, org_id=org.pk).first()
        if review is not None:
            return review
    raise Http404("No such withdrawn answer.")
