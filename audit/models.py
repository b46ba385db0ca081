"""The audit log: one append-only row per administrative action (issue 10).

**What is recorded.** Actions of site administrators (the Django admin: every add, change and
delete it logs, and every bulk action such as revoking API keys or share links) and of
organisation owners and admins (role changes, policy changes, member removals, invitations,
exports, deletions), plus a person's own account export and deletion, their share link and
API key revocations, and every change of a training opt-out (a person's or an organisation's,
with its old and new value, by whoever made it). ``Action`` lists the names;
``audit.services.audit_record`` writes a row.

**Append-only.** Rows are inserted and never changed: ``save()`` of a stored row, ``delete()``
and the queryset's ``update()`` / ``delete()`` raise :class:`AppendOnly`, and on PostgreSQL a
trigger refuses ``UPDATE`` and ``DELETE`` from any client (migration 0002), so raw SQL cannot
either. (``TRUNCATE`` is a table owner's privilege and is not a row operation; a deployment that
wants the log safe from its own application role gives that role INSERT and SELECT only.)

**No personal data, so nothing to anonymise.** A row names its actor, organisation and target by
id only (``actor_id``, ``org_id``, ``target_type`` + ``target_id``), never by username, email or
content, and ``details`` may not carry such fields (the service refuses their keys). The ids are
plain integers, not foreign keys: the log outlives the accounts and organisations it names, and a
deleted account's rows need no update (which the trigger would refuse anyway). Names are looked
up when a page shows the log, so a deleted account shows as "deleted account #42" everywhere,
with nothing left that says who it was.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class AppendOnly(RuntimeError):
    """An attempt to change or delete an audit entry."""


class Action:
    """The actions recorded (``AuditEntry.action``). Admin bulk actions are recorded as
    ``admin.action.<the action's name>`` (e.g. ``admin.action.revoke``)."""

    ORG_CREATE = "org.create"
    ORG_POLICY_CHANGE = "org.policy_change"
    ORG_MODERATION_CHANGE = "org.moderation_change"
    ORG_ROLE_CHANGE = "org.role_change"
    ORG_MEMBER_REMOVE = "org.member_remove"
    ORG_MEMBER_LEAVE = "org.member_leave"
    ORG_INVITATION_CREATE = "org.invitation_create"
    ORG_INVITATION_REVOKE = "org.invitation_revoke"
    ORG_INVITATION_ACCEPT = "org.invitation_accept"
    ORG_EXPORT = "org.export"
    ORG_DELETE = "org.delete"
    ORG_TRAINING_OPT_OUT = "org.training_opt_out"
    SHARE_LINK_CREATE = "share_link.create"
    SHARE_LINK_REVOKE = "share_link.revoke"
    API_KEY_REVOKE = "api_key.revoke"
    ACCOUNT_EXPORT = "account.export"
    ACCOUNT_DELETE = "account.delete"
    ACCOUNT_TRAINING_OPT_OUT = "account.training_opt_out"
    ADMIN_ADD = "admin.add"
    ADMIN_CHANGE = "admin.change"
    ADMIN_DELETE = "admin.delete"
    ADMIN_ACTION_PREFIX = "admin.action."

    LABELS = {
        ORG_CREATE: "created the organisation",
        ORG_POLICY_CHANGE: "changed policies",
        ORG_MODERATION_CHANGE: "changed the moderation policy",
        ORG_ROLE_CHANGE: "changed a member's role",
        ORG_MEMBER_REMOVE: "removed a member",
        ORG_MEMBER_LEAVE: "left the organisation",
        ORG_INVITATION_CREATE: "invited someone",
        ORG_INVITATION_REVOKE: "withdrew an invitation",
        ORG_INVITATION_ACCEPT: "joined by invitation",
        ORG_EXPORT: "exported the organisation's data",
        ORG_DELETE: "deleted the organisation",
        ORG_TRAINING_OPT_OUT: "changed the organisation's training opt-out",
        SHARE_LINK_CREATE: "made a share link",
        SHARE_LINK_REVOKE: "revoked a share link",
        API_KEY_REVOKE: "revoked an API key",
        ACCOUNT_EXPORT: "exported their data",
        ACCOUNT_DELETE: "deleted their account",
        ACCOUNT_TRAINING_OPT_OUT: "changed a training opt-out",
        ADMIN_ADD: "added (admin)",
        ADMIN_CHANGE: "changed (admin)",
        ADMIN_DELETE: "deleted (admin)",
    }

    @classmethod
    def label(cls, action: str) -> str:
        """Words for ``action`` ("changed a member's role"); admin bulk actions by name."""
        if action.startswith(cls.ADMIN_ACTION_PREFIX):
            return f"{action[len(cls.ADMIN_ACTION_PREFIX) :].replace('_', ' ')} (admin action)"
        return cls.LABELS.get(action, action)


class AuditQuerySet(models.QuerySet):
    """Refuses bulk changes: the log is append-only."""

    def update(self, **kwargs):
        raise AppendOnly("Audit entries cannot be changed.")

    def delete(self):
        raise AppendOnly("Audit entries cannot be deleted.")

    def bulk_update(self, objs, fields, batch_size=None):
        raise AppendOnly("Audit entries cannot be changed.")

    def update_or_create(self, defaults=None, create_defaults=None, **kwargs):
        raise AppendOnly("Audit entries cannot be changed; record a new one.")

    def _raw_delete(self, using):
        raise AppendOnly("Audit entries cannot be deleted.")


class AppendOnlyModel(models.Model):
    """Rows that are inserted and never changed or deleted (the audit log's tables)."""

    class Meta:
        abstract = True

    def save(self, *args, **kwargs) -> None:
        """Insert a new entry; raises AppendOnly for one already stored."""
        if not self._state.adding:
            raise AppendOnly("Audit entries cannot be changed.")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnly("Audit entries cannot be deleted.")


class AuditEntry(AppendOnlyModel):
    """One action. ``actor_id``: the user who acted (None: the system, e.g. a scheduled job);
    ``org_id``: the organisation it concerns (None: none; only staff see those rows);
    ``target_type``: ``app_label.model`` of what it acted on, ``target_id`` its primary key;
    ``details``: JSON with ids, roles, policy values, counts; never names, emails or content."""

    id = models.BigAutoField(primary_key=True)
    created_at = models.DateTimeField(default=timezone.now)
    actor_id = models.BigIntegerField(null=True, blank=True)
    action = models.CharField(max_length=100)
    org_id = models.BigIntegerField(null=True, blank=True)
    target_type = models.CharField(max_length=100)
    target_id = models.CharField(max_length=64, blank=True)
    details = models.JSONField(default=dict, blank=True)
    # Set when the entry names a region's data (a conversation, a share link, a turn): its
    # target id and details are then kept in that region's database (AuditDetail), and this
    # row holds only who, what, when and the region (issue 20, "Region-scoped stores").
    region = models.CharField(max_length=32, blank=True, default="")

    objects = AuditQuerySet.as_manager()

    class Meta:
        ordering = ("-id",)
        verbose_name = "audit entry"
        verbose_name_plural = "audit entries"
        indexes = [
            # An organisation's log, newest first (the owner's page: keyset on id).
            models.Index(fields=["org_id", "-id"], name="audit_org_recent"),
            # One person's actions (the admin's search, their data export).
            models.Index(fields=["actor_id", "-id"], name="audit_actor_recent"),
            models.Index(fields=["target_type", "target_id"], name="audit_target"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.action} {self.target_type}:{self.target_id}"

    @property
    def action_label(self) -> str:
        return Action.label(self.action)


class AuditDetail(AppendOnlyModel):
    """The regional half of an :class:`AuditEntry` whose ``region`` is set: its target id and
    details, in that region's database (``settings.CHAT_REGIONAL_MODELS`` routes this model
    like conversation data), so no conversation, turn or share link id of a region is stored
    outside it, the global audit log included. ``entry_id`` is the global entry's id (a plain
    integer: the two rows are in different databases). Append-only like the entry (a trigger
    in migration 0003 as well)."""

    id = models.BigAutoField(primary_key=True)
    entry_id = models.BigIntegerField(unique=True)
    target_id = models.CharField(max_length=64, blank=True)
    details = models.JSONField(default=dict, blank=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        verbose_name = "audit entry's regional detail"

    def __str__(self) -> str:
        return f"detail of audit entry #{self.entry_id}"

