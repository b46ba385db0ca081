"""Memory extraction: durable facts about a user, mined from their idle conversations (issue 7).

1. The beat task ``memory.memory_sweep`` (every ``CHAT_MEMORY_SWEEP_S``; :func:`memory_sweep`)
   finds conversations idle for ``CHAT_MEMORY_IDLE_S`` whose last turn no extraction covers
   yet, of owners with memory on, outside zero-retention organisations, and queues
   ``memory.memory_extract`` for each. The turn path never queues or waits for anything: a turn
   costs nothing extra, and no task waits in the broker for a countdown (a task held past the
   broker's visibility timeout is delivered again; see below).
2. The task (:func:`conversation_memory_extract`) reads the **user's own messages** written
   since the last extraction (never the assistant's answers) and finds the grounded statements
   about the user in them (memory/statements.py: deterministic first-person patterns, with
   quoted, translated, summarised, story and role-play text excluded; issue 28). Each is
   stored with the turn and the span it came from, through
   ``memory.services.memory_facts_store(source="extracted", ...)``: a newer fact in a
   single-valued slot replaces the older one, near-duplicates are skipped. No model is asked
   (docs/memory.md says why), so a run costs no engine time; at most
   ``CHAT_MEMORY_EXTRACT_MAX_FACTS`` facts per run.

Exactly once per idle period. Celery here acknowledges late and the Redis broker redelivers a
task still unacknowledged after its visibility timeout, so two copies of one task may run, one
after the other or at the same time. A row per conversation (:class:`ExtractionMarker`, in the
conversation's database; the facts go to the owner's home region's, core/user_regions.py
``user_db``, usually the same one) settles it:

- ``extracted_through`` is the ``last_turn_at`` the last extraction covered. A run for a
  conversation whose ``last_turn_at`` is already covered does nothing.
- A run first takes a lease (``claimed_until``, ``CHAT_MEMORY_EXTRACT_LEASE_S``) by
  compare-and-set; a copy that finds the lease held ends without asking the model.
- The facts are stored in the same transaction as a compare-and-set of ``extracted_through``
  from the value the run started from: if a copy whose lease had run out got there first, the
  update matches no row, nothing is stored, and the transaction ends. A worker killed before
  that commit stored nothing and moved nothing: the redelivered copy (or the next sweep, once
  the lease runs out) does the work.

Any other error releases the lease (the next sweep tries again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts.models import Organisation, User
from conversations import selectors
from conversations.models import Conversation
from conversations.selectors import conversation_zero_retention
from core import regions
from memory.extraction_models import ExtractionMarker
from memory.commands import commands_parse, forget_words
from memory.statements import UserMessage, fact_words, statements_extract

logger = logging.getLogger(__name__)


def _setting(name: str, default):
    return getattr(settings, name, default)


def extract_max_facts() -> int:
    """Facts kept from one extraction (``CHAT_MEMORY_EXTRACT_MAX_FACTS``, default 10)."""
    return int(_setting("CHAT_MEMORY_EXTRACT_MAX_FACTS", 10))


def extract_lease_s() -> float:
    """Seconds a run holds a conversation (``CHAT_MEMORY_EXTRACT_LEASE_S``; default: the internal
    API timeout + 60 s, ample for reading and storing one conversation's facts)."""
    return float(_setting("CHAT_MEMORY_EXTRACT_LEASE_S", settings.CHAT_INTERNAL_API_TIMEOUT_S + 60))


@dataclass(frozen=True)
class Extraction:
    """What one run did. ``status``: ``stored`` (this run's facts were stored; ``stored`` may be
    0 when the user stated none or all were near-duplicates), ``disabled`` (memory off for the
    deployment or the owner), ``zero_retention``, ``gone`` (no such conversation), ``not_idle``,
    ``done`` (this idle period already extracted), ``claimed`` (another run holds the lease),
    ``lost`` (another run stored first)."""

    status: str
    stored: int = 0

    def as_dict(self) -> dict:
        return {"status": self.status, "stored": self.stored}


@regions.routed  # the conversation region's database (core/regions.py)
def _conversation(*, conversation_id: UUID) -> Conversation | None:
    return Conversation.objects.filter(pk=conversation_id).first()


@regions.routed
def _user_messages(*, conversation_id: UUID, after: datetime | None, through: datetime) -> list[UserMessage]:
    """The user's messages of the conversation's selected path, oldest first, as
    memory.statements.UserMessage: ``new`` for those written after ``after`` and by ``through``
    (facts come from these), the earlier ones too (they carry a role-play's start). Only user
    turns are read: the assistant's answers never reach the extractor."""
    messages = []
    for position in selectors.positions_after(conversation_id=conversation_id, after=None):
        question = position.question
        if question.role != "user" or question.created_at > through:
            continue
        new = after is None or question.created_at > after
        messages.append(UserMessage(turn_id=question.turn_id, text=question.content, new=new))
    return messages


def _not_commanded(statements: list, messages: list[UserMessage]) -> list:
    """``statements`` less those an explicit command settled when it was sent (memory/updates.py):
    the sentence of a "remember ..." / "call me ..." (applied then; an Undo must stay undone),
    and any fact a "forget ..." in the same or a later message names."""
    order = {m.turn_id: i for i, m in enumerate(messages)}
    commands = {m.turn_id: commands_parse(m.text) for m in messages if m.new}
    forgets = [
        (order[turn_id], forget_words(c.clause))
        for turn_id, found in commands.items() for c in found if c.kind == "forget"
    ]  # fmt: skip
    kept = []
    for statement in statements:
        if any(c.start <= statement.end and statement.start <= c.end for c in commands.get(statement.turn_id, [])):
            continue
        words = fact_words(statement.text)
        if any(i >= order[statement.turn_id] and (w is None or (w and w <= words)) for i, w in forgets):
            continue
        kept.append(statement)
    return kept


def _markers(conversation_id: UUID):
    # The conversation's database's primary: the marker's compare-and-sets read what was written.
    return ExtractionMarker.objects.using(regions.db_for_conversation_id(conversation_id))


def _marker(conversation: Conversation) -> ExtractionMarker:
    _markers(conversation.pk).bulk_create(
        [ExtractionMarker(conversation_id=conversation.pk, user_id=conversation.owner_id)],
        ignore_conflicts=True,
    )
    return _markers(conversation.pk).get(pk=conversation.pk)


def _release(conversation_id: UUID, lease: datetime) -> None:
    _markers(conversation_id).filter(pk=conversation_id, claimed_until=lease).update(claimed_until=None)


def conversation_memory_extract(*, conversation_id: UUID, now: datetime | None = None) -> Extraction:
    """Extract and store the facts about its owner in the conversation's turns since its last
    extraction, once per idle period (module docstring). ``now``: the current time (tests move
    the clock). Returns what happened (:class:`Extraction`). Raises only database errors (the
    task retries them); a failing model endpoint is logged and returns ``failed``."""
    now = now or timezone.now()
    if not settings.CHAT_MEMORY_ENABLED:
        return Extraction("disabled")
    conversation = _conversation(conversation_id=conversation_id)
    if conversation is None:
        return Extraction("gone")
    if conversation_zero_retention(conversation):
        return Extraction("zero_retention")  # nothing of it may be kept, facts included
    owner = User.objects.filter(pk=conversation.owner_id).only("pk", "memory_enabled").first()
    if owner is None or not owner.memory_enabled:
        return Extraction("disabled")
    through = conversation.last_turn_at
    if through > now - timedelta(seconds=settings.CHAT_MEMORY_IDLE_S):
        return Extraction("not_idle")
    marker = _marker(conversation)
    expected = marker.extracted_through
    if expected is not None and expected >= through:
        return Extraction("done")
    lease = now + timedelta(seconds=extract_lease_s())
    claimed = (
        _markers(conversation_id).filter(pk=conversation_id, extracted_through=expected)
        .exclude(claimed_until__gt=now)
        .update(claimed_until=lease)
    )
    if not claimed:
        return Extraction("claimed")
    try:
        messages = _user_messages(conversation_id=conversation_id, after=expected, through=through)
        statements = _not_commanded(statements_extract(messages), messages)[: extract_max_facts()]
        return _store(conversation, owner, statements, expected=expected, through=through)
    except BaseException:
        _release(conversation_id, lease)
        raise


def _store(conversation, owner, facts: list, *, expected, through) -> Extraction:
    """Move the marker from ``expected`` to ``through`` and store ``facts`` (Statements), in one transaction
    on the conversation's database (the facts' own transaction, on the owner's home region's
    database, is nested in it: one transaction when that is the same database); nothing when
    another run moved the marker first."""
    from memory.services import FactIn, memory_facts_store  # noqa: PLC0415 - memory.services imports the models

    db = regions.db_for_conversation_id(conversation.pk)
    with transaction.atomic(using=db):
        moved = ExtractionMarker.objects.using(db).filter(
            pk=conversation.pk, extracted_through=expected
        ).update(extracted_through=through, claimed_until=None)
        if not moved:
            return Extraction("lost")
        stored = []
        if facts:
            try:
                with transaction.atomic(using=db):
                    stored = memory_facts_store(
                        user=owner, facts=[FactIn.of(f) for f in facts], source="extracted",
                        source_conversation_id=conversation.pk,
                    ).added  # fmt: skip
            except ValidationError as exc:  # e.g. the owner's facts are at their cap
                logger.warning("memory facts of conversation %s not stored: %s", conversation.pk, exc)
    logger.info("memory: %d fact(s) from conversation %s through %s", len(stored), conversation.pk, through)
    return Extraction("stored", len(stored))


def _requeue_after_s() -> float:
    return float(
        _setting(
            "CHAT_MEMORY_REQUEUE_AFTER_S",
            max(extract_lease_s(), settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout", 3600)),
        )
    )


def memory_sweep(
    *, queue: Callable[[str], object], now: datetime | None = None, limit: int | None = None
) -> list[UUID]:
    """Queue ``memory.memory_extract`` (by calling ``queue`` with the conversation id as a
    string: the beat task passes memory/tasks.py ``memory_extract.delay``, so this module
    imports no task) for conversations due an extraction at ``now``: last turn at least
    ``CHAT_MEMORY_IDLE_S`` ago and within ``CHAT_MEMORY_SWEEP_LOOKBACK_S`` (default 7 days)
    before that, not covered by their marker, not leased, not queued in the last
    ``CHAT_MEMORY_REQUEUE_AFTER_S`` (default: the larger of the lease and the broker's
    visibility timeout), owner with memory on, outside zero-retention organisations and not a
    temporary chat; at most ``limit`` (``CHAT_MEMORY_SWEEP_LIMIT``, default 500) per region
    database, oldest first. Returns the conversation ids queued. A failure to queue one is
    logged (the next sweep retries it)."""
    if not settings.CHAT_MEMORY_ENABLED:
        return []
    now = now or timezone.now()
    limit = limit or int(_setting("CHAT_MEMORY_SWEEP_LIMIT", 500))
    idle_since = now - timedelta(seconds=settings.CHAT_MEMORY_IDLE_S)
    oldest = idle_since - timedelta(seconds=float(_setting("CHAT_MEMORY_SWEEP_LOOKBACK_S", 7 * 86400)))
    requeue_before = now - timedelta(seconds=_requeue_after_s())
    zero_retention = list(Organisation.objects.filter(zero_retention=True).values_list("pk", flat=True))
    queued: list[UUID] = []
    for alias in regions.region_dbs():
        candidates = list(
            Conversation.objects.using(alias)
            .filter(last_turn_at__lte=idle_since, last_turn_at__gt=oldest)
            .exclude(org_id__in=zero_retention)
            .exclude(temporary=True)
            .order_by("last_turn_at")
            .values_list("conversation_id", "owner_id", "last_turn_at")[: limit * 2]
        )
        if not candidates:
            continue
        markers = ExtractionMarker.objects.using(alias).in_bulk([c[0] for c in candidates])
        memory_on = set(
            User.objects.filter(pk__in={c[1] for c in candidates}, memory_enabled=True).values_list("pk", flat=True)
        )
        due = []
        for conversation_id, owner_id, last_turn_at in candidates:
            marker = markers.get(conversation_id)
            if owner_id not in memory_on:
                continue
            if marker is not None and (
                (marker.extracted_through is not None and marker.extracted_through >= last_turn_at)
                or (marker.claimed_until is not None and marker.claimed_until > now)
                or (marker.queued_at is not None and marker.queued_at > requeue_before)
            ):
                continue
            due.append((conversation_id, owner_id))
            if len(due) == limit:
                break
        ExtractionMarker.objects.using(alias).bulk_create(
            [ExtractionMarker(conversation_id=c, user_id=o) for c, o in due], ignore_conflicts=True
        )
        for conversation_id, _ in due:
            try:
                queue(str(conversation_id))
            except Exception:  # noqa: BLE001 - the next sweep queues it again
                logger.exception("could not queue the memory extraction of %s", conversation_id)
                continue
            queued.append(conversation_id)
        ExtractionMarker.objects.using(alias).filter(pk__in=queued).update(queued_at=now)
    if queued:
        logger.info("memory sweep: queued %d extraction(s)", len(queued))
    return queued
