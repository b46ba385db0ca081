"""Memory extraction: durable facts about a user, mined from their idle conversations (issue 7).

1. The beat task ``memory.memory_sweep`` (every ``CHAT_MEMORY_SWEEP_S``; :func:`memory_sweep`)
   finds conversations idle for ``CHAT_MEMORY_IDLE_S`` whose last turn no extraction covers
   yet, of owners with memory on, outside zero-retention organisations, and queues
   ``memory.memory_extract`` for each. The turn path never queues or waits for anything: a turn
   costs nothing extra, and no task waits in the broker for a countdown (a task held past the
   broker's visibility timeout is delivered again; see below).
2. The task (:func:`conversation_memory_extract`) asks the model, as the service user (lowest
   engine priority; inference/service_client.py), for facts about the user stated in the turns
   written since the last extraction, with a JSON-schema ``response_format`` (vLLM structured
   output): ``{"facts": [string]}``. The answer is parsed strictly (:func:`facts_parse`), capped
   in number (``CHAT_MEMORY_EXTRACT_MAX_FACTS``) and length (``CHAT_MEMORY_FACT_CHARS``), and
   stored with ``memory.services.memory_add(source="extracted", ...)`` (which skips
   near-duplicates).

Exactly once per idle period. Celery here acknowledges late and the Redis broker redelivers a
task still unacknowledged after its visibility timeout, so two copies of one task may run, one
after the other or at the same time. A row per conversation (:class:`ExtractionMarker`, in the
conversation's database; the facts go to the owner's home region's, conversations/regions.py
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

A model endpoint that fails releases the lease (the next sweep tries again); an answer that is
not the JSON asked for counts as "no facts" for that period (greedy decoding would repeat it).
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

import httpx
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts.callers import caller_for, user_cache_salt
from accounts.models import Organisation, User
from accounts.services import service_user
from conversations import regions, selectors
from conversations.models import Conversation
from conversations.selectors import conversation_zero_retention
from gateway import gate
from inference import service_client
from inference.engine import get_engine
from inference.service_client import ServiceCallError
from memory.extraction_models import ExtractionMarker

logger = logging.getLogger(__name__)

# The request: a plain system prompt and the question after the transcript. SmolLM2-135M under
# the JSON schema answered [] to every conversation when the rules came as a system prompt, and
# copied a worked example's facts into its answers; this form (tried against both) lists facts
# for a conversation that states some and [] for one that states none.
EXTRACTION_SYSTEM = "You are a helpful assistant."
EXTRACTION_QUESTION = (
    "What durable facts did the user state about themselves (name, home, work, family, pets, "
    "likes, plans)? Only what the user said, not the assistant; no guesses. Answer as JSON "
    '{"facts": [short sentences starting with "The user"]}, an empty list if none.'
)
# Longest message text, in characters, put into the extraction prompt (a long answer is mostly
# not about the user; a long question is clipped further if one exchange alone does not fit).
MESSAGE_CHARS = 2000
CLIP_FACTOR = 0.5
_SPACE = re.compile(r"\s+")


def _setting(name: str, default):
    return getattr(settings, name, default)


def extract_max_facts() -> int:
    """Facts kept from one extraction (``CHAT_MEMORY_EXTRACT_MAX_FACTS``, default 5)."""
    return int(_setting("CHAT_MEMORY_EXTRACT_MAX_FACTS", 5))


def extract_lease_s() -> float:
    """Seconds a run holds a conversation (``CHAT_MEMORY_EXTRACT_LEASE_S``; default: the model
    endpoint's timeout + 60 s, so a live run's lease outlasts its model call)."""
    return float(_setting("CHAT_MEMORY_EXTRACT_LEASE_S", settings.CHAT_INTERNAL_API_TIMEOUT_S + 60))


def facts_schema() -> dict:
    """The JSON schema of the model's answer: ``{"facts": [string]}``, at most
    :func:`extract_max_facts` strings of 1..``CHAT_MEMORY_FACT_CHARS`` characters, nothing else."""
    return {
        "type": "object",
        "properties": {
            "facts": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": settings.CHAT_MEMORY_FACT_CHARS},
                "maxItems": extract_max_facts(),
            }
        },
        "required": ["facts"],
        "additionalProperties": False,
    }


def response_format() -> dict:
    """The OpenAI ``response_format`` for :func:`facts_schema` (api/schemas.py ResponseFormat;
    api/completions.py passes the schema to vLLM's structured output)."""
    return {"type": "json_schema", "json_schema": {"name": "memory_facts", "strict": True, "schema": facts_schema()}}


def facts_parse(text: str) -> list[str]:
    """The facts in the model's answer ``text``, strictly: it must be a JSON object with exactly
    the key ``facts``, a list of strings. Each fact is stripped and its whitespace collapsed;
    empty ones, ones longer than ``CHAT_MEMORY_FACT_CHARS`` and repeats (case-insensitive) are
    dropped; at most :func:`extract_max_facts` are kept, in the model's order.
    Raises ValueError when the answer is not of that shape."""
    try:
        data = json.loads(text)
    except (TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"the answer is not JSON: {text[:200]!r}") from exc
    if not isinstance(data, dict) or set(data) != {"facts"}:
        raise ValueError(f'the answer is not {{"facts": [...]}}: {text[:200]!r}')
    items = data["facts"]
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise ValueError(f"facts is not a list of strings: {text[:200]!r}")
    facts: list[str] = []
    seen: set[str] = set()
    for item in items:
        fact = _SPACE.sub(" ", item).strip()
        if not fact or len(fact) > settings.CHAT_MEMORY_FACT_CHARS or fact.casefold() in seen:
            continue
        seen.add(fact.casefold())
        facts.append(fact)
        if len(facts) == extract_max_facts():
            break
    return facts


def extraction_messages(exchanges: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    """The chat messages asking for facts in ``exchanges`` ((user message, answer), oldest
    first; an answer may be "")."""
    transcript = "\n".join(
        f"User: {q}\nAssistant: {a}" if a else f"User: {q}" for q, a in exchanges
    )
    return [
        {"role": "system", "content": EXTRACTION_SYSTEM},
        {"role": "user", "content": f"Here is a conversation:\n{transcript}\n\n{EXTRACTION_QUESTION}"},
    ]


def model_facts(exchanges: Sequence[tuple[str, str]], *, cache_salt: str | None = None) -> list[str]:
    """Ask the served model (service credential, lowest priority, greedy) for the facts in
    ``exchanges`` with the JSON-schema ``response_format``; :func:`facts_parse` of its answer.
    ``cache_salt``: the conversation owner's prefix-cache salt (their data, their cache).
    Raises ServiceCallError if the endpoint fails, ValueError if the answer is not the JSON."""
    return facts_parse(
        chat_complete_json(
            extraction_messages(exchanges),
            max_tokens=settings.CHAT_MEMORY_EXTRACT_MAX_TOKENS,
            response_format=response_format(),
            cache_salt=cache_salt,
        )
    )


def chat_complete_json(
    messages: Sequence[dict[str, str]], *, max_tokens: int, response_format: dict, cache_salt: str | None = None
) -> str:
    """``service_client.chat_complete`` (greedy) with a ``response_format``: one non-streamed
    completion of ``messages`` by the served model through the service endpoint
    (``service_client.http_client``: the service credential; the server runs the service
    user's requests at ``CHAT_BACKGROUND_PRIORITY``, the lowest), under ``cache_salt`` (the
    owner's; None: the service's). Returns the answer's text.
    Raises ServiceCallError as chat_complete does."""
    if "response_format" in inspect.signature(service_client.chat_complete).parameters:
        return service_client.chat_complete(
            messages, max_tokens=max_tokens, temperature=0.0, response_format=response_format,
            cache_salt=cache_salt,
        )  # fmt: skip
    # chat_complete takes no response_format yet: the same request, with it.
    body = {
        "model": settings.CHAT_MODEL_NAME, "messages": list(messages), "max_tokens": max_tokens,
        "temperature": 0.0, "stream": False, "response_format": response_format,
    }  # fmt: skip
    if cache_salt:
        body["cache_salt"] = cache_salt
    try:
        with service_client.http_client() as client:
            response = client.post("/v1/chat/completions", json=body)
    except httpx.HTTPError as exc:
        raise ServiceCallError(f"the model endpoint {settings.CHAT_INTERNAL_API_URL} is unreachable: {exc}") from exc
    if response.status_code != 200:
        raise ServiceCallError(f"the model endpoint answered {response.status_code}: {response.text[:500]}")
    try:
        return response.json()["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ServiceCallError(f"the model endpoint sent no completion: {response.text[:500]}") from exc


@dataclass(frozen=True)
class Extraction:
    """What one run did. ``status``: ``stored`` (this run's facts were stored; ``stored`` may be
    0 when the model found none or all were near-duplicates), ``disabled`` (memory off for the
    deployment or the owner), ``zero_retention``, ``gone`` (no such conversation), ``not_idle``,
    ``done`` (this idle period already extracted), ``claimed`` (another run holds the lease),
    ``lost`` (another run stored first), ``failed`` (the model endpoint failed; retried by a
    later sweep)."""

    status: str
    stored: int = 0

    def as_dict(self) -> dict:
        return {"status": self.status, "stored": self.stored}


@regions.routed  # the conversation region's database (conversations/regions.py)
def _conversation(*, conversation_id: UUID) -> Conversation | None:
    return Conversation.objects.filter(pk=conversation_id).first()


@regions.routed
def _exchanges(*, conversation_id: UUID, after: datetime | None, through: datetime) -> list[tuple[str, str]]:
    """(current user message, usable answer or "") of the positions begun after ``after`` and by
    ``through``, oldest first; texts cut to MESSAGE_CHARS."""
    exchanges = []
    for position in selectors.positions_after(conversation_id=conversation_id, after=after):
        if position.question.created_at > through:
            continue  # a later period's
        answer = position.usable_answer()
        question = position.question.content[:MESSAGE_CHARS]
        if question.strip():
            exchanges.append((question, answer.content[:MESSAGE_CHARS] if answer is not None else ""))
    return exchanges


def _chunks(exchanges: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """``exchanges`` in consecutive chunks whose extraction prompt fits the service pool's
    context less the answer budget (token counts by the served model's chat template); a single
    exchange too long alone is clipped until it fits."""
    encode_chat = get_engine().encode_chat
    pool = gate.route_for(caller_for(service_user())).pool
    room = pool.max_context - settings.CHAT_MEMORY_EXTRACT_MAX_TOKENS

    def fits(chunk) -> bool:
        return len(encode_chat(extraction_messages(chunk))) <= room

    chunks: list[list[tuple[str, str]]] = []
    chunk: list[tuple[str, str]] = []
    for q, a in exchanges:
        if chunk and fits([*chunk, (q, a)]):
            chunk.append((q, a))
            continue
        if chunk:
            chunks.append(chunk)
        while not fits([(q, a)]) and (q or a):
            q, a = q[: int(len(q) * CLIP_FACTOR)], a[: int(len(a) * CLIP_FACTOR)]
        chunk = [(q, a)]
    if chunk:
        chunks.append(chunk)
    return chunks


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
    owner = User.objects.filter(pk=conversation.owner_id).first()
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
        facts: list[str] = []
        salt = user_cache_salt(owner, conversation.org)  # their data: their prefix cache
        for chunk in _chunks(_exchanges(conversation_id=conversation_id, after=expected, through=through)):
            facts.extend(model_facts(chunk, cache_salt=salt))
    except ServiceCallError as exc:
        _release(conversation_id, lease)
        logger.warning("memory extraction of conversation %s failed: %s", conversation_id, exc)
        return Extraction("failed")
    except ValueError as exc:  # not the JSON asked for: this period yields nothing
        logger.warning("memory extraction of conversation %s: %s", conversation_id, exc)
        facts = []
    except BaseException:
        _release(conversation_id, lease)
        raise
    return _store(conversation, owner, facts[: extract_max_facts()], expected=expected, through=through)


def _store(conversation, owner, facts: list[str], *, expected, through) -> Extraction:
    """Move the marker from ``expected`` to ``through`` and store ``facts``, in one transaction
    on the conversation's database (the facts' own transaction, on the owner's home region's
    database, is nested in it: one transaction when that is the same database); nothing when
    another run moved the marker first."""
    from memory.services import memory_add  # noqa: PLC0415 - memory.services imports the models

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
                    stored = memory_add(
                        user=owner, texts=facts, source="extracted",
                        source_conversation_id=conversation.pk,
                    )  # fmt: skip
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


def memory_sweep(*, now: datetime | None = None, limit: int | None = None) -> list[UUID]:
    """Queue ``memory.memory_extract`` for conversations due an extraction at ``now``: last turn
    at least ``CHAT_MEMORY_IDLE_S`` ago and within ``CHAT_MEMORY_SWEEP_LOOKBACK_S`` (default 7
    days) before that, not covered by their marker, not leased, not queued in the last
    ``CHAT_MEMORY_REQUEUE_AFTER_S`` (default: the larger of the lease and the broker's
    visibility timeout), owner with memory on, outside zero-retention organisations and not a
    temporary chat; at most
    ``limit`` (``CHAT_MEMORY_SWEEP_LIMIT``, default 500) per region database, oldest first.
    Returns the conversation ids queued. A failure to queue one is logged (the next sweep
    retries it)."""
    from memory.tasks import memory_extract  # noqa: PLC0415 - tasks imports this module

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
                memory_extract.delay(str(conversation_id))
            except Exception:  # noqa: BLE001 - the next sweep queues it again
                logger.exception("could not queue the memory extraction of %s", conversation_id)
                continue
            queued.append(conversation_id)
        ExtractionMarker.objects.using(alias).filter(pk__in=queued).update(queued_at=now)
    if queued:
        logger.info("memory sweep: queued %d extraction(s)", len(queued))
    return queued
