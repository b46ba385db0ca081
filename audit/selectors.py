"""Reading the audit log, permission-checked by the caller: an organisation's owners see its
entries (workspaces/audit_views.py ``org_audit`` checks the seat), staff see all in the admin.

Names are looked up now, never stored (audit/models.py): an entry shows the actor's and the
target person's current username, "site administrator" for staff acting from outside the
organisation, and "deleted account #<id>" for an account that no longer exists.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from accounts.models import Membership, Organisation, User
from audit.models import Action, AuditEntry
from audit.services import with_region_details

PAGE_SIZE = 50
ADMIN_FILTER = "admin"  # the filter value for every admin action (admin.*)

# Actions an organisation's log can hold, for the page's filter (in this order).
ORG_ACTIONS = (
    Action.ORG_CREATE, Action.ORG_POLICY_CHANGE, Action.ORG_MODERATION_CHANGE,
    Action.ORG_ROLE_CHANGE, Action.ORG_MEMBER_REMOVE, Action.ORG_MEMBER_LEAVE,
    Action.ORG_INVITATION_CREATE, Action.ORG_INVITATION_REVOKE, Action.ORG_INVITATION_ACCEPT,
    Action.ORG_EXPORT, Action.SHARE_LINK_CREATE, Action.SHARE_LINK_REVOKE,
)  # fmt: skip


@dataclass(frozen=True)
class AuditRow:
    """An entry as a page shows it: who (``actor``), what (``entry.action_label``), on whom or
    what (``target``), and its details as (key, value) text pairs."""

    entry: AuditEntry
    actor: str
    target: str
    details: list[tuple[str, str]]


def action_choices() -> list[tuple[str, str]]:
    """(value, label) for the organisation page's filter: its actions, then all admin ones."""
    return [(a, Action.label(a)) for a in ORG_ACTIONS] + [
        (ADMIN_FILTER, "site administrators' actions")
    ]


def people_labels(
    *, user_ids: Iterable[int | None], org: Organisation | None = None
) -> dict[int | None, str]:
    """A label per user id: the username; "site administrator" for staff who are not members
    of ``org`` (their names are not the organisation's business); "deleted account #<id>" for
    ids with no account; None -> "system". Two queries."""
    ids = {i for i in user_ids if i is not None}
    labels: dict[int | None, str] = {None: "system"}
    users = {
        pk: (name, staff)
        for pk, name, staff in User.objects.filter(pk__in=ids).values_list(
            "pk", "username", "is_staff"
        )
    }
    members = set()
    if org is not None and ids:
        members = set(
            Membership.objects.filter(organisation=org, user_id__in=ids).values_list(
                "user_id", flat=True
            )
        )
    for pk in ids:
        if pk not in users:
            labels[pk] = f"deleted account #{pk}"
        elif org is not None and users[pk][1] and pk not in members:
            labels[pk] = "site administrator"
        else:
            labels[pk] = users[pk][0]
    return labels


def _details_text(details: dict) -> list[tuple[str, str]]:
    pairs = []
    for key, value in sorted((details or {}).items()):
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        pairs.append((str(key).replace("_", " "), text))
    return pairs


def _target_label(entry: AuditEntry, people: dict, org: Organisation | None) -> str:
    if entry.target_type == "accounts.user" and entry.target_id.isdigit():
        return people.get(int(entry.target_id), f"account #{entry.target_id}")
    if (
        entry.target_type == "accounts.organisation"
        and org is not None
        and entry.target_id == str(org.pk)
    ):
        return org.name
    model = entry.target_type.rpartition(".")[2].replace("_", " ")
    return f"{model} #{entry.target_id}" if entry.target_id else model


def rows_for(entries: list[AuditEntry], *, org: Organisation | None = None) -> list[AuditRow]:
    """Entries as :class:`AuditRow` (names looked up in two queries for the whole list; the
    target ids and details kept in regions' databases in one more query per region)."""
    entries = with_region_details(entries)
    ids = {e.actor_id for e in entries}
    ids |= {
        int(e.target_id)
        for e in entries
        if e.target_type == "accounts.user" and e.target_id.isdigit()
    }
    people = people_labels(user_ids=ids, org=org)
    return [
        AuditRow(
            entry=e,
            actor=people.get(e.actor_id, "system"),
            target=_target_label(e, people, org),
            details=_details_text(e.details),
        )
        for e in entries
    ]


def audit_page_for_org(
    *, org: Organisation, before: int | None = None, action: str = "", limit: int | None = None
) -> tuple[list[AuditRow], int | None]:
    """One page of ``org``'s entries, newest first: those with ids below ``before`` (None: the
    newest), only ``action`` if given (``"admin"``: every admin action). Returns the rows and
    the ``before`` of the next (older) page, None if this is the last. Keyset pagination on the
    ``(org_id, id)`` index, so a page costs the same however long the log is. The caller has
    checked that the reader is one of ``org``'s owners."""
    limit = limit or PAGE_SIZE
    query = AuditEntry.objects.filter(org_id=org.pk)
    if before is not None:
        query = query.filter(id__lt=before)
    if action == ADMIN_FILTER:
        query = query.filter(action__startswith="admin.")
    elif action:
        query = query.filter(action=action)
    entries = list(query.order_by("-id")[: limit + 1])
    more = len(entries) > limit
    entries = entries[:limit]
    return rows_for(entries, org=org), (entries[-1].id if more else None)


def audit_entries_by_actor(*, user_id: int, batch: int = 500) -> Iterator[AuditEntry]:
    """Every entry ``user_id`` is the actor of, oldest first, fetched ``batch`` rows at a time
    (keyset on id; for the data export)."""
    after = 0
    while True:
        rows = list(
            AuditEntry.objects.filter(actor_id=user_id, id__gt=after).order_by("id")[:batch]
        )
        yield from with_region_details(rows)
        if len(rows) < batch:
            return
        after = rows[-1].id
