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

**Memory.** The archive is built in a temporary file (``settings.CHAT_PRIVACY_EXPORT_DIR``, else
the system's), never in memory: conversations are read in batches of ``BATCH`` per region
database (keyset on ``(created_at, conversation_id)``), one conversation's turns at a time, files
are copied in 1 MiB blocks, and data.json is written piece by piece to a second temporary file
and copied into the archive at the end (a zip entry must be written whole, and the Markdown and
attachment entries are written meanwhile). The caller streams the file out and closes it, which
deletes it.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import tempfile
import zipfile
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Q
from django.utils import timezone
from django.utils.text import get_valid_filename, slugify

from accounts.models import ApiKey, Membership, Organisation, User, UserSession
from attachments.models import Attachment
from attachments.services import attachment_storage
from audit.selectors import audit_entries_by_actor
from conversations import regions, writeback
from conversations.models import Conversation, Turn
from feedback.models import Feedback
from memory.models import UserMemory
from privacy.markdown import conversation_markdown
from sharing.models import ShareLink
from usage.models import UsageRecord
from workspaces.models import Invitation

logger = logging.getLogger(__name__)

FORMAT, VERSION = "chatsite-export", 1
BATCH = 200  # conversations (and usage records) read per query
COPY_BLOCK = 1 << 20

README = """\
This archive holds {what}, exported from chatsite on {when} (UTC).

data.json        everything, machine-readable ("format": "chatsite-export", "version": 1)
conversations/   each conversation as a Markdown file (the current version of each message
                 and the answer shown; every version is in data.json)
attachments/     the files sent in conversations, as uploaded, by conversation id

Share link tokens, API key secrets and session keys are not included.
"""


@dataclass
class Export:
    """A finished archive: ``file`` is an open temporary file at position 0 (deleted when
    closed), ``filename`` the name to offer, ``size`` its length in bytes."""

    file: IO[bytes]
    filename: str
    size: int


def _json(value: Any, indent: int | None = 2) -> str:
    return json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False, indent=indent)


class JsonStream:
    """Writes one JSON object to a text file a member at a time; arrays item by item, so an
    array of any length never has to be in memory."""

    def __init__(self, out: IO[str]):
        self.out = out
        self.first = True
        out.write("{")

    def _key(self, name: str) -> None:
        self.out.write("\n" if self.first else ",\n")
        self.first = False
        self.out.write(f"  {_json(name)}: ")

    def field(self, name: str, value: Any) -> None:
        self._key(name)
        self.out.write(_json(value).replace("\n", "\n  "))

    def array(self, name: str, items: Iterable[Any]) -> None:
        self._key(name)
        self.out.write("[")
        first = True
        for item in items:
            self.out.write("\n    " if first else ",\n    ")
            first = False
            self.out.write(_json(item).replace("\n", "\n    "))
        self.out.write("]" if first else "\n  ]")

    def close(self) -> None:
        self.out.write("\n}\n")


class ArchiveBuilder:
    """The zip being built in a temporary file, and its data.json in another."""

    def __init__(self):
        folder = settings.CHAT_PRIVACY_EXPORT_DIR or None
        self.file = tempfile.TemporaryFile(dir=folder)
        self.zip = zipfile.ZipFile(self.file, "w", compression=zipfile.ZIP_DEFLATED, allowZip64=True)
        self.json_file = tempfile.TemporaryFile(mode="w+", encoding="utf-8", dir=folder)
        self.data = JsonStream(self.json_file)
        self.names: set[str] = set()

    def unique(self, name: str) -> str:
        """``name``, or ``name`` with ``-2``, ``-3``... before its extension if taken."""
        stem, dot, ext = name.rpartition(".") if "." in name.rpartition("/")[2] else (name, "", "")
        candidate, n = name, 1
        while candidate in self.names:
            n += 1
            candidate = f"{stem}-{n}{dot}{ext}"
        self.names.add(candidate)
        return candidate

    def add_text(self, name: str, text: str) -> str:
        name = self.unique(name)
        self.zip.writestr(name, text.encode("utf-8"))
        return name

    def add_stored_file(self, name: str, storage, storage_name: str) -> str | None:
        """Copy a file from ``storage`` into the archive; None (logged) if it cannot be read."""
        try:
            source = storage.open(storage_name, "rb")
        except OSError:
            logger.warning("export: attachment file %s is missing", storage_name)
            return None
        name = self.unique(name)
        with source, self.zip.open(name, "w", force_zip64=True) as target:
            shutil.copyfileobj(source, target, COPY_BLOCK)
        return name

    def finish(self, *, filename: str, what: str) -> Export:
        """Close data.json, put it and README.txt in the archive, and hand the archive over."""
        self.data.close()
        self.json_file.seek(0)
        with self.zip.open("data.json", "w", force_zip64=True) as target:
            wrapped = io.TextIOWrapper(target, encoding="utf-8", write_through=True)
            shutil.copyfileobj(self.json_file, wrapped, COPY_BLOCK)
            wrapped.detach()
        self.json_file.close()
        self.zip.writestr("README.txt", README.format(what=what, when=timezone.now().strftime("%Y-%m-%d %H:%M")))
        self.zip.close()
        size = self.file.tell()
        self.file.seek(0)
        return Export(file=self.file, filename=filename, size=size)

    def abort(self) -> None:
        for f in (self.json_file, self.file):
            try:
                f.close()
            except Exception:  # noqa: BLE001 - closing a temporary file after a failure
                pass


# --- rows as JSON ---------------------------------------------------------------------------


def turn_json(turn: Turn, *, held: bool = False) -> dict:
    return {
        "turn_id": turn.turn_id, "role": turn.role, "content": turn.content, "status": turn.status,
        "created_at": turn.created_at, "replaces": turn.replaces_id, "reply_to": turn.reply_to_id,
        "token_count": turn.token_count, "prompt_tokens": turn.prompt_tokens,
        "cached_tokens": turn.cached_tokens, "cost_usd": turn.cost_usd, "pool": turn.pool,
        "model_version": turn.model_version, "context_trimmed": turn.context_trimmed,
        "moderation_verdict": turn.moderation_verdict, "training_eligible": turn.training_eligible,
        # Held: an answer still waiting in Redis to be written to the database.
        "held": held,
    }  # fmt: skip


def attachment_json(attachment: Attachment, file: str | None) -> dict:
    return {
        "attachment_id": attachment.attachment_id, "turn_id": attachment.turn_id,
        "name": attachment.name, "kind": attachment.kind, "size": attachment.size,
        "sha256": attachment.sha256, "pages": attachment.pages, "tokens": attachment.tokens,
        "created_at": attachment.created_at, "file": file,
    }  # fmt: skip


def share_link_json(link: ShareLink) -> dict:
    return {
        "link_id": link.link_id, "token_start": f"{link.token[:7]}…", "title": link.title,
        "through_at": link.through_at, "through_turn_id": link.through_turn_id,
        "created_at": link.created_at, "updated_at": link.updated_at, "revoked_at": link.revoked_at,
    }  # fmt: skip


def feedback_json(feedback: Feedback) -> dict:
    return {
        "feedback_id": feedback.feedback_id, "turn_id": feedback.turn_id, "rating": feedback.rating,
        "comment": feedback.comment, "pool": feedback.pool, "model_version": feedback.model_version,
        "created_at": feedback.created_at, "updated_at": feedback.updated_at,
    }  # fmt: skip


# --- conversations --------------------------------------------------------------------------


def conversation_batches(**filters) -> Iterator[tuple[str, list[Conversation]]]:
    """(primary alias, up to BATCH conversations) matching ``filters`` (e.g. ``owner_id=``,
    ``org_id=``), every region's database in turn, each oldest first (keyset on
    ``(created_at, conversation_id)``)."""
    for db in regions.region_dbs():
        query = Conversation.objects.using(db).filter(**filters).order_by("created_at", "conversation_id")
        after = None
        while True:
            page = query
            if after is not None:
                page = page.filter(Q(created_at__gt=after[0]) | Q(created_at=after[0], conversation_id__gt=after[1]))
            batch = list(page[:BATCH])
            if batch:
                yield db, batch
            if len(batch) < BATCH:
                break
            after = (batch[-1].created_at, batch[-1].conversation_id)


def _grouped(rows: Iterable, key: str) -> dict:
    groups: dict = defaultdict(list)
    for row in rows:
        groups[getattr(row, key)].append(row)
    return groups


def conversation_turns(db: str, conversation: Conversation) -> list[tuple[Turn, bool]]:
    """(turn, held) for every turn of ``conversation``: the stored ones from database ``db``
    and answers still held in Redis awaiting write-back, oldest first."""
    stored = list(Turn.objects.using(db).filter(conversation_id=conversation.pk).order_by("created_at", "turn_id"))
    known = {t.turn_id for t in stored}
    held = [t for t in writeback.held_turns(conversation.pk) if t.turn_id not in known]
    pairs = [(t, False) for t in stored] + [(t, True) for t in held]
    pairs.sort(key=lambda pair: (pair[0].created_at, str(pair[0].turn_id)))
    return pairs


def _markdown_name(conversation: Conversation) -> str:
    title = slugify(conversation.title)[:60].strip("-") or "untitled"
    return f"conversations/{conversation.created_at:%Y-%m-%d}-{title}-{str(conversation.pk)[:8]}.md"


def _attachment_name(attachment: Attachment) -> str:
    name = get_valid_filename(attachment.name)[:120] or "file"
    return f"attachments/{attachment.conversation_id}/{attachment.attachment_id}-{name}"


def conversation_items(
    builder: ArchiveBuilder, *, people: dict[int, str] | None = None, orgs: dict[int, str] | None = None, **filters
) -> Iterator[dict]:
    """The JSON of each conversation matching ``filters`` (see :func:`conversation_batches`),
    writing its Markdown file and attachment files into the archive as it goes. ``people``:
    user id -> username, to name each conversation's owner (organisation exports; filled in as
    needed); ``orgs``: organisation id -> slug."""
    storage = attachment_storage()
    orgs = {} if orgs is None else orgs
    for db, batch in conversation_batches(**filters):
        ids = [c.pk for c in batch]
        attachments = _grouped(Attachment.objects.using(db).filter(conversation_id__in=ids).defer("text"), "conversation_id")
        links = _grouped(ShareLink.objects.using(db).filter(conversation_id__in=ids), "conversation_id")
        ratings = _grouped(Feedback.objects.using(db).filter(conversation_id__in=ids), "conversation_id")
        missing_orgs = {c.org_id for c in batch if c.org_id and c.org_id not in orgs}
        orgs.update(Organisation.objects.filter(pk__in=missing_orgs).values_list("pk", "slug"))
        if people is not None:
            missing = {c.owner_id for c in batch if c.owner_id not in people}
            people.update(User.objects.filter(pk__in=missing).values_list("pk", "username"))
        for conversation in batch:
            yield _conversation_item(
                builder, storage, db, conversation,
                attachments=attachments.get(conversation.pk, []), links=links.get(conversation.pk, []),
                ratings=ratings.get(conversation.pk, []), people=people, orgs=orgs,
            )  # fmt: skip


def _conversation_item(builder, storage, db, conversation, *, attachments, links, ratings, people, orgs) -> dict:
    turns = conversation_turns(db, conversation)
    files = {a.attachment_id: builder.add_stored_file(_attachment_name(a), storage, a.storage_name) for a in attachments}
    names_by_turn: dict = defaultdict(list)
    for a in attachments:
        if a.turn_id:
            names_by_turn[a.turn_id].append(a.name)
    owner = people.get(conversation.owner_id, f"deleted account #{conversation.owner_id}") if people is not None else ""
    org = orgs.get(conversation.org_id, "") if conversation.org_id else ""
    markdown = builder.add_text(
        _markdown_name(conversation),
        conversation_markdown(conversation, [t for t, _ in turns], attachment_names=names_by_turn, owner_label=owner, org_label=org),
    )
    item = {
        "conversation_id": conversation.pk, "title": conversation.title, "model": conversation.model,
        "system_prompt": conversation.system_prompt, "region": conversation.region,
        "organisation": org or None, "shared_with_org": conversation.shared_with_org,
        "created_at": conversation.created_at, "last_turn_at": conversation.last_turn_at,
        "summary": conversation.summary, "summary_through": conversation.summary_through,
        "markdown_file": markdown,
        "turns": [turn_json(t, held=held) for t, held in turns],
        "attachments": [attachment_json(a, files[a.attachment_id]) for a in attachments],
        "share_links": [share_link_json(link) for link in links],
        "feedback": [feedback_json(f) for f in ratings],
    }  # fmt: skip
    if people is not None:
        item = {"owner": owner, **item}
    return item


# --- a person's export ----------------------------------------------------------------------


def _usage_items(user: User) -> Iterator[dict]:
    after = 0
    orgs: dict[int, str] = {}
    while True:
        batch = list(UsageRecord.objects.filter(user_id=user.pk, id__gt=after).order_by("id")[:BATCH])
        orgs.update(Organisation.objects.filter(pk__in={r.org_id for r in batch if r.org_id} - set(orgs)).values_list("pk", "slug"))
        for r in batch:
            yield {
                "created_at": r.created_at, "pool": r.pool, "model_version": r.model_version, "tier": r.tier,
                "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
                "completion_tokens": r.completion_tokens, "cost_usd": r.cost_usd, "status": r.status,
                "conversation_id": r.conversation_id, "turn_id": r.turn_id, "organisation": orgs.get(r.org_id),
            }  # fmt: skip
        if len(batch) < BATCH:
            return
        after = batch[-1].id


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
        data.field("account", {
            "id": user.pk, "username": user.username, "email": user.email,
            "first_name": user.first_name, "last_name": user.last_name,
            "email_verified": user.email_is_verified, "date_joined": user.date_joined,
            "last_login": user.last_login,
        })  # fmt: skip
        data.field("settings", {
            "tier": user.tier, "region": user.region, "memory_enabled": user.memory_enabled,
            "feature_flags": user.feature_flags,
        })  # fmt: skip
        data.field("organisations", [
            {"slug": m.organisation.slug, "name": m.organisation.name, "role": m.role, "joined_at": m.joined_at}
            for m in Membership.objects.filter(user=user).select_related("organisation").order_by("joined_at", "pk")
        ])  # fmt: skip
        data.field("api_keys", list(
            ApiKey.objects.filter(user=user).order_by("created_at")
            .values("name", "prefix", "created_at", "last_used_at", "revoked_at")
        ))  # fmt: skip
        data.field("sessions", list(
            UserSession.objects.filter(user=user).order_by("created_at")
            .values("created_at", "last_seen_at", "ip", "user_agent")
        ))  # fmt: skip
        data.array("conversations", conversation_items(builder, owner_id=user.pk))
        data.field("memory", list(
            UserMemory.objects.filter(user=user).order_by("created_at", "fact_id")
            .values("fact_id", "text", "source", "source_conversation_id", "created_at")
        ))  # fmt: skip
        data.array("usage", _usage_items(user))
        data.array("audit", (
            {"created_at": e.created_at, "action": e.action, "target_type": e.target_type,
             "target_id": e.target_id, "details": e.details}
            for e in audit_entries_by_actor(user_id=user.pk)
        ))  # fmt: skip
        stamp = timezone.now().strftime("%Y%m%d-%H%M")
        name = slugify(user.username)[:40] or f"user-{user.pk}"
        return builder.finish(filename=f"chatsite-data-{name}-{stamp}.zip", what=f"the data of account {user.username}")
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
        data.field("organisation", {
            "id": org.pk, "name": org.name, "slug": org.slug, "tier": org.tier, "region": org.region,
            "created_at": org.created_at,
        })  # fmt: skip
        data.field("policies", {
            "retention_days": org.retention_days, "zero_retention": org.zero_retention,
            "pinned_pool": org.pinned_pool, "not_for_training": org.not_for_training,
            "rate_limit_rpm": org.rate_limit_rpm, "rate_limit_tpm": org.rate_limit_tpm,
            "moderation_thresholds": org.moderation_thresholds, "blocked_terms": org.blocked_terms,
            "moderation_fail_open": org.moderation_fail_open,
        })  # fmt: skip
        members = list(Membership.objects.filter(organisation=org).select_related("user").order_by("joined_at", "pk"))
        data.field("members", [
            {"user_id": m.user_id, "username": m.user.username, "email": m.user.email, "role": m.role,
             "joined_at": m.joined_at}
            for m in members
        ])  # fmt: skip
        data.field("invitations", [
            {"id": i.pk, "email": i.email, "role": i.role, "state": _invitation_state(i, now),
             "created_at": i.created_at, "expires_at": i.expires_at, "accepted_at": i.accepted_at,
             "revoked_at": i.revoked_at}
            for i in Invitation.objects.filter(organisation=org).order_by("created_at", "pk")
        ])  # fmt: skip
        people = {m.user_id: m.user.username for m in members}
        data.array("conversations", conversation_items(builder, people=people, orgs={org.pk: org.slug}, org_id=org.pk))
        stamp = now.strftime("%Y%m%d-%H%M")
        return builder.finish(filename=f"chatsite-org-{org.slug}-{stamp}.zip", what=f"the data of organisation {org.name}")
    except BaseException:
        builder.abort()
        raise
