"""Every write to conversations and turns. Keyword-only, typed, one transaction each.

Their deletion is conversations/deletion.py (it also stops the answer being generated and drops
the Redis copies); its functions are re-exported here, so other apps delete through this module.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from redis.exceptions import RedisError

from accounts.models import Organisation, User
from accounts.selectors import turn_training_eligible
from conversations import cache, held, versions
from conversations.deletion import (  # noqa: F401 - re-exported: the one deletion service
    Deleted,
    aconversation_delete,
    conversation_delete,
    conversations_delete,
)
from conversations.models import Conversation, Turn
from conversations.selectors import conversation_zero_retention
from conversations.versions import choice_key  # noqa: F401 - re-exported: branch_choices' keys
from core import db_breaker, regions

logger = logging.getLogger(__name__)


def message_clean(content: str) -> str:
    """Validate a user's message and return it with surrounding whitespace removed.

    Raises ValidationError (code ``empty`` or ``too_long``) for an empty or whitespace-only
    message, or one over ``settings.CHAT_MAX_MESSAGE_CHARS`` characters.
    """
    text = (content or "").strip()
    if not text:
        raise ValidationError("Type a message before sending.", code="empty")
    if "\x00" in text:
        raise ValidationError(
            "Your message contains a NUL character (U+0000); remove it and send again.",
            code="nul",
        )
    limit = settings.CHAT_MAX_MESSAGE_CHARS
    if len(text) > limit:
        raise ValidationError(
            f"Your message is {len(text):,} characters long; the limit is {limit:,}. "
            "Shorten it or split it into several messages.",
            code="too_long",
        )
    return text


def title_from_message(text: str) -> str:
    """A sidebar title from a first message: its first line, cut at a word boundary to at most
    ``settings.CHAT_TITLE_CHARS`` characters (with an ellipsis when cut)."""
    first_line = " ".join(text.split("\n", 1)[0].split())
    limit = settings.CHAT_TITLE_CHARS
    if len(first_line) <= limit:
        return first_line
    cut = first_line[: limit - 1].rsplit(" ", 1)[0] or first_line[: limit - 1]
    return cut + "\u2026"


@transaction.atomic
def conversation_create(
    *,
    owner: User,
    model: str | None = None,
    title: str = "",
    system_prompt: str = "",
    org: Organisation | None = None,
    temporary: bool = False,
    project=None,
) -> Conversation:
    """Create an empty conversation for ``owner`` in its home region's database: the
    organisation's region when it belongs to one (``org``, else the owner's first organisation),
    else the owner's (core/regions.py: home_region). Its id names the region.

    ``model``: the pool its turns ask for (a pool name, ``name@version``, or the served model's
    name, which means the tier's default pool; inference/pools.py). Whether the owner's tier may
    use it is checked per turn (gateway/gate.py), so a tier change never strands a
    conversation.
    ``system_prompt``: the conversation's own instructions (:func:`system_prompt_clean`).
    ``temporary``: a temporary chat (kept nowhere at rest: selectors.conversation_zero_retention;
    never listed; deleted when its page goes or CHAT_ZDR_TTL_S after its last turn).
    ``project``: the projects.models.Project it starts in (the caller checked the owner may open
    it: projects/selectors.py); the conversation then belongs to the project's organisation (or
    none) and lives in the project's region, beside it, with no failover elsewhere.
    Raises ValidationError if ``model`` is given and names no pool or model here, if the owner
    is not a member of ``org``, or (RegionUnavailable) if the home region has no database here.
    While the home region's primary is down the conversation is created in its failover region
    if residency allows, else PrimaryDown (503) is raised (regions.region_for_new_conversation).
    """
    model_check(model)
    if project is not None:  # where the project is: a foreign key never crosses databases
        region, org = project.region, project.org
        db_breaker.primary_ensure(regions.db_for_region(region))
    else:
        region, org = regions.home_region(owner=owner, org=org)
        region = regions.region_for_new_conversation(region, org=org)
    objects = regions.manager(Conversation, regions.db_for_region(region), user_id=owner.pk)
    return objects.create(
        conversation_id=regions.new_conversation_id(region),
        owner=owner,
        org=org,
        title=title,
        model=model or settings.CHAT_MODEL_NAME,
        system_prompt=system_prompt_clean(system_prompt),
        region=region,
        temporary=temporary,
        project=project,
    )


# The longest conversation prompt (characters), as POST /v1/conversations allows (api/schemas.py).
SYSTEM_PROMPT_MAX_CHARS = 8000


def system_prompt_clean(text: str | None) -> str:
    """A conversation's own instructions, stripped (blank: none). Raises ValidationError for a
    text over ``SYSTEM_PROMPT_MAX_CHARS`` characters (code ``too_long``) or holding NUL
    (PostgreSQL text cannot store U+0000; code ``nul``)."""
    text = (text or "").strip()
    if "\x00" in text:
        raise ValidationError("Instructions cannot contain the NUL character.", code="nul")
    if len(text) > SYSTEM_PROMPT_MAX_CHARS:
        raise ValidationError(
            f"Instructions can be at most {SYSTEM_PROMPT_MAX_CHARS:,} characters "
            f"(these are {len(text):,}).",
            code="too_long",
        )
    return text


@regions.routed
def conversation_system_prompt_set(
    *, conversation: Conversation, system_prompt: str
) -> Conversation:
    """Set the conversation's own instructions (:func:`system_prompt_clean`; blank clears
    them). They go into the prompt from the next turn, after the memory block, so the cached
    prefix before them (site prompt, custom instructions, memory) stays valid. Raises
    ValidationError; nothing is stored then."""
    text = system_prompt_clean(system_prompt)
    Conversation.objects.filter(pk=conversation.pk).update(system_prompt=text)
    conversation.system_prompt = text
    return conversation


@transaction.atomic
@regions.atomic
def conversation_pin_toggle(*, conversation: Conversation) -> Conversation:
    """Pin ``conversation`` to the top of its owner's sidebar (``pinned_at`` = now), or unpin
    it if it is pinned (``pinned_at`` = None); returns it updated. Only that column is
    written. The caller checks ownership (selectors.conversation_get_for_user)."""
    conversation.pinned_at = None if conversation.pinned_at else timezone.now()
    Conversation.objects.filter(pk=conversation.pk).update(pinned_at=conversation.pinned_at)
    return conversation


@transaction.atomic
@regions.atomic
def conversation_rename(*, conversation: Conversation, title: str) -> Conversation:
    """Set a conversation's title. Raises ValidationError if it is blank or over 200 chars."""
    title = " ".join((title or "").replace("\x00", "").split())
    if not title:
        raise ValidationError("A title cannot be empty.", code="empty")
    if len(title) > 200:
        raise ValidationError("A title can be at most 200 characters.", code="too_long")
    conversation.title = title
    conversation.save(update_fields=["title"])
    return conversation


@transaction.atomic
@regions.atomic
def turn_append_user(
    *,
    conversation: Conversation,
    content: str,
    replaces: Turn | None = None,
    parent_id: UUID | None = None,
    moderation_verdict: dict | None = None,
    blocked: bool = False,
    owner=None,
) -> Turn:
    """Append a user turn (committed before any generation starts) and return it.

    ``parent_id``: the user message before it on its branch (None: a first message;
    selectors.new_message_parent); the branch it starts or continues becomes the one shown
    (Conversation.branch_choices, conversations/versions.py). ``replaces``: the user turn this
    one edits (append-only edits): a sibling of it, so a new branch starts there; the old one
    and the turns after it stay in the log. The caller checks both are user turns of this
    conversation. ``moderation_verdict``: the input
    gate's verdict (moderation/verdicts.py ``Verdict.as_json``); ``blocked``: the gate stopped
    the message, so it is stored with status ``blocked`` and is never answered. ``owner``:
    the conversation owner's row if the caller has just loaded it (its training opt-out is then
    read from it, accounts.selectors.turn_training_eligible; else it is queried).
    The conversation row is locked for the append so two appends to one conversation are
    serialised. The first message also names an untitled conversation.
    Raises ValidationError for an invalid message (see :func:`message_clean`); nothing is stored.
    """
    text = message_clean(content)
    replaces_id = replaces.turn_id if replaces is not None else None
    moderation = {
        "moderation_verdict": moderation_verdict or {},
        "status": Turn.Status.BLOCKED if blocked else Turn.Status.COMPLETE,
    }
    if conversation_zero_retention(conversation):
        return _zero_retention_user_turn(
            conversation=conversation, text=text, replaces_id=replaces_id, parent_id=parent_id,
            **moderation,
        )  # fmt: skip
    locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
    now = timezone.now()
    turn = Turn.objects.create(
        conversation=locked, role=Turn.Role.USER, content=text, created_at=now,
        replaces_id=replaces_id, parent_id=parent_id,
        training_eligible=turn_training_eligible(owner_id=locked.owner_id, org_id=locked.org_id, owner=owner),
        **moderation,
    )  # fmt: skip
    locked.last_turn_at = now
    locked.branch_choices = {**locked.branch_choices, versions.choice_key(parent_id): str(turn.turn_id)}
    fields = ["last_turn_at", "branch_choices"]
    if not locked.title and not blocked:  # a blocked message never names the conversation
        locked.title = title_from_message(text)
        fields.append("title")
    locked.save(update_fields=fields)
    conversation.title, conversation.last_turn_at = locked.title, locked.last_turn_at
    conversation.branch_choices = locked.branch_choices
    return turn


@transaction.atomic
@regions.atomic
def turn_append_tools(*, conversation: Conversation, answer: Turn, results: list[tuple[str, str]]) -> list[Turn]:
    """Append the results of ``answer``'s tool calls: one ``tool`` turn per (tool_call_id,
    content) in ``results``, ``reply_to`` = ``answer`` (conversations/toolrounds.py; the caller
    checked them with ``tool_results_check``), in the order given; returns them. A
    zero-retention conversation's are held in Redis only, as its user turns are. The
    conversation row is locked for the append, as for a user turn."""
    now = timezone.now()
    turns = [
        Turn(
            conversation_id=conversation.conversation_id, role=Turn.Role.TOOL, content=content,
            tool_call_id=call_id, reply_to_id=answer.turn_id, created_at=now + timedelta(microseconds=index),
        )  # fmt: skip
        for index, (call_id, content) in enumerate(results)
    ]
    if conversation_zero_retention(conversation):
        for turn in turns:
            try:
                held.hold(held.turn_record(turn, zero_retention=True), ttl_s=settings.CHAT_ZDR_TTL_S, due=False)
            except (RedisError, OSError) as exc:
                logger.warning("zero-retention tool turn %s not kept (Redis: %s)", turn.turn_id, exc)
    else:
        locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
        eligible = turn_training_eligible(owner_id=locked.owner_id, org_id=locked.org_id)
        for turn in turns:
            turn.training_eligible = eligible
        Turn.objects.bulk_create(turns)
    last = turns[-1].created_at
    Conversation.objects.filter(pk=conversation.pk, last_turn_at__lt=last).update(last_turn_at=last)
    conversation.last_turn_at = max(conversation.last_turn_at, last)
    return turns


def _zero_retention_user_turn(
    *,
    conversation: Conversation,
    text: str,
    replaces_id: UUID | None = None,
    parent_id: UUID | None = None,
    moderation_verdict: dict | None = None,
    status: str = Turn.Status.COMPLETE,
) -> Turn:
    """A zero-retention conversation's user turn: never written to PostgreSQL (issue 4,
    Retention). Its only copy is a Redis record that expires after ``settings.CHAT_ZDR_TTL_S``
    (conversations/held.py), the history for the next turns within that window. Only the
    conversation's ``last_turn_at`` and branch choice (ids, no content) are updated; no title
    is taken from the text."""
    now = timezone.now()
    turn = Turn(
        conversation=conversation, role=Turn.Role.USER, content=text, created_at=now,
        replaces_id=replaces_id, parent_id=parent_id,
        moderation_verdict=moderation_verdict or {}, status=status,
    )  # fmt: skip
    try:
        held.hold(
            held.turn_record(turn, zero_retention=True),
            ttl_s=settings.CHAT_ZDR_TTL_S,
            due=False,
        )
    except (RedisError, OSError) as exc:  # answered anyway; later turns just lack it
        logger.warning("zero-retention turn %s not kept (Redis: %s)", turn.turn_id, exc)
    locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
    locked.last_turn_at = now
    locked.branch_choices = {**locked.branch_choices, versions.choice_key(parent_id): str(turn.turn_id)}
    locked.save(update_fields=["last_turn_at", "branch_choices"])
    conversation.last_turn_at, conversation.branch_choices = now, locked.branch_choices
    return turn


@transaction.atomic
@regions.atomic
def branch_select(*, conversation: Conversation, question: Turn, parent_id: UUID | None) -> None:
    """Show the branch of user message ``question`` from now on, on every device: store it as
    the chosen child of its fork (``parent_id``, its parent in the turn tree; Conversation.
    branch_choices, conversations/versions.py). The turns are untouched (append-only); the
    caller checks that ``question`` is a user turn of ``conversation`` with that parent."""
    locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
    locked.branch_choices = {
        **locked.branch_choices, versions.choice_key(parent_id): str(question.turn_id)
    }
    locked.save(update_fields=["branch_choices"])
    conversation.branch_choices = locked.branch_choices


@transaction.atomic
@regions.atomic
def answer_select(*, conversation: Conversation, question_id: UUID, answer_id: UUID | None) -> None:
    """Show answer version ``answer_id`` for question ``question_id`` from now on, on every
    device (Conversation.answer_choices, conversations/versions.py); None forgets the choice,
    so the newest answer is shown (Regenerate and Continue: the new answer is the one to see).
    The turns are untouched (append-only); the caller checks that the answer is one of the
    conversation's and replies to that question."""
    locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
    choices = {k: v for k, v in locked.answer_choices.items() if k != str(question_id)}
    if answer_id is not None:
        choices[str(question_id)] = str(answer_id)
    if choices != locked.answer_choices:
        locked.answer_choices = choices
        locked.save(update_fields=["answer_choices"])
    conversation.answer_choices = choices


def turn_append_assistant(
    *,
    conversation_id: UUID,
    turn_id: UUID,
    reply_to_id: UUID,
    content: str,
    status: str,
    prompt_tokens: int,
    completion_tokens: int,
    created_at: datetime | None = None,
    replaces_id: UUID | None = None,
    context_trimmed: int = 0,
    pool: str = "",
    model_version: str = "",
    cached_tokens: int | None = None,
    cost_usd: Decimal | None = None,
    moderation_verdict: dict | None = None,
) -> Turn:
    """Store the assistant's answer to ``reply_to_id``; idempotent on ``turn_id``
    (:func:`answer_store` of the turn these arguments describe).

    ``moderation_verdict``: the output gate's last verdict (a ``blocked`` answer keeps the
    verdict and none of the flagged text).

    ``pool`` / ``model_version``: the pool (inference/pools.py) that answered; ``cached_tokens``:
    prompt tokens served from the prefix cache; ``cost_usd``: the answer's cost at the pool's
    prices (issue 5, usage and cost).

    ``replaces_id``: the answer this one regenerates (same ``reply_to``; conversations/
    versions.py). ``context_trimmed``: how many earlier exchanges its prompt left out or took
    from the running summary (Turn.context_trimmed; inference/prompts.py).
    """
    return answer_store(answer=Turn(
        turn_id=turn_id, conversation_id=conversation_id, role=Turn.Role.ASSISTANT,
        content=content, status=status, token_count=completion_tokens,
        prompt_tokens=prompt_tokens, reply_to_id=reply_to_id, created_at=created_at,
        replaces_id=replaces_id, context_trimmed=context_trimmed, pool=pool,
        model_version=model_version, cached_tokens=cached_tokens, cost_usd=cost_usd,
        moderation_verdict=moderation_verdict or {},
    ))  # fmt: skip


@transaction.atomic
@regions.atomic
def answer_store(*, answer: Turn) -> Turn:
    """Store ``answer``, an unsaved assistant turn (a held record's, conversations/held.py,
    or :func:`turn_append_assistant`'s); idempotent on its ``turn_id``.

    Called once per generation when its stream ends (complete, cancelled with the partial text,
    or failed), usually by the write-back task. A second call with the same ``turn_id`` returns
    the stored turn unchanged, so a retried write never stores an answer twice. Its
    ``created_at`` (None: now) is when the answer finished, so a write that lands late keeps the
    turn's place in the conversation; ``training_eligible`` is decided here from the
    conversation's owner and organisation (accounts/selectors.py ``turn_training_eligible``).
    A zero-retention conversation's answer is never stored: the unsaved turn is returned.
    Raises Conversation.DoesNotExist if the conversation is gone.
    """
    existing = Turn.objects.filter(pk=answer.turn_id).first()
    if existing is not None:
        return existing
    locked = Conversation.objects.select_for_update().get(pk=answer.conversation_id)
    # Again under the conversation's lock: two deliveries of one write-back (PF-J1) that both
    # passed the check above are serialised here, and the second finds the first's row.
    existing = Turn.objects.filter(pk=answer.turn_id).first()
    if existing is not None:
        return existing
    now = answer.created_at or timezone.now()
    answer.conversation, answer.created_at = locked, now
    if conversation_zero_retention(locked):
        return answer
    answer.training_eligible = turn_training_eligible(owner_id=locked.owner_id, org_id=locked.org_id)
    answer.save(force_insert=True)
    if locked.last_turn_at is None or now > locked.last_turn_at:
        locked.last_turn_at = now
        locked.save(update_fields=["last_turn_at"])
    return answer


def model_check(model: str | None) -> None:
    """Raise ValidationError (code ``unknown_model``) unless ``model`` is blank, the served
    model's name (settings.CHAT_MODEL_NAME) or a configured pool (``name`` or
    ``name@version``, inference/pools.py); the message lists what exists."""
    from inference.pools import pool_set  # noqa: PLC0415 - keeps the engine layer out of imports

    if not model or model == settings.CHAT_MODEL_NAME:
        return
    pools = pool_set()
    try:
        pools.resolve(model)
    except KeyError:
        names = ", ".join(pools.names())
        raise ValidationError(
            f"Unknown model {model!r}; the models here are: {names}.", code="unknown_model"
        ) from None


@regions.routed
def conversation_model_set(*, conversation: Conversation, model: str) -> None:
    """Make ``model`` (checked by :func:`model_check`) the pool the conversation's next turns
    ask for; the turns already answered keep the pool that answered them (Turn.pool)."""
    model_check(model)
    Conversation.objects.filter(pk=conversation.pk).update(model=model)
    conversation.model = model


@transaction.atomic
@regions.atomic
def conversation_summary_store(
    *, conversation_id: UUID, summary: str, through: datetime, expected_through: datetime | None
) -> bool:
    """Store a conversation's running summary, covering its positions up to ``through`` (the
    ``created_at`` of the newest first message summarised; conversations/summaries.py).

    Compare-and-set: stored only if ``summary_through`` is still ``expected_through`` (what the
    summariser started from) and ``through`` moves it forward, so a late or repeated run never
    replaces a newer summary. Returns whether it was stored. Conversation.summary is state
    derived from the turns, not a turn: updating it leaves the turn log append-only.
    Raises ValidationError for a blank summary.
    """
    text = (summary or "").replace("\x00", "").strip()
    if not text:
        raise ValidationError("A summary cannot be empty.", code="empty")
    locked = Conversation.objects.select_for_update().filter(pk=conversation_id).first()
    if locked is None or locked.summary_through != expected_through:
        return False
    if expected_through is not None and through <= expected_through:
        return False
    locked.summary = text
    locked.summary_through = through
    locked.save(update_fields=["summary", "summary_through"])
    # Keep the hot cache's copy in step (conversations/cache.py), once this is committed.
    transaction.on_commit(
        lambda: cache.summary_set(conversation_id=conversation_id, summary=text, summary_through=through)
    )
    return True
