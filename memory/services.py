"""Writes of long-term memory: add facts (validated, de-duplicated), remove them, clear them.

The reads (memory_list, memory_search, memory_block) live in memory/selectors.py and are
re-exported here for callers that import the whole API from one place. Every write goes to the
user's home region's database (conversations/regions.py ``user_db``), in one transaction there.
"""

from __future__ import annotations

from uuid import UUID

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connections, transaction

from conversations import regions
from memory.blocks import memory_block_touch
from memory.embeddings import embed
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
    """Store ``texts`` as the user's facts; returns the new ones (in the order given).

    Each text is cleaned (memory_fact_clean). A text is skipped, not stored, when it is a
    near-duplicate: cosine similarity >= ``CHAT_MEMORY_DEDUP_SIMILARITY`` to one of the user's
    facts or to an earlier text of the same batch (so re-adding a fact, or the extractor finding
    it again, changes nothing). ``source`` is "manual" or "extracted"; ``source_conversation_id``
    the conversation an extracted fact came from.

    Raises ValidationError (nothing stored) for a bad text or source, or when the user would
    have more than ``CHAT_MEMORY_MAX_FACTS_PER_USER`` facts. Embeds before taking the lock (one
    batch on the CPU, ~5-15 ms per text); the check and insert run under a per-user advisory
    transaction lock. Storing any fact queues the user's memory block rebuild after commit
    (memory/blocks.py).
    """
    if source not in SOURCES:
        raise ValidationError(f"Unknown source {source!r}.", code="invalid")
    cleaned = [memory_fact_clean(text) for text in texts]
    if not cleaned:
        return []
    vectors = embed(cleaned)
    threshold = settings.CHAT_MEMORY_DEDUP_SIMILARITY
    cap = settings.CHAT_MEMORY_MAX_FACTS_PER_USER
    with regions.user_pinned(user=user, atomic=True) as db:
        with connections[db].cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_CLASS, user.pk])
        kept: list[UserMemory] = []
        for text, vector in zip(cleaned, vectors, strict=True):
            nearest = memory_nearest(user=user, vector=vector, k=1)
            if nearest and nearest[0][1] >= threshold:
                continue
            # Vectors are L2-normalised: the dot product is the cosine similarity.
            if any(sum(a * b for a, b in zip(vector, other.embedding, strict=True)) >= threshold for other in kept):
                continue
            kept.append(
                UserMemory(
                    user=user, text=text, embedding=vector, source=source,
                    source_conversation_id=source_conversation_id,
                )
            )  # fmt: skip
        if not kept:
            return []
        existing = UserMemory.objects.filter(user=user).count()
        if existing + len(kept) > cap:
            raise ValidationError(
                f"You can keep at most {cap} facts; you have {existing}. Delete some first.",
                code="too_many",
            )
        stored = UserMemory.objects.bulk_create(kept)
        memory_block_touch(user_id=user.pk)
        return stored


@regions.atomic_for_user
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


@regions.atomic_for_user
def memory_clear(*, user) -> int:
    """Delete all of the user's facts; returns how many (gone from the next turn, as for
    :func:`memory_remove`)."""
    deleted, _ = UserMemory.objects.filter(user=user).delete()
    if deleted:
        memory_block_touch(user_id=user.pk)
    return deleted


@transaction.atomic
@regions.atomic_for_user
def memory_set_enabled(*, user, enabled: bool) -> None:
    """Switch the user's memory on or off (``User.memory_enabled``). Off: nothing is extracted
    from their conversations and nothing is retrieved into their prompts; stored facts are kept
    (and listed) until deleted. Queues the memory block's rebuild (switched on, its prefix is
    warmed into the engine's cache again)."""
    user.memory_enabled = bool(enabled)
    get_user_model().objects.filter(pk=user.pk).update(memory_enabled=user.memory_enabled)
    memory_block_touch(user_id=user.pk)
