"""The Django admin's own log (``LogEntry``: each add, change and delete made through its
forms) mirrored into the audit log, as ``admin.add`` / ``admin.change`` / ``admin.delete``.

Only what the admin logs one object at a time arrives here (``LogEntry.save()``); bulk actions
(several rows deleted at once, "revoke the selected keys") are recorded by
audit/middleware.py, which also silences this mirror while an action runs, so nothing is
recorded twice. The change message is reduced to the names of the changed fields: Django's
message also carries objects' names (``str()`` of inline rows), which the log must not hold.
"""

from __future__ import annotations

import contextvars
import json

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.db.models.signals import post_save
from django.dispatch import receiver

from audit.models import Action
from audit.services import audit_record

# Set while audit/middleware.py runs an admin bulk action (it records the action itself).
in_admin_action: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "in_admin_action", default=False
)

FLAGS = {ADDITION: Action.ADMIN_ADD, CHANGE: Action.ADMIN_CHANGE, DELETION: Action.ADMIN_DELETE}


def changed_fields(change_message: str) -> dict:
    """``{"fields": [...], "added": [...], "changed": [...], "deleted": [...]}`` from an admin
    change message (Django's JSON list): the field names changed on the object, and the kinds
    (verbose names) of inline rows added, changed or deleted; never the rows' names. Empty keys
    are left out; a message that is not Django's JSON gives ``{}``."""
    try:
        parts = json.loads(change_message or "[]")
    except ValueError:
        return {}
    result: dict[str, list[str]] = {}
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, dict):
            continue
        for kind, body in part.items():
            body = body if isinstance(body, dict) else {}
            if kind == "changed" and "object" not in body:
                result.setdefault("fields", []).extend(str(f) for f in body.get("fields", []))
            elif kind in ("added", "changed", "deleted") and body.get("name"):
                result.setdefault(kind, []).append(str(body["name"]))
    return result


def org_of(app_label: str, model: str, object_id: str) -> int | None:
    """The organisation a row of the admin concerns, for its owners' log: an organisation
    itself, a membership's or an invitation's organisation; None for anything else."""
    if app_label == "accounts" and model == "organisation":
        return int(object_id) if str(object_id).isdigit() else None
    if not str(object_id).isdigit():
        return None
    if app_label == "accounts" and model == "membership":
        from accounts.models import Membership  # noqa: PLC0415

        return (
            Membership.objects.filter(pk=object_id)
            .values_list("organisation_id", flat=True)
            .first()
        )
    if app_label == "workspaces" and model == "invitation":
        from workspaces.models import Invitation  # noqa: PLC0415

        return (
            Invitation.objects.filter(pk=object_id)
            .values_list("organisation_id", flat=True)
            .first()
        )
    return None


@receiver(post_save, sender=LogEntry, dispatch_uid="audit_admin_log_mirror")
def admin_log_mirror(sender, instance: LogEntry, created: bool, **kwargs) -> None:
    """Record a new LogEntry in the audit log (not while a bulk action runs: see module doc)."""
    if not created or in_admin_action.get() or instance.action_flag not in FLAGS:
        return
    content_type = instance.content_type
    app_label, model = (content_type.app_label, content_type.model) if content_type else ("", "")
    object_id = instance.object_id or ""
    audit_record(
        actor=instance.user_id,
        action=FLAGS[instance.action_flag],
        org=org_of(app_label, model, object_id),
        target_type=f"{app_label}.{model}" if content_type else "unknown",
        target_id=object_id,
        details={"via": "admin", **changed_fields(instance.change_message)},
    )
