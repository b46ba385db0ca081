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
   conversation grows. An answer written after tool calls (conversations/toolrounds.py) is
   folded with a compact form of its rounds (:func:`round_digest`: each call's function and
   arguments and a short result, one line each) before its text, and counts in the verbatim
   window as a turn's prompt holds it (calls and results in full).
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
from typing import NamedTuple
from uuid import UUID

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError, InterfaceError, transaction

from accounts.callers import caller_for
from accounts.services import service_user
from conversations import selectors, services, toolrounds
from conversations.models import Conversation
from conversations.selectors import conversation_zero_retention
from core import regions
from gateway import gate
from gateway.tenancy import cache_salt_for
from inference.engine import get_engine
from inference.prompts import AssembledPrompt, chat_messages, largest_fitting
from inference.service_client import ServiceCallError, chat_complete
from inference.tool_format import chat_encoder

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
# A tool round in the summariser's input (:func:`round_digest`): at most this many calls listed
# (the rest counted), each call's arguments and result cut to these many characters. The
# summary keeps what a round found, not its raw data; the prompt as a whole is then bounded in
# tokens like any exchange (the chunking and CLIP_FACTOR above).
ROUND_CALLS_MAX = 8
ROUND_ARGUMENTS_CHARS = 200
ROUND_RESULT_CHARS = 300


class Exchange(NamedTuple):
    """One exchange as the summariser reads it: the question, the answer's text and ``tools``,
    the compact form of the tool rounds the answer was written after (:func:`round_digest`; ""
    for none)."""

    question: str
    answer: str
    tools: str = ""


def _cut(text: str, limit: int) -> str:
    """``text`` on one line (runs of whitespace as one space), at most ``limit`` characters, an
    ellipsis where it was cut."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "\u2026"


def round_digest(uses: Sequence[toolrounds.ToolUse]) -> str:
    """The tool rounds an answer was written after (conversations/toolrounds.py ``tool_uses``:
    its calls with their results, in order) as the summariser reads them: one line per call,
    ``Assistant called name(arguments) -> result``, the arguments cut to
    :data:`ROUND_ARGUMENTS_CHARS` characters and the result to :data:`ROUND_RESULT_CHARS`
    (``(no result)`` for a call without one); at most :data:`ROUND_CALLS_MAX` calls, then a
    line counting the others. "" for no calls."""
    lines = [
        f"Assistant called {use.name}({_cut(use.arguments, ROUND_ARGUMENTS_CHARS)}) -> "
        + (_cut(use.result, ROUND_RESULT_CHARS) if use.result is not None else "(no result)")
        for use in uses[:ROUND_CALLS_MAX]
    ]
    if len(uses) > ROUND_CALLS_MAX:
        lines.append(f"(and {len(uses) - ROUND_CALLS_MAX} more tool calls)")
    return "\n".join(lines)


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


def summary_messages(summary: str, exchanges: Sequence[Exchange]) -> list[dict[str, str]]:
    """The chat messages that ask the model for the next running summary from the previous
    one (``summary``, "" for none) and new exchanges (:class:`Exchange`, oldest first). An
    exchange's tool rounds go between its question and its answer, where they happened."""
    transcript = "\n".join(
        "\n".join([f"User: {e.question}", *([e.tools] if e.tools else []), f"Assistant: {e.answer}"])
        for e in exchanges
    )
    return [
        {"role": "system", "content": SUMMARY_INSTRUCTIONS},
        {
            "role": "user",
            "content": f"Summary so far:\n{summary or '(none yet)'}\n\n"
            f"New messages:\n{transcript}\n\nUpdated summary:",
        },
    ]


def _summarise(summary: str, exchanges: list[Exchange], fits, cache_salt: str | None = None) -> str:
    """The model's next summary (stripped), asked under ``cache_salt`` (the conversation owner's
    prefix-cache salt). Raises ServiceCallError, or ValueError if the model wrote nothing."""
    while not fits(summary, exchanges):  # one exchange alone too long: clip its texts
        first, *rest = exchanges
        exchanges = [Exchange(*(text[: int(len(text) * CLIP_FACTOR)] for text in first)), *rest]
        if not any(exchanges[0]):
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
    path, turns = selectors.path_with_turns(conversation_id=conversation_id)
    if through is not None and all(p.question.created_at != through for p in path):
        return False  # the summary is of another branch (conversations/versions.py): keep it
    positions = [p for p in path if through is None or p.question.created_at > through]
    answered = [(p, p.usable_answer()) for p in positions]
    answered = [(p, a) for p, a in answered if a is not None]
    by_id, results = {t.turn_id: t for t in turns}, toolrounds.results_by_call_turn(turns)
    # Each exchange as the summariser reads it, and as a turn's prompt holds it (the rounds in
    # full, conversations/versions.py prompt_exchanges) for the verbatim window.
    pairs = [
        (p, Exchange(p.question.content, a.content, round_digest(toolrounds.tool_uses(a, by_id, results))))
        for p, a in answered
    ]  # fmt: skip
    verbatim = [(p.question.content, toolrounds.answer_messages(a, by_id, results)) for p, a in answered]
    engine = get_engine()
    encode_chat = engine.encode_chat
    encode_history, _ = chat_encoder(engine, None)  # a turn's history, rounds in the tool format
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
        recent = verbatim[len(verbatim) - k :] if k else []
        messages = chat_messages(**instructions, summary=summary, exchanges=recent)
        return len(encode_history(messages)) <= keep_budget

    keep = largest_fitting(len(pairs), recent_fit)
    fold = pairs[: len(pairs) - keep]
    if not fold:
        return False
    prompt_room = summariser_pool.max_context - settings.CHAT_SUMMARY_MAX_TOKENS

    def fits(summary_so_far: str, exchanges: list[Exchange]) -> bool:
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
