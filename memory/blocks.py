"""The per-user memory block: a user's pinned profile in every one of their conversations'
instructions, rebuilt in the background when the facts change (issue 19 part 3, issue 28).

Issue 28: only the *pinned* facts (name, how to address the user, standing preferences such as
diet; memory/statements.py PINNED_SLOTS) are in the block; the user's other facts enter a
turn's prompt only when relevant to its message (memory.selectors.memory_relevant,
conversations/plan.py), so a turn they have nothing to do with pays for none of them.
``retrievable`` counts those other facts: 0 means a turn needs no query embedding.

ChatGPT puts a user's saved memories into each conversation's instructions instead of searching
per message; so does this product by default. The block is the same bytes in all of a user's
conversations and stands where DESIGN.md's prompt order puts it (inference/prompts.py
``system_message``: preamble, site prompt, custom instructions, *memory*, the conversation's
prompt), so the prefix cache holds it for every new chat of theirs and a turn spends nothing on
memory: no query embedding, no vector search.

- **Built** (:func:`memory_block_build`): the user's facts oldest first, each sanitised
  (memory.selectors.memory_fact_sanitise) on a ``- fact`` line. When the whole block is over
  ``CHAT_MEMORY_MAX_TOKENS`` (counted with the model's tokenizer where there is one) the user
  is an *overflow* user: the block is empty and each turn retrieves the facts most like its
  message (pgvector top-k, memory.selectors.memory_block), embedding the message as the request
  arrives, beside admission (conversations/plan.py).
- **Versioned** (:func:`memory_block_touch`): every write of a user's facts or memory switch
  bumps ``MemoryBlock.version`` in its own transaction and queues a rebuild after commit.
- **Rebuilt** (:func:`memory_block_rebuild`, Celery ``memory.memory_block_rebuild``): under the
  row's lock it reads the version, then the facts, and stores the text with that version.
  Race-safe: a writer's bump waits for a running rebuild's lock (and queues another rebuild),
  and a rebuild waits for a writer's commit, so the stored text is never older than the version
  it carries; a late or repeated rebuild rebuilds from what is current, or does nothing.
- **Read by a turn** (:func:`memory_block_current`): the stored block when it is current;
  otherwise (a change not rebuilt yet, or no row) built inline from the facts (one query, no
  embedding), so a deleted fact is gone from the very next turn.
- **Where**: the user's home region's database, like their facts (core/user_regions.py
  ``user_db``); the raw SQL here runs on that connection.
- **Warmed** (conversations/prefix_warm.py): after each rebuild, a 1-token request at
  background priority puts the new prefix into the engine's prefix cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections, transaction
from django.utils import timezone

from core import regions, user_regions
from memory.models import MemoryBlock, UserMemory
from memory.selectors import memory_fact_sanitise
from memory.signals import memory_facts_changed
from memory.statements import PINNED_SLOTS

logger = logging.getLogger(__name__)

# Creates the row at version 1 (built_version -1: not built), or bumps an existing row's version.
_TOUCH_SQL = """
INSERT INTO memory_block (user_id, version, built_version, text, token_count, budget, overflow, retrievable)
VALUES (%s, 1, -1, '', 0, 0, false, 0)
ON CONFLICT (user_id) DO UPDATE SET version = memory_block.version + 1
"""
_ENSURE_SQL = """
INSERT INTO memory_block (user_id, version, built_version, text, token_count, budget, overflow, retrievable)
VALUES (%s, 0, -1, '', 0, 0, false, 0)
ON CONFLICT (user_id) DO NOTHING
"""


@dataclass(frozen=True)
class BuiltBlock:
    """A memory block: ``text`` (``- fact`` lines, oldest first; "" for overflow or no facts),
    ``token_count`` (of all the facts' lines, tokens), ``overflow`` (over ``budget`` tokens:
    turns retrieve instead), ``budget`` (tokens, the ``CHAT_MEMORY_MAX_TOKENS`` it was built
    under), ``retrievable`` (the user's facts not in the block: retrieved when relevant)."""

    text: str
    token_count: int
    overflow: bool
    budget: int
    retrievable: int = 0


def block_tokens(text: str) -> int:
    """Tokens of ``text`` by the process's model tokenizer (inference.engine.get_engine's
    ``encode_text``: loads the tokenizer only, never starts an engine), the same in the server
    and a Celery worker; ~4 characters a token where no tokenizer can be loaded."""
    if not text:
        return 0
    from inference.engine import get_engine  # noqa: PLC0415 - settings are read at use

    try:
        return len(get_engine().encode_text(text))
    except Exception:  # noqa: BLE001 - no model folder here (a gateway without an engine)
        return -(-len(text) // 4)


@user_regions.for_user
def memory_block_build(
    *, user_id, count_tokens: Callable[[str], int] | None = None, budget: int | None = None
) -> BuiltBlock:
    """The memory block of user ``user_id`` from their pinned facts as stored now (one query; no
    embedding): each pinned fact sanitised on a ``- fact`` line, oldest first (created_at, then
    fact_id: a total order, so the same facts always give the same bytes), joined by newlines.
    ``count_tokens`` (text -> tokens; default :func:`block_tokens`) counts the whole block;
    over ``budget`` (default ``CHAT_MEMORY_MAX_TOKENS``) it is an overflow block (empty text).
    Whether memory is on for the user is not looked at here: turns check it themselves."""
    budget = settings.CHAT_MEMORY_MAX_TOKENS if budget is None else budget
    rows = list(
        UserMemory.objects.filter(user_id=user_id)
        .order_by("created_at", "fact_id")
        .values_list("text", "slot")
    )
    pinned = [text for text, slot in rows if slot in PINNED_SLOTS]
    retrievable = len(rows) - len(pinned)
    lines = [f"- {clean}" for clean in map(memory_fact_sanitise, pinned) if clean]
    text = "\n".join(lines)
    tokens = (count_tokens or block_tokens)(text) if text else 0
    if tokens > budget:
        return BuiltBlock(text="", token_count=tokens, overflow=True, budget=budget, retrievable=len(rows))
    return BuiltBlock(text=text, token_count=tokens, overflow=False, budget=budget, retrievable=retrievable)


def memory_block_touch(*, user_id) -> None:
    """Record that user ``user_id``'s facts (or memory switch) changed: bump their block's
    version in the caller's transaction and queue ``memory.memory_block_rebuild`` after it
    commits (never if it rolls back, PF-J2): the commit sends ``memory.signals.memory_facts_changed``,
    whose receiver in memory/tasks.py queues the task (this module imports no task). Call inside
    the writing transaction."""
    with user_regions.user_pinned(user_id=user_id) as db:
        with connections[db].cursor() as cursor:
            cursor.execute(_TOUCH_SQL, [user_id])
        # On the transaction that holds the bump (the user's region's): queued once it commits.
        transaction.on_commit(lambda: memory_facts_changed.send(sender=None, user_id=user_id), using=db)


def memory_block_rebuild(*, user_id, count_tokens: Callable[[str], int] | None = None) -> tuple[MemoryBlock, bool] | None:
    """Bring user ``user_id``'s stored block up to date; returns (the row, whether it was
    rebuilt), or None when the user no longer exists. Idempotent: a block already built from
    the current version under today's budget is left as it is, ``(row, False)``.

    Holds the row's lock (SELECT ... FOR UPDATE) from reading the version to writing the text,
    so it serialises with writers' :func:`memory_block_touch` (module docstring: race-safe).
    One transaction on the user's home region's database."""
    if not get_user_model().objects.filter(pk=user_id).exists():
        return None
    with user_regions.user_pinned(user_id=user_id, atomic=True) as db:
        return _rebuild(db, user_id=user_id, count_tokens=count_tokens)


def _rebuild(db: str, *, user_id, count_tokens) -> tuple[MemoryBlock, bool]:
    with connections[db].cursor() as cursor:
        cursor.execute(_ENSURE_SQL, [user_id])
    block = MemoryBlock.objects.select_for_update().get(user_id=user_id)
    budget = settings.CHAT_MEMORY_MAX_TOKENS
    if block.built_version == block.version and block.budget == budget:
        return block, False
    built = memory_block_build(user_id=user_id, count_tokens=count_tokens, budget=budget)
    block.text, block.token_count, block.overflow = built.text, built.token_count, built.overflow
    block.budget, block.built_version, block.built_at = budget, block.version, timezone.now()
    block.retrievable = built.retrievable
    block.save(update_fields=["text", "token_count", "overflow", "budget", "built_version", "built_at", "retrievable"])
    return block, True


def _is_current(block: MemoryBlock | None) -> bool:
    return (
        block is not None
        and block.built_version == block.version
        and block.budget == settings.CHAT_MEMORY_MAX_TOKENS
    )


@user_regions.for_user
def memory_block_current(*, user_id) -> BuiltBlock:
    """The memory block a turn of user ``user_id`` uses now: the stored one when it is current
    (one primary-key read), else built inline from the facts (:func:`memory_block_build`, one
    more query), so a change not yet rebuilt - a deleted fact - shows from the very next turn.
    A user with no row yet (facts stored before blocks existed, or none ever) gets it built and
    stored now (:func:`memory_block_rebuild`), once, so their later turns read it and skip the
    query embedding. Does not check whether memory is on (the caller does)."""
    block = MemoryBlock.objects.filter(user_id=user_id).first()
    if block is None:
        rebuilt = memory_block_rebuild(user_id=user_id)
        block = rebuilt[0] if rebuilt is not None else None
    if _is_current(block):
        return BuiltBlock(
            text=block.text, token_count=block.token_count, overflow=block.overflow, budget=block.budget,
            retrievable=block.retrievable,
        )  # fmt: skip
    return memory_block_build(user_id=user_id)


async def amemory_block_needs_query(*, user_id) -> bool:
    """Whether a turn of user ``user_id`` may need query-time retrieval (so its message's
    embedding should start as the request arrives): False only when their stored block is
    current, not overflow, and they have no facts outside it or per-turn retrieval is off
    (``CHAT_MEMORY_RELEVANT_K`` 0); then nothing is embedded. One primary-key
    read (and, with several region databases, the user's and their membership's to find it)."""
    db = await sync_to_async(user_regions.user_db)(user_id=user_id)
    block = await regions.manager(MemoryBlock, db, user_id=int(user_id)).filter(user_id=user_id).afirst()
    relevant_on = int(getattr(settings, "CHAT_MEMORY_RELEVANT_K", 3)) > 0  # 0: no per-turn retrieval
    return not _is_current(block) or block.overflow or (block.retrievable > 0 and relevant_on)
