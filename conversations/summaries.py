"""Running summaries: when a conversation outgrows its prompt budget, the model summarises the
older turns in a Celery job, and prompts use the summary from then on (issue 4, "Context
assembly and summarisation").

1. A turn whose prompt left out earlier exchanges, or fills ``CHAT_SUMMARY_TRIGGER_FRACTION``
   of its budget (:func:`summary_wanted`), queues :func:`conversation_summarise` after its
   answer is stored (:func:`summary_request`, on commit: PF-J2).
2. The task (:func:`summary_update`) keeps verbatim the newest exchanges that fit in
   ``CHAT_SUMMARY_KEEP_FRACTION`` of the budget and folds every older exchange the summary does
   not cover yet into it, a chunk at a time (each chunk's prompt fits the model's context): the
   previous summary plus new exchanges give the next summary, so summaries of summaries as the
   conversation grows.
3. After each chunk the summary is stored (``services.conversation_summary_store``, a
   compare-and-set on ``summary_through``), so a retried or duplicate run repeats no work and
   never replaces a newer summary. Nothing new to fold: the task does nothing.

The model is called through the server's own OpenAI-compatible endpoint with the service
credential (inference/service_client.py; DESIGN.md, "How background jobs reach the model").
Zero-retention conversations are never summarised (the summary would be stored).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from uuid import UUID

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError, InterfaceError, transaction

from accounts.callers import caller_for
from accounts.services import service_user
from conversations import selectors, services
from conversations.models import Conversation
from conversations.selectors import conversation_zero_retention
from core import regions
from gateway import gate
from gateway.tenancy import cache_salt_for
from inference.engine import get_engine
from inference.prompts import AssembledPrompt, chat_messages, largest_fitting
from inference.service_client import ServiceCallError, chat_complete

logger = logging.getLogger(__name__)

SUMMARY_INSTRUCTIONS = (
    "You keep a running summary of a conversation between a user and an AI assistant. "
    "Rewrite the summary so that it also covers the new messages. Keep names, facts, numbers, "
    "decisions, preferences and open questions; drop small talk. Write a few plain sentences "
    "in the third person and nothing else."
)
# The share of a message's text kept when a single exchange is too long for one summary
# prompt: it is cut to this fraction, repeatedly, until the prompt fits.
CLIP_FACTOR = 0.5


def summary_wanted(assembled: AssembledPrompt) -> bool:
    """Whether a turn's prompt shows the conversation outgrowing its budget: exchanges were
    left out, or the prompt fills ``settings.CHAT_SUMMARY_TRIGGER_FRACTION`` of the budget."""
    return (
        assembled.dropped_exchanges > 0
        or assembled.fill >= settings.CHAT_SUMMARY_TRIGGER_FRACTION
    )


def summary_request(*, conversation_id: UUID) -> None:
    """Queue :func:`conversation_summarise` when the current transaction commits (at once
    outside one; never if it rolls back, PF-J2). A failure to queue is logged, never raised:
    a later turn asks again."""

    def queue():
        try:
            conversation_summarise.delay(str(conversation_id))
        except Exception:  # noqa: BLE001 - a summary is an optimisation; the answer stands
            logger.exception("could not queue the summary of conversation %s", conversation_id)

    transaction.on_commit(queue)


def summary_messages(summary: str, exchanges: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    """The chat messages that ask the model for the next running summary from the previous
    one (``summary``, "" for none) and new (question, answer) exchanges, oldest first."""
    transcript = "\n".join(f"User: {q}\nAssistant: {a}" for q, a in exchanges)
    return [
        {"role": "system", "content": SUMMARY_INSTRUCTIONS},
        {
            "role": "user",
            "content": f"Summary so far:\n{summary or '(none yet)'}\n\n"
            f"New messages:\n{transcript}\n\nUpdated summary:",
        },
    ]


def _summarise(summary: str, exchanges: list[tuple[str, str]], fits, cache_salt: str | None = None) -> str:
    """The model's next summary (stripped), asked under ``cache_salt`` (the conversation owner's
    prefix-cache salt). Raises ServiceCallError, or ValueError if the model wrote nothing."""
    while not fits(summary, exchanges):  # one exchange alone too long: clip its texts
        (q, a), *rest = exchanges
        exchanges = [(q[: int(len(q) * CLIP_FACTOR)], a[: int(len(a) * CLIP_FACTOR)]), *rest]
        if not exchanges[0][0] and not exchanges[0][1]:
            break
    text = chat_complete(
        summary_messages(summary, exchanges),
        max_tokens=settings.CHAT_SUMMARY_MAX_TOKENS,
        temperature=0.0,
        cache_salt=cache_salt,
    ).strip()
    if not text:
        raise ValueError("the model wrote an empty summary")
    return text


@regions.routed  # the conversation region's database (core/regions.py)
def summary_update(*, conversation_id: UUID) -> bool:
    """Fold the conversation's older exchanges into its running summary (module docstring).

    The exchanges are those of the branch the page shows (the selected path of the turn tree);
    when the summary so far is of another branch, nothing is folded.
    Returns True if a new summary was stored, False if there was nothing to fold (or the
    conversation is gone, zero-retention, on another branch than its summary, or another run
    got there first). Token counts use
    the served model's chat template (``get_engine().encode_chat``: only the tokenizer is
    loaded, no engine is started). Raises ServiceCallError if the model endpoint fails, and
    ValueError if it returns an empty summary (what was stored before stays).
    """
    conversation = Conversation.objects.filter(pk=conversation_id).first()
    if conversation is None or conversation_zero_retention(conversation):
        return False
    through = conversation.summary_through if conversation.summary else None
    summary = conversation.summary if through is not None else ""
    path = selectors.positions_after(conversation_id=conversation_id, after=None)
    if through is not None and all(p.question.created_at != through for p in path):
        return False  # the summary is of another branch (conversations/versions.py): keep it
    positions = [p for p in path if through is None or p.question.created_at > through]
    answered = [(p, p.usable_answer()) for p in positions]
    pairs = [(p, (p.question.content, a.content)) for p, a in answered if a is not None]
    encode_chat = get_engine().encode_chat
    # The turns' prompt budget is their pool's context less an answer (gateway/gate.py); the
    # summary itself is written by the service credential's pool.
    owner = caller_for(conversation.owner, conversation.org)
    turn_pool = gate.route_for(owner, fallback=conversation.model).pool
    summariser_pool = gate.route_for(caller_for(service_user())).pool
    budget = turn_pool.max_context - min(settings.CHAT_MAX_TOKENS, turn_pool.max_tokens)
    keep_budget = int(budget * settings.CHAT_SUMMARY_KEEP_FRACTION)
    # The instructions as a turn's prompt has them (conversations/plan.py), memory aside.
    instructions = {
        "system_prompt": settings.CHAT_SYSTEM_PROMPT,
        "custom_instructions": conversation.owner.custom_instructions,
        "conversation_prompt": conversation.system_prompt,
    }

    def recent_fit(k: int) -> bool:
        recent = [x for _, x in pairs[len(pairs) - k :]] if k else []
        messages = chat_messages(**instructions, summary=summary, exchanges=recent)
        return len(encode_chat(messages)) <= keep_budget

    keep = largest_fitting(len(pairs), recent_fit)
    fold = pairs[: len(pairs) - keep]
    if not fold:
        return False
    prompt_room = summariser_pool.max_context - settings.CHAT_SUMMARY_MAX_TOKENS

    def fits(summary_so_far: str, exchanges: list[tuple[str, str]]) -> bool:
        return len(encode_chat(summary_messages(summary_so_far, exchanges))) <= prompt_room

    stored = False
    chunk: list = []
    for index, (position, exchange) in enumerate(fold):
        chunk.append((position, exchange))
        following = fold[index + 1][1] if index + 1 < len(fold) else None
        if following is not None and fits(summary, [x for _, x in chunk] + [following]):
            continue
        new_summary = _summarise(summary, [x for _, x in chunk], fits, cache_salt_for(owner))
        new_through = chunk[-1][0].question.created_at
        if not services.conversation_summary_store(
            conversation_id=conversation_id,
            summary=new_summary,
            through=new_through,
            expected_through=through,
        ):
            return stored  # another run moved it on: its summary stands
        summary, through, stored, chunk = new_summary, new_through, True, []
    logger.info("conversation %s summarised through %s", conversation_id, through)
    return stored


@shared_task(
    name="conversations.conversation_summarise",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(DatabaseError, InterfaceError),
    retry_backoff=5,
    max_retries=3,
)
def conversation_summarise(conversation_id: str) -> bool:
    """Celery: :func:`summary_update` for ``conversation_id`` (a UUID string). Idempotent (a
    redelivered run finds nothing new, or stores the same fold once). A model endpoint that
    fails is logged, not retried: the next turn that needs a summary queues this again."""
    try:
        return summary_update(conversation_id=UUID(conversation_id))
    except (ServiceCallError, ValueError) as exc:
        logger.warning("summary of conversation %s not updated: %s", conversation_id, exc)
        return False
