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


# (app_label, model_name) -> the model class of rows that belong to one organisation, with the
# name of the field holding its id. Filled by the apps that own those models (org_rows_register in
# their AppConfig.ready()), so this app, which every other records into, imports none of them.
_ORG_ROWS: dict[tuple[str, str], tuple[type, str]] = {}


def org_rows_register(model: type, *, field: str = "organisation_id") -> None:
    """Say that each row of ``model`` (a Django model class) belongs to the organisation whose
    id its ``field`` holds, so the admin's changes to such rows reach that organisation's
    owners' log (:func:`org_of`). Called from the owning app's ``AppConfig.ready()``."""
    _ORG_ROWS[(model._meta.app_label, model._meta.model_name)] = (model, field)


def org_of(app_label: str, model: str, object_id: str) -> int | None:
    """The organisation a row of the admin concerns, for its owners' log: an organisation
    itself, or a row of a model registered with :func:`org_rows_register` (a membership, an
    invitation); None for anything else. One query for a registered model's row."""
    if app_label == "accounts" and model == "organisation":
        return int(object_id) if str(object_id).isdigit() else None
    if not str(object_id).isdigit() or (app_label, model) not in _ORG_ROWS:
        return None
    row_model, field = _ORG_ROWS[(app_label, model)]
    return row_model._default_manager.filter(pk=object_id).values_list(field, flat=True).first()


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
