"""Deleting an account or an organisation in every region's database (issue 10).

**An account** (:func:`account_delete`). Removed: the person's conversations with their turns,
attachments (rows, and files in storage once the deletion commits), share links and ratings, in
every region's database, and their copies in Redis (hot cache, answers awaiting write-back,
turn event logs), through the one deletion service (conversations/deletion.py), which also
stops an answer still being written in one, in whichever server process; their memory
facts, API keys, sessions (ended in the session store too), memberships and the account
itself. Kept, anonymised, because billing must still add up: the usage ledger's rows
(``usage.UsageRecord``) lose their user (NULL) and conversation id; their tokens, cost, pool,
tier, organisation and day stay, so every total still sums the same and no row says whose it
was. The audit log keeps the account's id only (audit/models.py: it never holds names). The
Django admin's own log loses the names of the person's rows (``object_repr``), and invitations
the person accepted lose the address they were sent to.

Who may: the person themself (``/settings/delete-account/``, with their password), or staff
(``manage.py account_delete``). Not while they are the last owner of an organisation: they
make another member an owner or delete the organisation first (:class:`DeletionBlocked`).

**Steps.** No transaction spans the default database and the regions', so the work is in steps,
each one transaction (per database), each safe to run again:

1. *close* (default database): check the blockers under a lock on the organisations, note the
   deletion (``privacy.AccountDeletion``), leave every organisation, revoke the API keys, make
   the account unusable (inactive, no password) and end every session. From here the person is
   signed out everywhere and nothing new can be written for them.
2. *regional sweep*: each region's data: the projects the person owns, with every chat in them
   (other members' too: projects/services.py ``projects_sweep``) and their files, then the
   conversations in batches of 1,000.
3. *forget* (default database): anonymise the ledger, scrub the admin log, record the deletion
   in the audit log, delete the account (its memory, keys and sessions go with it) and the note.
4. a second regional sweep, for anything a request that was already past authentication wrote
   while steps 2-3 ran.

If a step fails the account stays closed and noted; ``manage.py account_deletions_finish``
completes every noted deletion.

**An organisation** (:func:`organisation_delete`, its owners): its projects and conversations
(whoever owns them) in every region as above, its invitations and memberships and the organisation itself;
usage rows keep their user and lose the organisation. Recorded in the audit log.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts.models import ApiKey, Membership, Organisation, User, UserSession
from accounts.services import user_sessions_end
from attachments.models import Attachment
from audit.models import Action
from audit.services import audit_record
from conversations.models import Conversation
from conversations.services import conversations_delete
from core import regions
from feedback.models import Feedback
from memory.models import ExtractionMarker, MemoryBlock, UserMemory
from privacy.models import AccountDeletion
from privacy.selectors import last_owner_orgs
from projects.services import projects_sweep
from sharing.models import ShareLink
from usage.models import UsageRecord
from usage.selectors import ledger_dbs
from workspaces.models import Invitation

logger = logging.getLogger(__name__)

BATCH = 1000  # conversations per regional delete, ids per admin-log update


class DeletionBlocked(ValidationError):
    """The account is the last owner of ``orgs``; the message says what to do."""

    def __init__(self, orgs: list[Organisation]):
        names = ", ".join(org.name for org in orgs)
        super().__init__(
            f"You are the only owner of {names}. Before deleting your account, make another "
            f"member an owner (on the organisation's Members page) or delete the organisation.",
            code="last_owner",
        )
        self.orgs = orgs


@dataclass
class Swept:
    """What a regional sweep removed: counts per kind, and the conversation and attachment ids
    (to scrub their names from the admin log)."""

    counts: Counter = field(default_factory=Counter)
    conversation_ids: list = field(default_factory=list)
    attachment_ids: list = field(default_factory=list)


def _batches(items: list, size: int = BATCH) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def conversations_sweep(
    *, swept: Swept, owner_id: int | None = None, org_id: int | None = None
) -> Swept:
    """Delete, in every region's database, the conversations of ``owner_id`` (or of
    organisation ``org_id``) through the deletion service (conversations/deletion.py: their
    turns, attachments, share links and ratings, their Redis copies and attachment files once
    each batch commits; an answer still written in one is stopped). With ``owner_id``, also the
    person's share links and ratings on conversations that are not theirs. Adds what it removed
    to ``swept`` and returns it. Each batch is its own transaction on its database."""
    filters = {"owner_id": owner_id} if owner_id is not None else {"org_id": org_id}
    for db in regions.region_dbs():
        ids = list(Conversation.objects.using(db).filter(**filters).values_list("pk", flat=True))
        for batch in _batches(ids):
            deleted = conversations_delete(
                conversations=Conversation.objects.using(db).filter(pk__in=batch)
            )
            swept.attachment_ids += deleted.attachment_ids
            swept.counts.update(deleted.counts)
            swept.conversation_ids += deleted.conversation_ids
        if owner_id is not None:
            with transaction.atomic(using=db):
                swept.counts["sharelink"] += (
                    ShareLink.objects.using(db).filter(created_by_id=owner_id).delete()[0]
                )
                swept.counts["feedback"] += (
                    Feedback.objects.using(db).filter(user_id=owner_id).delete()[0]
                )
    return swept


def _memory_forget(*, user_id: int) -> list:
    """Delete user ``user_id``'s memory facts, block and extraction markers in every region's
    database (they live in the user's home region's, which may have changed; deleting the user
    in ``default`` cascades there only). Returns the deleted facts' ids."""
    fact_ids: list = []
    for db in regions.region_dbs():
        with transaction.atomic(using=db):
            facts = UserMemory.objects.using(db).filter(user_id=user_id)
            fact_ids += list(facts.values_list("pk", flat=True))
            facts.delete()
            MemoryBlock.objects.using(db).filter(user_id=user_id).delete()
            ExtractionMarker.objects.using(db).filter(user_id=user_id).delete()
    return fact_ids


def _admin_log_scrub(*, model, ids: list, label: str) -> None:
    """Replace the names (``object_repr``) of the admin log's entries about rows ``ids`` of
    ``model`` with ``label``: a row's name can be a title or a username."""
    content_type = ContentType.objects.get_for_model(model, for_concrete_model=False)
    for batch in _batches([str(i) for i in ids]):
        LogEntry.objects.filter(content_type=content_type, object_id__in=batch).update(
            object_repr=label
        )


# --- accounts -------------------------------------------------------------------------------


@transaction.atomic
def account_close(*, user: User, requested_by: User | None = None) -> None:
    """Step 1 (module docstring). Raises DeletionBlocked while ``user`` is the last owner of
    an organisation. ``requested_by``: the staff member asking, None for the person."""
    locked = User.objects.select_for_update().get(pk=user.pk)
    blockers = last_owner_orgs(user=locked, lock=True)
    if blockers:
        raise DeletionBlocked(blockers)
    AccountDeletion.objects.get_or_create(
        user_id=locked.pk, defaults={"requested_by_id": getattr(requested_by, "pk", None)}
    )
    memberships = list(Membership.objects.filter(user=locked))
    for membership in memberships:
        audit_record(
            actor=locked,
            action=Action.ORG_MEMBER_LEAVE,
            org=membership.organisation_id,
            target_type="accounts.user",
            target_id=locked.pk,
            details={"role": membership.role, "reason": "account_deleted"},
        )
    _admin_log_scrub(
        model=Membership, ids=[m.pk for m in memberships], label="membership of a deleted account"
    )
    Membership.objects.filter(pk__in=[m.pk for m in memberships]).delete()
    ApiKey.objects.filter(user=locked, revoked_at__isnull=True).update(revoked_at=timezone.now())
    locked.is_active = False
    locked.set_unusable_password()
    locked.save(update_fields=["is_active", "password"])
    user_sessions_end(user=locked)


@transaction.atomic
def account_forget(*, user_id: int, swept: Swept) -> dict:
    """Step 3 (module docstring) for closed account ``user_id``; returns the counts recorded
    in the audit log. Does nothing (returns {}) if the account is already gone."""
    user = User.objects.select_for_update().filter(pk=user_id).first()
    if user is None:
        AccountDeletion.objects.filter(user_id=user_id).delete()
        return {}
    note = AccountDeletion.objects.filter(user_id=user_id).first()
    counts = {
        "conversations": swept.counts["conversation"],
        "turns": swept.counts["turn"],
        "attachments": swept.counts["attachment"],
        "share_links": swept.counts["sharelink"],
        "feedback": swept.counts["feedback"],
        "memory_facts": sum(
            UserMemory.objects.using(db).filter(user_id=user_id).count()
            for db in regions.region_dbs()
        ),
        "api_keys": ApiKey.objects.filter(user_id=user_id).count(),
        "usage_records_anonymised": sum(  # in default and in every region's database
            UsageRecord.objects.using(db)
            .filter(user_id=user_id)
            .update(user=None, conversation_id=None)
            for db in ledger_dbs()
        ),
    }
    label = f"deleted account #{user_id}"
    _admin_log_scrub(model=User, ids=[user_id], label=label)
    _admin_log_scrub(
        model=Conversation, ids=swept.conversation_ids, label=f"conversation of {label}"
    )
    _admin_log_scrub(model=Attachment, ids=swept.attachment_ids, label=f"file of {label}")
    for model in (ApiKey, UserSession):
        ids = list(model.objects.filter(user_id=user_id).values_list("pk", flat=True))
        _admin_log_scrub(model=model, ids=ids, label=f"{model._meta.verbose_name} of {label}")
    memory_ids = _memory_forget(user_id=user_id)
    _admin_log_scrub(model=UserMemory, ids=memory_ids, label=f"user memory of {label}")
    Invitation.objects.filter(accepted_by_id=user_id).exclude(email="").update(email="")
    requested_by = note.requested_by_id if note else None
    audit_record(
        actor=requested_by or user_id,
        action=Action.ACCOUNT_DELETE,
        target_type="accounts.user",
        target_id=user_id,
        details={**counts, "by": "staff" if requested_by else "self"},
    )
    user.delete()
    AccountDeletion.objects.filter(user_id=user_id).delete()
    return counts


def account_deletion_run(*, user_id: int) -> dict:
    """Steps 2-4 (module docstring) for an account closed by :func:`account_close`; returns
    the counts recorded (empty if the account was already gone)."""
    projects = projects_sweep(owner_id=user_id)  # with every chat in them (members' too)
    swept = conversations_sweep(swept=Swept(), owner_id=user_id)
    swept.counts.update({k: v for k, v in projects.items() if k != "project"})
    counts = account_forget(user_id=user_id, swept=swept)
    counts["projects"] = projects["project"]
    late = conversations_sweep(swept=Swept(), owner_id=user_id)
    if late.conversation_ids:
        logger.warning(
            "account deletion #%s: removed %d conversation(s) written meanwhile",
            user_id,
            len(late.conversation_ids),
        )
    return counts


def account_delete(*, user: User, requested_by: User | None = None) -> dict:
    """Delete ``user``'s account and data everywhere (module docstring); returns the counts of
    what went (``conversations``, ``turns``, ``attachments``, ``share_links``, ``feedback``,
    ``memory_facts``, ``api_keys``, ``usage_records_anonymised``). The caller signs the
    request's session out (the session itself is already ended in the store). Raises
    DeletionBlocked (nothing changed) while they are the last owner of an organisation; any
    other failure leaves the account closed and noted, for :func:`account_deletions_finish`."""
    account_close(user=user, requested_by=requested_by)
    return account_deletion_run(user_id=user.pk)


def account_deletions_finish() -> int:
    """Complete every deletion that was asked for and not finished (``AccountDeletion``
    rows); returns how many were completed. ``manage.py account_deletions_finish``."""
    done = 0
    for user_id in AccountDeletion.objects.order_by("requested_at").values_list(
        "user_id", flat=True
    ):
        try:
            account_deletion_run(user_id=user_id)
            done += 1
        except Exception:
            logger.exception("account deletion #%s failed again; it stays noted", user_id)
    return done


# --- organisations --------------------------------------------------------------------------


def organisation_delete(*, org: Organisation, actor: User) -> dict:
    """Delete organisation ``org`` (module docstring) on behalf of ``actor``, one of its owners
    (the caller checks, e.g. with ``workspaces.selectors.seat_get_owning``). Returns the counts
    recorded in the audit log (``conversations``, ``turns``, ``attachments``, ``share_links``,
    ``feedback``, ``members``, ``invitations``, ``projects``)."""
    projects = projects_sweep(org_id=org.pk)
    swept = conversations_sweep(swept=Swept(), org_id=org.pk)
    swept.counts.update({k: v for k, v in projects.items() if k != "project"})
    with transaction.atomic():
        locked = Organisation.objects.select_for_update().filter(pk=org.pk).first()
        if locked is None:
            return {}
        counts = {
            "conversations": swept.counts["conversation"],
            "turns": swept.counts["turn"],
            "attachments": swept.counts["attachment"],
            "share_links": swept.counts["sharelink"],
            "feedback": swept.counts["feedback"],
            "members": Membership.objects.filter(organisation=locked).count(),
            "invitations": Invitation.objects.filter(organisation=locked).count(),
            "projects": projects["project"],
        }
        _admin_log_scrub(
            model=Conversation,
            ids=swept.conversation_ids,
            label="conversation of a deleted organisation",
        )
        audit_record(
            actor=actor,
            action=Action.ORG_DELETE,
            org=locked.pk,
            target_type="accounts.organisation",
            target_id=locked.pk,
            details=counts,
        )
        locked.delete()
    late = conversations_sweep(swept=Swept(), org_id=org.pk)
    if late.conversation_ids:
        logger.warning(
            "organisation deletion #%s: removed %d conversation(s) written meanwhile",
            org.pk,
            len(late.conversation_ids),
        )
    return counts
