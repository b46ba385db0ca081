"""Writes of long-term memory: add facts (validated, de-duplicated), remove them, clear them.

The reads (memory_list, memory_search, memory_block) live in memory/selectors.py and are
re-exported here for callers that import the whole API from one place. Every write goes to the
user's home region's database (core/user_regions.py ``user_db``), in one transaction there.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connections, transaction

from core import user_regions
from inference.embeddings import embed
from memory.blocks import memory_block_touch
from memory.models import UserMemory
from memory.selectors import (  # noqa: F401 - re-exported
    memory_block,
    memory_enabled_for,
    memory_list,
    memory_nearest,
    memory_search,
)

# pg_advisory_xact_lock's first key: "memory writes"; the second is the user id. Serialises one
# user's additions so two concurrent batches cannot both store the same fact or pass the cap.
_LOCK_CLASS = 7_001

SOURCES = {choice for choice, _label in UserMemory.Source.choices}

# The fields of a fact that Undo restores (MemoryUpdate.removed), besides its user and embedding.
SNAPSHOT_FIELDS = (
    "text", "slot", "source", "source_conversation_id", "source_turn_id", "span_start", "span_end", "span_text",
)


@dataclass(frozen=True)
class FactIn:
    """A fact to store: ``text`` (cleaned by memory_fact_clean), ``slot`` ("" or a single-valued
    kind, memory/statements.py SLOTS), and its grounding: ``turn_id`` (the user turn),
    ``start``/``end`` (character offsets into its text), ``span`` (the text between them)."""

    text: str
    slot: str = ""
    turn_id: UUID | None = None
    start: int | None = None
    end: int | None = None
    span: str = ""

    @classmethod
    def of(cls, statement) -> FactIn:
        """From a memory.statements.Statement."""
        return cls(statement.text, statement.slot, statement.turn_id, statement.start, statement.end, statement.span)


@dataclass(frozen=True)
class MemoryChange:
    """What one store did: ``added`` (the new facts), ``removed`` (snapshots of the facts a
    newer fact in the same slot replaced: dicts of :data:`SNAPSHOT_FIELDS`, ids as strings)."""

    added: list
    removed: list


def fact_snapshot(fact: UserMemory) -> dict:
    """The fields Undo needs to put ``fact`` back (JSON-safe)."""
    out = {name: getattr(fact, name) for name in SNAPSHOT_FIELDS}
    for name in ("source_conversation_id", "source_turn_id"):
        out[name] = str(out[name]) if out[name] else None
    out["fact_id"] = str(fact.fact_id)
    return out


def memory_fact_clean(text: str) -> str:
    """A fact as stored: whitespace (newlines included) collapsed to single spaces, trimmed.
    Raises ValidationError when it is not a string, is empty, contains NUL, or is longer than
    ``CHAT_MEMORY_FACT_CHARS`` characters."""
    if not isinstance(text, str):
        raise ValidationError("A fact must be text.", code="invalid")
    if "\x00" in text:
        raise ValidationError("A fact must not contain the NUL character.", code="invalid")
    clean = " ".join(text.split())
    if not clean:
        raise ValidationError("A fact must not be empty.", code="empty")
    limit = settings.CHAT_MEMORY_FACT_CHARS
    if len(clean) > limit:
        raise ValidationError(f"A fact must be at most {limit} characters.", code="too_long")
    return clean


def memory_add(
    *,
    user,
    texts: list[str],
    source: str = UserMemory.Source.MANUAL,
    source_conversation_id: UUID | None = None,
) -> list[UserMemory]:
    """Store ``texts`` as the user's facts (no slot, no grounding: facts added by hand or through
    ``PATCH /v1/users/{id}/memory``); returns the new ones. See :func:`memory_facts_store`."""
    return memory_facts_store(
        user=user, facts=[FactIn(text) for text in texts], source=source,
        source_conversation_id=source_conversation_id,
    ).added  # fmt: skip


def memory_facts_store(
    *,
    user,
    facts: list[FactIn],
    source: str = UserMemory.Source.MANUAL,
    source_conversation_id: UUID | None = None,
) -> MemoryChange:
    """Store ``facts`` as the user's; returns what was added and what was replaced.

    Each text is cleaned (memory_fact_clean). A fact with a single-valued ``slot`` (memory/
    statements.py SINGLE_VALUED: name, home, diet...) *replaces* the user's facts in that slot
    (a new "lives in Paris" removes "lives in Lyon"), unless it says the same (same text,
    case-insensitive: then it is skipped). Any other fact is skipped when it is a
    near-duplicate: cosine similarity >= ``CHAT_MEMORY_DEDUP_SIMILARITY`` to one of the user's
    facts or to an earlier fact of the same batch. ``source``: "manual", "extracted" or
    "explicit"; ``source_conversation_id``: the conversation it came from.

    Raises ValidationError (nothing stored) for a bad text or source, or when the user would
    have more than ``CHAT_MEMORY_MAX_FACTS_PER_USER`` facts. Embeds before taking the lock (one
    batch on the CPU, ~5-15 ms per text); the check and insert run under a per-user advisory
    transaction lock. Any change queues the user's memory block rebuild after commit
    (memory/blocks.py).
    """
    from memory.statements import SINGLE_VALUED  # noqa: PLC0415 - pure module, kept light

    if source not in SOURCES:
        raise ValidationError(f"Unknown source {source!r}.", code="invalid")
    cleaned = [(memory_fact_clean(fact.text), fact) for fact in facts]
    if not cleaned:
        return MemoryChange([], [])
    vectors = embed([text for text, _ in cleaned])
    threshold = settings.CHAT_MEMORY_DEDUP_SIMILARITY
    cap = settings.CHAT_MEMORY_MAX_FACTS_PER_USER
    with user_regions.user_pinned(user=user, atomic=True) as db:
        with connections[db].cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_CLASS, user.pk])
        kept: list[UserMemory] = []
        replaced: list[UserMemory] = []
        for (text, fact), vector in zip(cleaned, vectors, strict=True):
            if fact.slot in SINGLE_VALUED:
                same_slot = list(UserMemory.objects.filter(user=user, slot=fact.slot).defer("embedding"))
                if any(old.text.casefold() == text.casefold() for old in same_slot):
                    continue
                replaced.extend(o for o in same_slot if o.pk not in {r.pk for r in replaced})
                kept = [k for k in kept if k.slot != fact.slot]  # the batch's later one wins
            else:
                nearest = memory_nearest(user=user, vector=vector, k=1)
                if nearest and nearest[0][1] >= threshold and nearest[0][0].pk not in {r.pk for r in replaced}:
                    continue
                # Vectors are L2-normalised: the dot product is the cosine similarity.
                if any(sum(a * b for a, b in zip(vector, other.embedding, strict=True)) >= threshold for other in kept):
                    continue
            kept.append(
                UserMemory(
                    user=user, text=text, embedding=vector, source=source, slot=fact.slot,
                    source_conversation_id=source_conversation_id, source_turn_id=fact.turn_id,
                    span_start=fact.start, span_end=fact.end, span_text=fact.span,
                )
            )  # fmt: skip
        if not kept and not replaced:
            return MemoryChange([], [])
        existing = UserMemory.objects.filter(user=user).count() - len(replaced)
        if existing + len(kept) > cap:
            raise ValidationError(
                f"You can keep at most {cap} facts; you have {existing}. Delete some first.",
                code="too_many",
            )
        removed = [fact_snapshot(old) for old in replaced]
        if replaced:
            UserMemory.objects.filter(user=user, pk__in=[old.pk for old in replaced]).delete()
        stored = UserMemory.objects.bulk_create(kept)
        memory_block_touch(user_id=user.pk)
        return MemoryChange(stored, removed)


@user_regions.atomic_for_user
def memory_remove(*, user, fact_ids: list[UUID]) -> int:
    """Delete the user's facts among ``fact_ids`` (ids of other users' facts, or unknown ones,
    are ignored); returns how many were deleted. They are gone from the very next turn: the
    stored memory block is stale from this commit, and turns build a stale block inline until
    its rebuild (queued after commit) lands (memory/blocks.py)."""
    if not fact_ids:
        return 0
    deleted, _ = UserMemory.objects.filter(user=user, fact_id__in=list(fact_ids)).delete()
    if deleted:
        memory_block_touch(user_id=user.pk)
    return deleted


@user_regions.atomic_for_user
def memory_clear(*, user) -> int:
    """Delete all of the user's facts; returns how many (gone from the next turn, as for
    :func:`memory_remove`)."""
    deleted, _ = UserMemory.objects.filter(user=user).delete()
    if deleted:
        memory_block_touch(user_id=user.pk)
    return deleted


@transaction.atomic
@user_regions.atomic_for_user
def memory_set_enabled(*, user, enabled: bool) -> None:
    """Switch the user's memory on or off (``User.memory_enabled``). Off: nothing is extracted
    from their conversations and nothing is retrieved into their prompts; stored facts are kept
    (and listed) until deleted. Queues the memory block's rebuild (switched on, its prefix is
    warmed into the engine's cache again)."""
    user.memory_enabled = bool(enabled)
    get_user_model().objects.filter(pk=user.pk).update(memory_enabled=user.memory_enabled)
    memory_block_touch(user_id=user.pk)
