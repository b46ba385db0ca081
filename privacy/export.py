"""Data exports (issue 10): a person's account, or an organisation's workspace, as a .zip.

What is in the archive:

- ``data.json``: everything, machine-readable (the shapes below; ``"format": "chatsite-export"``,
  ``"version": 1``). A person's: account, settings, organisations, API keys (names and prefixes,
  never the hash), signed-in sessions, every conversation (all turns, every version, with usage
  and moderation verdicts, attachments, share links, ratings), memory facts, usage records and
  the audited actions they took. An organisation's: the organisation, its policies, members and
  invitations, and every conversation that belongs to it (whoever owns it), as above.
- ``conversations/<date>-<title>-<id>.md``: each conversation as Markdown (privacy/markdown.py).
- ``attachments/<conversation id>/<attachment id>-<name>``: the files as they were uploaded.
- ``README.txt``: this list, for the person who opens it.

Share link tokens are left out (only their first characters): a token is a working credential
and an export is a file people copy around; API key hashes and session keys likewise.

**Memory.** The archive is built in a temporary file (privacy/archive.py;
``settings.CHAT_PRIVACY_EXPORT_DIR``, else the system's), never in memory: conversations are
read in batches of ``BATCH`` per region database (keyset on ``(created_at, conversation_id)``),
one conversation's turns at a time, files are copied in 1 MiB blocks, and data.json is written
piece by piece to a second temporary file and copied into the archive at the end. The caller
streams the file out and closes it, which deletes it.

This module builds the two archives; the sections they hold (conversations, usage records) and
their JSON shapes are read by privacy/export_sections.py, ``BATCH`` included.
"""

from __future__ import annotations

from django.utils import timezone
from django.utils.text import slugify

from accounts.models import ApiKey, Membership, Organisation, User, UserSession
from audit.selectors import audit_entries_by_actor
from core import regions
from memory.models import UserMemory
from privacy.archive import ArchiveBuilder, Export
from privacy.export_sections import conversation_items, usage_items
from projects.export import project_items
from workspaces.models import Invitation

FORMAT, VERSION = "chatsite-export", 1


# --- a person's export ----------------------------------------------------------------------


def user_export_build(*, user: User) -> Export:
    """Build ``user``'s archive (module docstring): only their own rows, from every region's
    database. Returns an :class:`Export` the caller must close. Raises whatever reading a
    database raises (the temporary files are removed first)."""
    builder = ArchiveBuilder()
    try:
        data = builder.data
        data.field("format", FORMAT)
        data.field("version", VERSION)
        data.field("kind", "account")
        data.field("exported_at", timezone.now())
        data.field(
            "account",
            {
                "id": user.pk,
                "username": user.username,
                "email": user.email,
                "first_name": user.first_name,
                "last_name": user.last_name,
                "email_verified": user.email_is_verified,
                "date_joined": user.date_joined,
                "last_login": user.last_login,
            },
        )
        data.field(
            "settings",
            {
                "tier": user.tier,
                "region": user.region,
                "memory_enabled": user.memory_enabled,
                "training_opt_out": user.training_opt_out,
                "feature_flags": user.feature_flags,
            },
        )
        data.field(
            "organisations",
            [
                {
                    "slug": m.organisation.slug,
                    "name": m.organisation.name,
                    "role": m.role,
                    "joined_at": m.joined_at,
                }
                for m in Membership.objects.filter(user=user)
                .select_related("organisation")
                .order_by("joined_at", "pk")
            ],
        )
        data.field(
            "api_keys",
            list(
                ApiKey.objects.filter(user=user)
                .order_by("created_at")
                .values("name", "prefix", "created_at", "last_used_at", "revoked_at")
            ),
        )
        data.field(
            "sessions",
            list(
                UserSession.objects.filter(user=user)
                .order_by("created_at")
                .values("created_at", "last_seen_at", "ip", "user_agent")
            ),
        )
        data.array("conversations", conversation_items(builder, owner_id=user.pk))
        data.array("projects", project_items(user_id=user.pk))
        data.field(
            "memory",
            [  # in every region's database: the user's home region may have changed
                fact
                for db in regions.region_dbs()
                for fact in UserMemory.objects.using(db)
                .filter(user=user)
                .order_by("created_at", "fact_id")
                .values("fact_id", "text", "source", "source_conversation_id", "created_at")
            ],
        )
        data.array("usage", usage_items(user))
        data.array(
            "audit",
            (
                {
                    "created_at": e.created_at,
                    "action": e.action,
                    "target_type": e.target_type,
                    "target_id": e.target_id,
                    "details": e.details,
                }
                for e in audit_entries_by_actor(user_id=user.pk)
            ),
        )
        stamp = timezone.now().strftime("%Y%m%d-%H%M")
        name = slugify(user.username)[:40] or f"user-{user.pk}"
        return builder.finish(
            filename=f"chatsite-data-{name}-{stamp}.zip",
            what=f"the data of account {user.username}",
        )
    except BaseException:
        builder.abort()
        raise


# --- an organisation's export ---------------------------------------------------------------


def _invitation_state(invitation: Invitation, now) -> str:
    if invitation.accepted_at is not None:
        return "accepted"
    if invitation.revoked_at is not None:
        return "withdrawn"
    return "expired" if invitation.expires_at <= now else "pending"


def org_export_build(*, org: Organisation) -> Export:
    """Build organisation ``org``'s archive (module docstring): its policies, members,
    invitations and the conversations that belong to it, from every region's database. The
    caller has checked that the person asking is one of its owners. Returns an
    :class:`Export` the caller must close."""
    builder = ArchiveBuilder()
    try:
        data = builder.data
        now = timezone.now()
        data.field("format", FORMAT)
        data.field("version", VERSION)
        data.field("kind", "organisation")
        data.field("exported_at", now)
        data.field(
            "organisation",
            {
                "id": org.pk,
                "name": org.name,
                "slug": org.slug,
                "tier": org.tier,
                "region": org.region,
                "created_at": org.created_at,
            },
        )
        data.field(
            "policies",
            {
                "retention_days": org.retention_days,
                "zero_retention": org.zero_retention,
                "pinned_pool": org.pinned_pool,
                "not_for_training": org.not_for_training,
                "share_prefix_cache": org.share_prefix_cache,
                "rate_limit_rpm": org.rate_limit_rpm,
                "rate_limit_tpm": org.rate_limit_tpm,
                "moderation_thresholds": org.moderation_thresholds,
                "blocked_terms": org.blocked_terms,
                "moderation_fail_open": org.moderation_fail_open,
            },
        )
        members = list(
            Membership.objects.filter(organisation=org)
            .select_related("user")
            .order_by("joined_at", "pk")
        )
        data.field(
            "members",
            [
                {
                    "user_id": m.user_id,
                    "username": m.user.username,
                    "email": m.user.email,
                    "role": m.role,
                    "joined_at": m.joined_at,
                }
                for m in members
            ],
        )
        data.field(
            "invitations",
            [
                {
                    "id": i.pk,
                    "email": i.email,
                    "role": i.role,
                    "state": _invitation_state(i, now),
                    "created_at": i.created_at,
                    "expires_at": i.expires_at,
                    "accepted_at": i.accepted_at,
                    "revoked_at": i.revoked_at,
                }
                for i in Invitation.objects.filter(organisation=org).order_by("created_at", "pk")
            ],
        )
        people = {m.user_id: m.user.username for m in members}
        data.array(
            "conversations",
            conversation_items(builder, people=people, orgs={org.pk: org.slug}, org_id=org.pk),
        )
        stamp = now.strftime("%Y%m%d-%H%M")
        return builder.finish(
            filename=f"chatsite-org-{org.slug}-{stamp}.zip",
            what=f"the data of organisation {org.name}",
        )
    except BaseException:
        builder.abort()
        raise
