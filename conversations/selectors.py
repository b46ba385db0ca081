"""Reads of conversations and turns, permission-checked: access (the user's own conversation,
or one shared with a workspace they are in; the zero-retention decision), turns and answers by
id, the exchanges and turn tree of the branch shown with their versions, and the history a
prompt is assembled from.

Pages (of exchanges, turns, conversations) are in conversations/page_selectors.py; full-text
search in conversations/search_selectors.py. Both build on the helpers here
(:func:`with_held`, :func:`turn_order`, :func:`member_org_ids`); this module imports neither.

Other apps read through this module. Apps that read a conversation's turns themselves (exports,
share links, ratings) get from here, re-exported, the answers held for write-back
(conversations/held.py), the turn tree (conversations/versions.py), the tool rounds
(conversations/toolrounds.py) and a turn's stored values (conversations/turndata.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db.models import Q, QuerySet
from django.http import Http404

from accounts.models import Membership, Organisation, User
from conversations import cache, held, toolrounds, versions
from conversations.held import held_turns  # noqa: F401 - re-exported
from conversations.models import Conversation, Turn
from conversations.toolrounds import (  # noqa: F401 - re-exported
    ToolUse,
    calls_uses,
    made_calls,
    pending_calls,
    results_by_call_turn,
    tool_uses,
)
from conversations.turndata import turn_values  # noqa: F401 - re-exported
from conversations.versions import Tree, positions_build, tree_build  # noqa: F401 - re-exported
from core import regions


def conversation_zero_retention(conversation: Conversation) -> bool:
    """The one zero-retention decision: whether ``conversation`` keeps nothing at rest (its
    turns are never written to PostgreSQL and their transient copies expire within
    ``settings.CHAT_ZDR_TTL_S`` seconds). Decided from the conversation, which names its owner
    and organisation: today a zero-retention organisation (``Organisation.zero_retention``; one
    indexed query when the conversation has one, none otherwise), or the owner's temporary chat
    (``Conversation.temporary``, issue 18: no query). Every writer asks this function (services,
    write-back, summaries, memory, attachments, sharing, feedback)."""
    if conversation.temporary:
        return True
    if conversation.org_id is None:
        return False
    return Organisation.objects.filter(pk=conversation.org_id, zero_retention=True).exists()


def retention_days_for_tier(tier: str) -> int | None:
    """Days a conversation of a ``tier`` owner is kept after its last turn (None: kept).
    Source: ``settings.CHAT_RETENTION_DAYS_BY_TIER`` (the issue: free 30 days, paid kept). The
    purge that applies it is conversations/retention.py."""
    return settings.CHAT_RETENTION_DAYS_BY_TIER.get(tier)


def conversation_list(*, user: User) -> QuerySet[Conversation] | regions.Merged:
    """The user's conversations, most recently active first (from every region's database,
    merged: core/regions.py; lazy, but the call reads the user's memberships, so
    call it from sync code). An organisation's conversations only while the user is a member.
    Temporary chats are never listed (they are in no history), nor chats in a project: they are
    listed under it (projects/selectors.py ``project_conversations``), as ChatGPT does."""
    return regions.merged(
        [
            objects.filter(owner=user, temporary=False, project__isnull=True)
            .filter(Q(org__isnull=True) | Q(org_id__in=member_org_ids(user)))
            .order_by("-last_turn_at", "-created_at")
            for objects in regions.managers(Conversation, user=user)
        ],
        key=lambda c: (c.last_turn_at, c.created_at),
        reverse=True,
    )


@regions.routed
def conversation_get_for_user(*, conversation_id: UUID, user: User) -> Conversation:
    """Return the user's conversation. Raises Http404 if missing *or* not theirs (so an id
    never reveals that someone else's conversation exists).

    A conversation that belongs to an organisation's workspace is the organisation's data: its
    owner reaches it only while a member (issue 8: removing a member revokes their access to
    the organisation's conversations at once; membership is read on every call, one indexed
    query on the global database, none for a personal conversation)."""
    try:
        conversation = Conversation.objects.get(conversation_id=conversation_id, owner_id=user.pk)
    except Conversation.DoesNotExist:
        raise Http404("No such conversation.") from None
    if conversation.org_id is not None and not _is_member(user, conversation.org_id):
        raise Http404("No such conversation.")
    return conversation


def _is_member(user: User, org_id: int) -> bool:
    return Membership.objects.filter(organisation_id=org_id, user_id=user.pk).exists()


def member_org_ids(user: User) -> list[int]:
    # Evaluated here: the list goes into queries on region databases (no cross-database join).
    return list(Membership.objects.filter(user_id=user.pk).values_list("organisation_id", flat=True))


aconversation_get_for_user = sync_to_async(conversation_get_for_user)


@regions.routed
def conversation_view_for_user(*, conversation_id: UUID, user: User) -> Conversation:
    """Return a conversation ``user`` may *read*: their own (what
    :func:`conversation_get_for_user` returns: an organisation's only while they are a member), or one shared with its organisation's workspace
    (``shared_with_org``) when both ``user`` and the conversation's owner are members of that
    organisation now. Only the owner may write: callers render the result read-only when
    ``conversation.owner_id != user.pk``.

    Membership is read on every call (no cache), so removing a member, or the owner leaving,
    takes the access away on the very next request. Raises Http404 if the conversation is
    missing *or* not readable (an anonymous user, another organisation's member, a removed
    member, a conversation not shared), so an id never reveals that it exists.
    """
    if not getattr(user, "is_authenticated", False):
        raise Http404("No such conversation.")
    conversation = Conversation.objects.filter(conversation_id=conversation_id).first()
    if conversation is None:
        raise Http404("No such conversation.")
    if conversation.owner_id == user.pk:
        if conversation.org_id is None or _is_member(user, conversation.org_id):
            return conversation
        raise Http404("No such conversation.")
    if conversation_shared_with(
        conversation=conversation, user=user
    ):
        return conversation
    raise Http404("No such conversation.")


def conversation_shared_with(*, conversation: Conversation, user: User) -> bool:
    """Whether ``conversation`` is shared with a workspace that ``user`` (not its owner) reads
    now: it is ``shared_with_org``, and both ``user`` and its owner are current members of its
    organisation (one indexed query on the global database; none when it is not shared)."""
    if not conversation.shared_with_org or conversation.org_id is None:
        return False
    people = {user.pk, conversation.owner_id}
    members = Membership.objects.filter(
        organisation_id=conversation.org_id, user_id__in=people
    ).values_list("user_id", flat=True)
    return set(members) == people


def turn_order(turn: Turn) -> tuple:
    return turn.created_at, str(turn.turn_id)  # the database's order (UUIDs compare as hex)


def with_held(conversation_id: UUID, turns: list[Turn], keep=None) -> list[Turn]:
    """``turns`` (read from PostgreSQL, oldest first) plus the conversation's turns held in Redis
    and not among them (conversations/held.py: answers awaiting write-back, zero-retention
    turns), oldest first. ``keep(turn)`` filters the held ones to the caller's range."""
    known = {t.turn_id for t in turns}
    extra = [
        t
        for t in held.held_turns(conversation_id)
        if t.turn_id not in known and (keep is None or keep(t))
    ]
    return sorted(turns + extra, key=turn_order) if extra else turns


def turn_list(*, conversation: Conversation) -> list[Turn]:
    """All turns of a conversation in the order they were written (held ones included); from
    the hot cache (conversations/cache.py) when its entry is current and holds them all."""
    history = cache.history(conversation.conversation_id, last_turn_at=conversation.last_turn_at)
    if history is not None and history.complete:
        turns = list(history.turns)
    else:
        turns = list(conversation.turns.order_by("created_at", "turn_id"))
    return with_held(conversation.conversation_id, turns)


def _turn_get(conversation: Conversation, turn_id: UUID, role: str, missing: str) -> Turn:
    """The conversation's turn ``turn_id`` of ``role``, stored or only in Redis (held for
    write-back, or zero-retention). Raises Http404(``missing``) if there is none."""
    try:
        return conversation.turns.get(turn_id=turn_id, role=role)
    except Turn.DoesNotExist:
        pass
    for turn in held.held_turns(conversation.conversation_id):
        if turn.turn_id == turn_id and turn.role == role:
            return turn
    raise Http404(missing)


def user_turn_get(*, conversation: Conversation, turn_id: UUID) -> Turn:
    """A user turn of this conversation (a zero-retention one from Redis). Raises Http404 if
    there is none with that id."""
    return _turn_get(conversation, turn_id, Turn.Role.USER, "No such message in this conversation.")


@regions.routed
def reply_get(*, turn: Turn) -> Turn | None:
    """The assistant answer to a user turn (stored, or held awaiting write-back), or None if
    it has none yet."""
    # The newest answer: a regenerated answer (conversations/versions.py) replaces the one shown.
    stored = (
        Turn.objects.filter(conversation_id=turn.conversation_id, reply_to_id=turn.turn_id)
        .order_by("-created_at", "-turn_id")
        .first()
    )
    pending = [t for t in held.held_turns(turn.conversation_id) if t.reply_to_id == turn.turn_id]
    candidates = ([stored] if stored is not None else []) + pending
    return max(candidates, key=turn_order) if candidates else None


@dataclass(frozen=True)
class Exchange:
    """A user turn and the assistant's answer to it (None while it is being generated).

    ``answers``: every version of the answer, oldest first (``answer`` is the one shown); empty
    when there is none. ``questions``: every version of the question (its siblings in the turn
    tree, ``question`` among them), oldest first; empty when unknown (conversations/versions.py).
    ``tool_uses``: the calls and results of the tool rounds the answer shown was written after
    (conversations/toolrounds.py ``tool_uses``); empty when it follows none or they were not
    read (:func:`conversations.page_selectors.exchange_page` reads them)."""

    question: Turn
    answer: Turn | None
    answers: tuple[Turn, ...] = ()
    questions: tuple[Turn, ...] = ()
    tool_uses: tuple[toolrounds.ToolUse, ...] = ()


def exchange_list(*, conversation: Conversation) -> list[Exchange]:
    """The conversation as question/answer pairs, oldest first, for rendering: the positions of
    the selected path of its turn tree (conversations/versions.py; ``branch_choices``), each
    with its question's versions and the version of its answer shown (``answer_choices``)."""
    positions = versions.positions_build(
        turn_list(conversation=conversation), conversation.branch_choices, conversation.answer_choices
    )
    return [
        Exchange(
            question=p.question, answer=p.answer, answers=tuple(p.answers), questions=tuple(p.questions)
        )
        for p in positions
    ]


def conversation_tree(*, conversation: Conversation) -> versions.Tree:
    """The turn tree of ``conversation`` (every turn, held ones included; conversations/
    versions.py)."""
    return versions.tree_build(turn_list(conversation=conversation))


def selected_path(*, conversation: Conversation) -> list[Turn]:
    """The turns of the branch the page shows, oldest first: each position's question and the
    answer shown (the version chosen, else the newest; none while one is being written)."""
    turns: list[Turn] = []
    for exchange in exchange_list(conversation=conversation):
        turns.append(exchange.question)
        if exchange.answer is not None:
            turns.append(exchange.answer)
    return turns


def new_message_parent(*, conversation: Conversation, replaces: Turn | None = None) -> UUID | None:
    """The parent a new user message gets in the turn tree: the edited message's parent for an
    edit (``replaces``), else the last message of the selected path; None for a first message."""
    tree = conversation_tree(conversation=conversation)
    if replaces is not None:
        return tree.parent_of(replaces)
    leaf = tree.leaf(conversation.branch_choices)
    return leaf.turn_id if leaf is not None else None


def answer_get(*, conversation: Conversation, turn_id: UUID) -> Turn:
    """An assistant turn of this conversation (stored, or held awaiting write-back). Raises
    Http404 if there is none with that id."""
    return _turn_get(conversation, turn_id, Turn.Role.ASSISTANT, "No such answer in this conversation.")


@regions.routed
def answer_versions(*, answer: Turn) -> list[Turn]:
    """Every version of ``answer`` (the answers to its question), oldest first."""
    stored = list(
        Turn.objects.filter(
            conversation_id=answer.conversation_id,
            reply_to_id=answer.reply_to_id,
            role=Turn.Role.ASSISTANT,
        ).order_by("created_at", "turn_id")
    )
    return versions.answer_versions(with_held(answer.conversation_id, stored), answer)


@dataclass(frozen=True)
class PromptContext:
    """What a conversation's prompt is assembled from (inference/prompts.py prompt_assemble).

    ``summary``: the running summary to use ("" for none). ``exchanges``: (question, answer)
    texts after the part the summary covers and before the question's position, oldest first.
    ``summarised``: how many exchanges the summary stands for."""

    summary: str
    exchanges: list[tuple[str, str]]
    summarised: int


def _turns_after(conversation_id: UUID, after) -> list[Turn]:
    query = Turn.objects.filter(conversation_id=conversation_id)
    if after is not None:
        query = query.filter(created_at__gt=after)
    turns = list(
        query.order_by("created_at", "turn_id").only(
            "turn_id", "conversation_id", "role", "content", "status", "reply_to_id",
            "replaces_id", "parent_id", "continues_id", "created_at", "tool_calls", "tool_call_id",
        )
    )  # fmt: skip
    return with_held(conversation_id, turns, keep=lambda t: after is None or t.created_at > after)


@regions.routed
def positions_after(*, conversation_id: UUID, after) -> list[versions.Position]:
    """The positions of the conversation's selected path (conversations/versions.py) whose
    question was written after ``after`` (a datetime; None: all), each with its versions
    (stored and held turns), oldest first. [] if the conversation is gone."""
    positions, _ = path_with_turns(conversation_id=conversation_id)
    return [p for p in positions if after is None or p.question.created_at > after]


@regions.routed
def path_with_turns(*, conversation_id: UUID) -> tuple[list[versions.Position], list[Turn]]:
    """(the positions of the conversation's selected path, oldest first; every turn they were
    built from, stored and held, oldest first): for a reader that needs the tool rounds of the
    answers too (their calling answers and ``tool`` turns, conversations/toolrounds.py), from
    the same read. ([], []) if the conversation is gone."""
    conversation = Conversation.objects.filter(pk=conversation_id).first()
    if conversation is None:
        return [], []
    turns = _turns_after(conversation_id, None)
    return versions.positions_build(turns, conversation.branch_choices, conversation.answer_choices), turns


@regions.routed
def prompt_context(
    *,
    conversation_id: UUID,
    question: Turn,
    planned: bool = False,
    last_turn_at=None,
    answer_choices: Mapping[str, str] | None = None,
) -> PromptContext:
    """The history for answering ``question`` (a user turn, stored or held): the running
    summary (Conversation.summary, covering the positions whose first message was written up
    to ``summary_through``) and the positions after it and before the question's own, each
    with its newest message version and newest usable answer (conversations/versions.py).

    Read from the hot cache (conversations/cache.py) when its entry holds the question and
    every turn after the summary, else from PostgreSQL; answers held for write-back are merged
    either way. If the question edits a message the summary covers, the summary (which speaks
    of later turns too) is not used and the history is read from the start.
    ``planned``: ``question`` is not stored yet (a turn being admitted: its prompt is sized for
    the rate limit before anything is written); the cache entry is then current when it is as
    new as ``last_turn_at`` (the conversation row's). ``answer_choices``: the conversation
    row's (question id -> answer id chosen with `<`/`>`): each exchange carries the answer
    version the page shows; None: the newest.
    Raises Conversation.DoesNotExist if the conversation is gone.
    """
    if planned:
        history = cache.history(conversation_id, last_turn_at=last_turn_at)
    else:
        history = cache.history(conversation_id, holding=question.turn_id)
    if history is None:
        raise Conversation.DoesNotExist(f"conversation {conversation_id} is gone")
    through = history.summary_through if history.summary else None
    for after in ([through, None] if through is not None else [None]):
        if history.covers_after(after):
            turns = with_held(
                conversation_id,
                history.turns_after(after),
                keep=lambda t, after=after: after is None or t.created_at > after,
            )
        else:
            turns = _turns_after(conversation_id, after)
        if all(t.turn_id != question.turn_id for t in turns):
            turns.append(question)
        tree = versions.tree_build(turns)
        chain = tree.ancestors(question.turn_id)
        if after is None or _summary_continues(chain[0] if chain else question, after):
            break
    summarised = 0
    if after is not None:
        summarised = Turn.objects.filter(
            conversation_id=conversation_id, role=Turn.Role.USER, replaces__isnull=True,
            created_at__lte=after,
        ).count()  # fmt: skip
    return PromptContext(
        summary=history.summary if after is not None else "",
        exchanges=versions.prompt_exchanges((tree.position(q, answer_choices) for q in chain), turns),
        summarised=summarised,
    )


def _summary_continues(first: Turn, through) -> bool:
    """Whether the running summary (covering the selected path down to the message written at
    ``through``) is the history before ``first``, the oldest message of a question's branch
    after ``through``: ``first``'s parent is that very message. Not for a message that edits
    one the summary covers or that sits on another branch: the summary speaks of other turns.
    A message written before branches existed (no stored parent, no edit) follows the then-last
    message, as the summary does (conversations/versions.py, the old linear reading)."""
    parent_id = getattr(first, "parent_id", None)
    if parent_id is None:
        return first.replaces_id is None and first.created_at > through
    written = Turn.objects.filter(pk=parent_id).values_list("created_at", flat=True).first()
    return written == through


