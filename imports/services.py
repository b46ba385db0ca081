"""Writing imported chats (issue 30, part 3): a file read by imports/formats.py becomes the
owner's conversations, with their branches, the branch shown, titles, times and models.

- **All or nothing.** The whole file is read and checked before anything is written, then every
  new conversation is written in one transaction on the owner's home-region database; a
  malformed or oversized file imports nothing.
- **Twice is once.** Ids are derived from the owner, the source and the source's own ids
  (SHA-256), so the same file imported again finds its conversations already there and skips
  them; nothing is duplicated, and nothing already stored is touched.
- **The input gate's checks.** Each imported message of the user goes through the input
  moderation check under the owner's policy, as a sent message does; one it flags is stored
  ``blocked`` with its verdict, as a refused message is, so it never reaches the model in a later
  prompt; so does each tool result (``tool`` turns of this service's own export), as results sent
  on /v1 do. Answers are stored as the model wrote them (the output gate judged them where they were
  written). NUL characters are dropped (PostgreSQL text cannot hold them).
- **Limits** (settings): ``CHAT_IMPORT_MAX_BYTES`` per file, ``CHAT_IMPORT_MAX_CONVERSATIONS``
  and ``CHAT_IMPORT_MAX_MESSAGES`` per file, ``CHAT_IMPORT_MAX_MESSAGE_CHARS`` per message.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from dataclasses import dataclass, field
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from accounts.models import User
from accounts.selectors import turn_training_eligible
from conversations.models import Conversation, Turn
from conversations.services import choice_key, model_check
from core import regions
from imports.chat import ASSISTANT, Chat, ImportFormatError
from imports.formats import chats_read
from moderation.base import moderator
from moderation.verdicts import policy_for

logger = logging.getLogger(__name__)


class ImportRefused(ValueError):
    """The file cannot be imported (too large, not JSON, malformed, over a limit): ``status``
    (413 for size, 400 otherwise) and a message naming the problem. Nothing was written."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class ImportResult:
    """What an import did: ``created`` (ids of the new conversations, in the file's order),
    ``already`` (how many were there from an earlier import), ``messages`` (messages stored),
    ``blocked`` (of them, stopped by the input check), ``skipped`` (messages the formats leave
    out: answers before any question), ``stand_ins`` (calling answers put in for tool results
    whose own the file lacks: imports/own_format.py ``stand_in_calls``; counted in ``messages``),
    ``added_calls`` (calls put in a calling answer for results it did not list:
    ``unlisted_calls_add``), ``repeated`` (conversations the file lists again after their
    first time, imported once)."""

    created: list[UUID] = field(default_factory=list)
    already: int = 0
    messages: int = 0
    blocked: int = 0
    skipped: int = 0
    stand_ins: int = 0
    added_calls: int = 0
    repeated: int = 0


def _uuid(*parts: object) -> UUID:
    """A version-8 UUID from SHA-256 of ``parts`` (the same parts, the same id)."""
    text = "\x1f".join(map(str, parts)).encode("utf-8", "surrogatepass")  # ids may hold any JSON text
    raw = bytearray(hashlib.sha256(text).digest()[:16])
    raw[6] = 0x80 | (raw[6] & 0x0F)
    raw[8] = (raw[8] & 0x3F) | 0x80
    return UUID(bytes=bytes(raw))


def _conversation_id(owner: User, chat: Chat, region: str) -> UUID:
    """The imported conversation's id: derived like :func:`_uuid`, with ``region``'s tag where
    core/regions.py ``new_conversation_id`` puts it (so the id still names its
    region)."""
    raw = bytearray(_uuid("conversation", owner.pk, chat.source, chat.source_id).bytes)
    tag = regions.region_tag(region)
    raw[6] = 0x80 | (tag >> 8)
    raw[7] = tag & 0xFF
    return UUID(bytes=bytes(raw))


def file_read(data: bytes) -> list[Chat]:
    """The chats of an uploaded file's bytes. Raises ImportRefused: 413 over
    ``CHAT_IMPORT_MAX_BYTES``; 400 for text that is not UTF-8 JSON, a format this service does
    not read (imports/formats.py, naming the part), or more conversations or messages than the
    limits allow."""
    limit = settings.CHAT_IMPORT_MAX_BYTES
    if len(data) > limit:
        raise ImportRefused(f"The file is {len(data):,} bytes; at most {limit:,} can be imported at once.", 413)
    try:
        parsed = json.loads(data.decode("utf-8-sig"))
    except ValueError as exc:
        if "integer string conversion" in str(exc):  # Python's guard against huge int parsing
            raise ImportRefused(
                f"The file holds a number of more than {sys.get_int_max_str_digits():,} digits, which no chat "
                "export has; it may be damaged."
            ) from None
        raise ImportRefused(f"The file is not JSON: {exc}") from None
    except RecursionError:  # json's decoder recurses once per level of nesting
        raise ImportRefused("The file's JSON is nested too deeply to be a chat export.") from None
    try:
        chats = chats_read(parsed)
    except ImportFormatError as exc:
        raise ImportRefused(str(exc)) from None
    if len(chats) > settings.CHAT_IMPORT_MAX_CONVERSATIONS:
        raise ImportRefused(
            f"The file holds {len(chats):,} conversations; at most {settings.CHAT_IMPORT_MAX_CONVERSATIONS:,} "
            "can be imported at once."
        )
    total = sum(len(c.messages) for c in chats)
    if total > settings.CHAT_IMPORT_MAX_MESSAGES:
        raise ImportRefused(
            f"The file holds {total:,} messages; at most {settings.CHAT_IMPORT_MAX_MESSAGES:,} can be imported at once."
        )
    most = settings.CHAT_IMPORT_MAX_MESSAGE_CHARS
    for index, chat in enumerate(chats):
        for message in chat.messages:
            if len(message.content) > most:
                raise ImportRefused(
                    f"Conversation {index + 1} ('{chat.title[:60]}') has a message of {len(message.content):,} "
                    f"characters; at most {most:,} per message."
                )
    return chats


def chats_import(*, owner: User, chats: list[Chat]) -> ImportResult:
    """Store ``chats`` (from :func:`file_read`) as ``owner``'s personal conversations in their
    home region (module docstring). Returns what was done. A database error propagates (nothing was
    written: one transaction)."""
    region, _ = regions.home_region(owner=owner, org=None)
    region = regions.region_for_new_conversation(region, org=None)
    db = regions.db_for_region(region)
    ids = {id(chat): _conversation_id(owner, chat, region) for chat in chats}
    existing = set(
        Conversation.objects.using(db).filter(pk__in=list(ids.values())).values_list("pk", flat=True)
    )
    result = ImportResult()
    policy = policy_for(None)
    check = moderator()
    eligible = turn_training_eligible(owner_id=owner.pk, org_id=None, owner=owner)
    rows: list[tuple[Conversation, list[Turn]]] = []
    seen: set[UUID] = set()  # created by this file
    for chat in chats:
        conversation_id = ids[id(chat)]
        if conversation_id in existing:
            result.already += 1
            continue
        if conversation_id in seen:  # a file listing one conversation twice
            result.repeated += 1
            continue
        seen.add(conversation_id)
        conversation, turns, blocked = _rows(owner, chat, conversation_id, region, check, policy, eligible)
        rows.append((conversation, turns))
        result.created.append(conversation_id)
        result.messages += len(turns)
        result.blocked += blocked
        result.skipped += chat.skipped
        result.stand_ins += chat.stand_ins
        result.added_calls += chat.added_calls
    with transaction.atomic(using=db):
        for conversation, turns in rows:
            conversation.save(using=db, force_insert=True)
            Turn.objects.using(db).bulk_create(turns, batch_size=500)
    logger.info(
        "import for user %s: %d conversations created, %d already there, %d messages (%d blocked)",
        owner.pk, len(result.created), result.already, result.messages, result.blocked,
    )  # fmt: skip
    return result


def _rows(owner, chat: Chat, conversation_id: UUID, region: str, check, policy, eligible: bool):
    """(the Conversation row, its Turn rows, how many user messages the input check flagged)
    for one chat, not saved."""
    turn_ids = {m.key: _uuid("turn", owner.pk, chat.source, chat.source_id, m.key) for m in chat.messages}
    turns: list[Turn] = []
    blocked = 0
    for message in chat.messages:
        verdict, status = {}, message.status
        if message.role != ASSISTANT and status != Turn.Status.BLOCKED:
            judged = check.check_input(message.content, policy)
            if judged.flagged:
                verdict, status = judged.as_json(), Turn.Status.BLOCKED
                blocked += 1
        turns.append(
            Turn(
                turn_id=turn_ids[message.key], conversation_id=conversation_id, role=message.role,
                content=message.content, created_at=message.created_at, status=status,
                moderation_verdict=verdict,
                parent_id=turn_ids.get(message.parent) if message.parent else None,
                reply_to_id=turn_ids.get(message.reply_to) if message.reply_to else None,
                replaces_id=turn_ids.get(message.replaces) if message.replaces else None,
                continues_id=turn_ids.get(message.continues) if message.continues else None,
                tool_calls=message.tool_calls, tool_call_id=message.tool_call_id,
                model_version=message.model[:100] if message.role == ASSISTANT else "",
                finish_reason=_finish_reason(message, status),
                training_eligible=eligible,
            )
        )  # fmt: skip
    times = [t.created_at for t in turns]
    conversation = Conversation(
        conversation_id=conversation_id, owner=owner, org=None, region=region,
        title=(chat.title or "Imported conversation")[:200],
        model=_model(chat.model), system_prompt=chat.system_prompt,
        created_at=min([chat.created_at, *times]), last_turn_at=max([chat.updated_at, *times]),
        branch_choices=_branch_choices(chat, turn_ids),
        answer_choices={
            str(turn_ids[q]): str(turn_ids[a]) for q, a in chat.answer_choices.items() if q in turn_ids and a in turn_ids
        },
    )  # fmt: skip
    return conversation, turns, blocked


def _finish_reason(message, status: str) -> str:
    """An imported answer's finish_reason: the source's (this service's export: ``length``,
    ``tool_calls`` ...) while the answer stands as it was, else ``stop`` for a complete answer;
    "" for other turns."""
    if message.role != ASSISTANT:
        return ""
    if message.finish_reason and status == message.status:
        return message.finish_reason
    return "stop" if status == Turn.Status.COMPLETE else ""


def _model(name: str) -> str:
    """The conversation's model: the source's when it names a pool or model served here (this
    service's own export), else the served model (the tier's default pool). Each answer keeps
    the model that wrote it in ``model_version``."""
    try:
        model_check(name)
    except ValidationError:
        return settings.CHAT_MODEL_NAME
    return name or settings.CHAT_MODEL_NAME


def _branch_choices(chat: Chat, turn_ids: dict[str, UUID]) -> dict[str, str]:
    """Conversation.branch_choices that show the source's current branch: at each fork above the
    current message, the child on its path (conversations/versions.py)."""
    if chat.current is None:
        return {}
    by_key = {m.key: m for m in chat.messages}
    at = by_key.get(chat.current)
    if at is not None and at.role == ASSISTANT:
        at = by_key.get(at.reply_to)
    choices = {}
    while at is not None:
        choices[choice_key(turn_ids[at.parent] if at.parent else None)] = str(turn_ids[at.key])
        at = by_key.get(at.parent) if at.parent else None
    return choices
