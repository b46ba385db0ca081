"""The one deletion service for conversations (issue 17, "One deletion service").

The chat page, ``/v1``, the admin, the retention purge (conversations/retention.py) and account
and organisation deletion (privacy/services.py) all delete conversations through
:func:`conversations_delete` (:func:`conversation_delete` and :func:`aconversation_delete` for
one). A deletion removes, for good:

- in the conversation's region database, in one transaction: the conversation and with it
  (CASCADE) its turns, attachments (their files leave storage once it commits), share links and
  ratings;
- once that commits, in Redis: a tombstone is written (conversations/tombstones.py), then the
  answers held for write-back (``chat:pending:*``, conversations/held.py), the hot cache
  entry (``conv:{id}``, conversations/cache.py) and the turns' event logs (``chat:turn:*``,
  ``chat:q:*``, ``chat:a:*``, conversations/turnlog.py) are deleted;
- the answer still being generated in it, wherever it runs (below).

**Stopping the answer.** In this process through the turn stream registry
(conversations/turnstream.py), in another through the cancel pub/sub (conversations/cancels.py).
:func:`aconversation_delete` (the page and ``/v1``, in the event loop) first stops it with
``turnstream.stop_anywhere``, which waits (bounded, 5 s for another process) until the answer is
stored as cancelled, then deletes. Synchronous callers (the purge task, account deletion, the
admin) cannot wait on an event loop: once the deletion commits they stop a stream of this process
through its loop (``call_soon_threadsafe``) and publish the cancel for the holder of the
conversation's generating lock (``cancels.cancel_publish``), without waiting for it to end.

**No late write-back brings a conversation back.** An answer that ends after its conversation was
deleted (the cancel is asynchronous, or could not reach its process) is still held in Redis and
its write-back queued. Two guards drop it:

1. the row check, which is the authority: the write-back inserts a turn only under a lock on the
   conversation's row (``services.turn_append_assistant``, Conversation.DoesNotExist when it is
   gone), and this service takes the same lock (SELECT ... FOR UPDATE) before it deletes, so an
   insert either commits first and its turn is deleted with the conversation, or finds no row and
   drops the record. It needs no Redis, so it holds when Redis is down at the deletion, restarts
   without its data, or evicts the tombstone; the Redis-down fallback of a finishing answer (a
   synchronous insert) goes through the same check;
2. the tombstone, a shortcut: the write-back task and the sweeper drop a tombstoned
   conversation's records without a database query, and a turn log writer deletes its log when
   the answer ends instead of keeping it for ``CHAT_STREAM_TTL_S``.

**Redis down.** The rows are deleted all the same. What Redis holds goes by itself: held answers
are dropped by their write-back or the sweeper (row check), the hot cache entry expires
(``CHAT_HOT_CACHE_TTL_S``) and event logs too (``CHAT_STREAM_TTL_S``), and none is read without
the conversation's row. A stream in this process is still stopped; one in another process cannot
be reached and ends at its budget, and the row check drops its answer.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from attachments.models import Attachment
from attachments.services import attachment_files_forget
from conversations import cache, cancels, held, tombstones, turnlog, turnstream
from conversations.models import Conversation, Turn
from core import redis_guard, regions


@dataclass
class Deleted:
    """What one deletion removed: the conversations' ids, their attachments' ids, and the rows
    deleted per model, by lower-case model name (``conversation``, ``turn``, ``attachment``,
    ``sharelink``, ``feedback``, ...; Django's ``delete()`` counts, cascades included)."""

    conversation_ids: list[UUID] = field(default_factory=list)
    attachment_ids: list[UUID] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)


def conversations_delete(*, conversations: QuerySet) -> Deleted:
    """Delete the conversations ``conversations`` selects (a queryset on one region's primary,
    ``Conversation.objects.using(alias)...``; batches of at most a few thousand) for good, with
    everything of theirs (module docstring), and stop their generating answers.

    One transaction on that database (joined if the caller has one open there): the rows are
    locked first, so a turn appended meanwhile waits and then finds its conversation gone, and
    the queryset's conditions are re-checked on rows that changed while it waited (PostgreSQL's
    READ COMMITTED: a conversation that got a new turn meanwhile no longer matches a retention
    cutoff and is kept). Redis copies, cancels and attachment files follow the commit. Returns
    what was deleted (empty when nothing matched). Raises DatabaseError when the database
    fails; Redis errors never raise (logged and counted by core/redis_guard.py).
    """
    locked = conversations.select_for_update()
    db = locked.db
    with transaction.atomic(using=db):
        ids = list(locked.values_list("pk", flat=True))
        if not ids:
            return Deleted()
        attachments = Attachment.objects.using(db).filter(conversation_id__in=ids)
        attachment_ids = list(attachments.values_list("pk", flat=True))
        logged = _turns_with_logs(db, ids)
        attachment_files_forget(conversation_ids=ids, using=db)
        _, per_model = Conversation.objects.using(db).filter(pk__in=ids).delete()
        transaction.on_commit(lambda: _after_commit(ids, logged), using=db)
    counts = Counter({label.rpartition(".")[2].lower(): n for label, n in per_model.items()})
    return Deleted(conversation_ids=ids, attachment_ids=attachment_ids, counts=counts)


def conversation_delete(*, conversation: Conversation) -> None:
    """Delete one conversation for good (:func:`conversations_delete`), from synchronous code:
    its generating answer is asked to stop once the deletion commits, not waited for."""
    db = regions.conversation_db(conversation)
    conversations_delete(conversations=Conversation.objects.using(db).filter(pk=conversation.pk))


async def aconversation_delete(*, conversation: Conversation) -> None:
    """:func:`conversation_delete` from the event loop (the page, ``/v1``): first stop the
    generating answer wherever it runs and wait (bounded) until it is stored as cancelled
    (``turnstream.stop_anywhere``), so its engine request is freed before the 204, then delete."""
    await turnstream.stop_anywhere(conversation_id=conversation.conversation_id)
    await sync_to_async(conversation_delete)(conversation=conversation)


def _turns_with_logs(db: str, conversation_ids: list[UUID]) -> list[UUID]:
    """The turns of ``conversation_ids`` whose Redis keys may still exist: a turn log expires
    ``CHAT_STREAM_TTL_S`` after its answer ended, and an answer's ``created_at`` is when it
    ended, so the turns created since then, and the questions they answered."""
    since = timezone.now() - timedelta(seconds=settings.CHAT_STREAM_TTL_S)
    rows = Turn.objects.using(db).filter(
        conversation_id__in=conversation_ids, created_at__gte=since
    )
    return list({t for pair in rows.values_list("turn_id", "reply_to_id") for t in pair if t})


def _after_commit(conversation_ids: list[UUID], turn_ids: list[UUID]) -> None:
    """Once the rows are gone: tombstone first (every late writer from here on sees it), stop
    the answers, then drop every Redis copy. Never raises for Redis errors."""
    tombstones.tombstones_write(conversation_ids)
    _stop_here(conversation_ids)
    holders = cancels.cancel_publish(conversation_ids)
    held_ids: list[UUID] = []
    for conversation_id in conversation_ids:
        for turn in held.held_turns(conversation_id):  # their logs may still be there
            held_ids += [t for t in (turn.turn_id, turn.reply_to_id) if t]
        held.conversation_held_forget(conversation_id)
        cache.forget(conversation_id)
    dropped = {*turn_ids, *holders, *held_ids}
    # Each conversation's keys are on its region's server; turn ids need not name their region
    # (turns stored before regions had servers), so every server is asked (a missing key is no
    # error).
    for region in redis_guard.regions_with_servers():
        turnlog.turn_logs_drop(dropped, region=region)


def _stop_here(conversation_ids: Iterable[UUID]) -> None:
    """Stop the streams of ``conversation_ids`` generating in this process, from any thread: a
    stream belongs to its event loop, so the stop is handed to that loop (it works with Redis
    down, where the published cancel cannot)."""
    for conversation_id in conversation_ids:
        stream = turnstream.stream_for_conversation(conversation_id)
        if stream is not None and stream.task is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing runs there
                stream.task.get_loop().call_soon_threadsafe(stream.stop)
