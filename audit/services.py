"""Writing the audit log: :func:`audit_record`, called by the services and views that perform
the actions (workspaces, moderation, sharing, accounts, privacy) and by the admin hooks
(audit/signals.py for the admin's own log, audit/middleware.py for its bulk actions)."""

from __future__ import annotations

import json
import re
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from audit.models import AuditEntry

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
) -> AuditEntry:
    """Append one entry to the audit log and return it.

    ``actor``: the User who acted, their id, or None (the system). ``action``: a dotted name
    (``audit.models.Action``, e.g. ``org.role_change``). ``org``: the Organisation (or its id) the
    action concerns, None if none: its owners see the entry on ``/orgs/<slug>/audit/``.
    ``target_type``: ``app_label.model`` of what was acted on; ``target_id``: its primary key
    (any type; stored as text, "" for none). ``details``: a JSON-serialisable dict of ids,
    roles, policy values and counts (dates, UUIDs and decimals are turned into strings).

    Written in the caller's transaction on the default database, so an action that rolls back
    leaves no entry. Raises ValueError for a malformed action name, details that are not a
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
    return AuditEntry.objects.create(
        actor_id=_id(actor),
        action=action,
        org_id=_id(org),
        target_type=target_type,
        target_id="" if target is None else str(target)[:64],
        details=json.loads(encoded),
    )
