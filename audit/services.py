"""Writing the audit log: :func:`audit_record`, called by the services and views that perform
the actions (workspaces, moderation, sharing, accounts, privacy) and by the admin hooks
(audit/signals.py for the admin's own log, audit/middleware.py for its bulk actions)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError

from audit.models import AuditDetail, AuditEntry
from core import regions

logger = logging.getLogger(__name__)

# Keys ``details`` may not use anywhere (nested too): the log holds no personal data or content,
# so a deleted account leaves nothing in it that says who they were (audit/models.py).
PERSONAL_KEYS = frozenset({
    "username", "email", "first_name", "last_name", "full_name", "password", "token", "secret",
    "content", "text", "title", "comment", "ip", "user_agent", "object_repr",
})  # fmt: skip
ACTION_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
MAX_DETAILS_CHARS = 8000


def _id(value: Any) -> Any:
    """A model instance's pk, or the value itself (an id or None); anonymous users are None."""
    if value is None or getattr(value, "is_anonymous", False):
        return None
    return getattr(value, "pk", value)


def _check_keys(value: Any, path: str = "details") -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if str(key).lower() in PERSONAL_KEYS:
                raise ValueError(
                    f"{path}[{key!r}]: the audit log stores no personal data or content; "
                    "record ids instead (see audit/models.py)."
                )
            _check_keys(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_keys(item, f"{path}[{index}]")


def audit_record(
    *,
    actor: Any,
    action: str,
    org: Any = None,
    target_type: str,
    target_id: Any,
    details: dict | None = None,
    region: str | None = None,
) -> AuditEntry:
    """Append one entry to the audit log and return it.

    ``actor``: the User who acted, their id, or None (the system). ``action``: a dotted name
    (``audit.models.Action``, e.g. ``org.role_change``). ``org``: the Organisation (or its id) the
    action concerns, None if none: its owners see the entry on ``/orgs/<slug>/audit/``.
    ``target_type``: ``app_label.model`` of what was acted on; ``target_id``: its primary key
    (any type; stored as text, "" for none). ``details``: a JSON-serialisable dict of ids,
    roles, policy values and counts (dates, UUIDs and decimals are turned into strings).

    ``region``: set it when the target or details name a region's data (a conversation, a turn,
    a share link: their ids). The entry then keeps only who, what, when and the region, and its
    target id and details go to that region's database (``AuditDetail``), so no id of that
    region's data is stored outside it (issue 20, "Region-scoped stores"); readers put them
    back with :func:`with_region_details`.

    Written in the caller's transaction on the default database, so an action that rolls back
    leaves no entry (a regional detail is written in the caller's transaction on the region's
    database, if it has one open there; a rollback of one but not the other leaves an entry
    without detail or a detail without entry, never an id outside its region). Raises ValueError for a malformed action name, details that are not a
    dict, too large (over 8,000 characters as JSON) or that use a key of personal data
    (:data:`PERSONAL_KEYS`): the log must hold none (audit/models.py).
    """
    if not isinstance(action, str) or len(action) > 100 or not ACTION_RE.match(action):
        raise ValueError(
            f"audit action {action!r}: use a dotted lower-case name like 'org.role_change'"
        )
    details = {} if details is None else details
    if not isinstance(details, dict):
        raise ValueError("audit details must be a dict")
    _check_keys(details)
    encoded = json.dumps(details, cls=DjangoJSONEncoder, sort_keys=True)
    if len(encoded) > MAX_DETAILS_CHARS:
        raise ValueError(
            f"audit details are {len(encoded)} characters as JSON; at most {MAX_DETAILS_CHARS}"
        )
    target = _id(target_id)
    target_text = "" if target is None else str(target)[:64]
    if region:
        db = regions.db_for_region(region)  # RegionUnavailable (a ValidationError) if not served
        entry = AuditEntry.objects.create(
            actor_id=_id(actor), action=action, org_id=_id(org), target_type=target_type,
            region=region,
        )  # fmt: skip
        AuditDetail.objects.db_manager(db).create(
            entry_id=entry.pk, target_id=target_text, details=json.loads(encoded)
        )
        entry.target_id, entry.details = target_text, json.loads(encoded)
        return entry
    return AuditEntry.objects.create(
        actor_id=_id(actor),
        action=action,
        org_id=_id(org),
        target_type=target_type,
        target_id=target_text,
        details=json.loads(encoded),
    )


def with_region_details(entries: Iterable[AuditEntry]) -> list[AuditEntry]:
    """``entries`` as a list, with the target id and details of those kept in a region's
    database (``entry.region`` set; see :func:`audit_record`) filled in on the instances (not
    saved): one query per region. An entry whose region's database cannot be read now (an
    outage, or a region no longer served) shows ``{"unavailable": "<region>"}`` as details."""
    entries = list(entries)
    by_region: dict[str, list[AuditEntry]] = {}
    for entry in entries:
        if entry.region:
            by_region.setdefault(entry.region, []).append(entry)
    for region, some in by_region.items():
        try:
            found = {
                d.entry_id: d
                for d in AuditDetail.objects.using(regions.db_for_region(region)).filter(
                    entry_id__in=[e.pk for e in some]
                )
            }
        except (DatabaseError, regions.RegionUnavailable):
            logger.warning("audit details of region %s cannot be read now", region)
            found = {}
        for entry in some:
            detail = found.get(entry.pk)
            if detail is not None:
                entry.target_id, entry.details = detail.target_id, detail.details
            else:
                entry.details = {"unavailable": region}
    return entries
