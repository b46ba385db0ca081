"""Every read of conversations and turns, permission-checked."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from asgiref.sync import sync_to_async
from django.contrib.postgres.search import SearchHeadline, SearchQuery, SearchVector
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from django.http import Http404

from accounts.models import Membership, Organisation, User
from conversations import cache, held, partitions, regions, toolrounds, versions
from conversations.models import Conversation, Turn


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


def conversation_list(*, user: User) -> QuerySet[Conversation] | regions.Merged:
    """The user's conversations, most recently active first (from every region's database,
    merged: conversations/regions.py; lazy, but the call reads the user's memberships, so
    call it from sync code). An organisation's conversations only while the user is a member.
    Temporary chats are never listed (they are in no history), nor chats in a project: they are
    listed under it (projects/selectors.py ``project_conversations``), as ChatGPT does."""
    return regions.merged(
        [
            objects.filter(owner=user, temporary=False, project__isnull=True)
            .filter(Q(org__isnull=True) | Q(org_id__in=_member_org_ids(user)))
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


def _member_org_ids(user: User) -> list[int]:
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


def _turn_order(turn: Turn) -> tuple:
    return turn.created_at, str(turn.turn_id)  # the database's order (UUIDs compare as hex)


def _with_held(conversation_id: UUID, turns: list[Turn], keep=None) -> list[Turn]:
    """``turns`` (read from PostgreSQL, oldest first) plus the conversation's turns held in Redis
    and not among them (conversations/held.py: answers awaiting write-back, zero-retention
    turns), oldest first. ``keep(turn)`` filters the held ones to the caller's range."""
    known = {t.turn_id for t in turns}
    extra = [
        t
        for t in held.held_turns(conversation_id)
        if t.turn_id not in known and (keep is None or keep(t))
    ]
    return sorted(turns + extra, key=_turn_order) if extra else turns


def turn_list(*, conversation: Conversation) -> list[Turn]:
    """All turns of a conversation in the order they were written (held ones included); from
    the hot cache (conversations/cache.py) when its entry is current and holds them all."""
    history = cache.history(conversation.conversation_id, last_turn_at=conversation.last_turn_at)
    if history is not None and history.complete:
        turns = list(history.turns)
    else:
        turns = list(conversation.turns.order_by("created_at", "turn_id"))
    return _with_held(conversation.conversation_id, turns)


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
    return max(candidates, key=_turn_order) if candidates else None


@dataclass(frozen=True)
class Exchange:
    """A user turn and the assistant's answer to it (None while it is being generated).

    ``answers``: every version of the answer, oldest first (``answer`` is the one shown); empty
    when there is none. ``questions``: every version of the question (its siblings in the turn
    tree, ``question`` among them), oldest first; empty when unknown (conversations/versions.py).
    ``tool_uses``: the calls and results of the tool rounds the answer shown was written after
    (conversations/toolrounds.py ``tool_uses``); empty when it follows none or they were not
    read (:func:`exchange_page` reads them)."""

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


# Exchanges the chat page shows at once, and per earlier page as the reader scrolls up (issue
# 29: a 3,000-turn conversation opens as fast as a short one). 30 fill a desktop window a few
# times over, so the reader rarely waits for a page at the top.
EXCHANGES_PAGE = 30

# What the turn tree is built from (conversations/versions.py reads no text): every turn of a
# long conversation, cheaply, before the text of the page's few is read.
_SKELETON_FIELDS = (
    "turn_id", "conversation_id", "role", "status", "reply_to_id", "replaces_id", "parent_id",
    "continues_id", "created_at",
)  # fmt: skip


class BadCursor(ValueError):
    """An ``exchange_page`` cursor that names no question on the branch shown (a turn of
    another conversation or branch, an answer, or no turn at all)."""


@dataclass(frozen=True)
class ExchangePage:
    """A page of the branch shown: ``exchanges`` oldest first; ``earlier``: the cursor of the
    page before it (the id of its oldest question, for ``exchange_page(before=...)``), None
    when this page starts the conversation."""

    exchanges: list[Exchange]
    earlier: UUID | None


def _skeleton(conversation: Conversation) -> list[Turn]:
    """Every turn of ``conversation`` without its text (``content`` and the rest deferred: do
    not read them), held ones included, oldest first: one index scan of its partitions."""
    lowest, highest = _turn_time_range(conversation)
    turns = list(
        Turn.objects.filter(
            conversation_id=conversation.conversation_id, created_at__gte=lowest, created_at__lte=highest
        )
        .order_by("created_at", "turn_id")
        .only(*_SKELETON_FIELDS)
    )
    return _with_held(conversation.conversation_id, turns)


def _with_text(conversation: Conversation, turns: list[Turn]) -> dict[UUID, Turn]:
    """``turns`` (skeletons) as whole rows, by id, in one query over their span of created_at
    (so the partitions outside it are pruned). Held turns come whole from Redis already."""
    wanted = [t for t in turns if "content" in t.get_deferred_fields()]
    whole = {t.turn_id: t for t in turns if "content" not in t.get_deferred_fields()}
    if wanted:
        rows = Turn.objects.filter(
            conversation_id=conversation.conversation_id,
            created_at__gte=min(t.created_at for t in wanted),
            created_at__lte=max(t.created_at for t in wanted),
            turn_id__in=[t.turn_id for t in wanted],
        )
        whole.update((t.turn_id, t) for t in rows)
    return whole


@regions.routed
def exchange_page(
    *, conversation: Conversation, before: UUID | None = None, limit: int = EXCHANGES_PAGE
) -> ExchangePage:
    """The newest ``limit`` exchanges of the branch shown (what :func:`exchange_list` gives,
    its last ``limit``) strictly above the question ``before`` (None: the newest), oldest first.

    The cursor is a question's turn id, as the history API's is a turn's (api/views.py), but on
    the selected path rather than the log: the oldest question a page showed. Two queries
    whatever the conversation's length: the turn tree without text (:func:`_skeleton`, ~100
    bytes a turn), then the text of the page's questions and answers shown. Raises
    :class:`BadCursor` when ``before`` is not a question on the branch shown (another
    conversation's, an answer, a branch switched away from since).
    """
    skeleton = _skeleton(conversation)
    tree = versions.tree_build(skeleton)
    path = tree.path(conversation.branch_choices)
    end = len(path)
    if before is not None:
        end = next((i for i, q in enumerate(path) if q.turn_id == before), None)
        if end is None:
            raise BadCursor("That message is not on the branch shown; reload the conversation.")
    start = max(0, end - limit)
    positions = [tree.position(q, conversation.answer_choices) for q in path[start:end]]
    answers = [p.answer for p in positions if p.answer is not None]
    shown = [p.question for p in positions] + answers
    # The tool rounds of the answers shown come in the same read as their text (no query more).
    rounds = tool_round_turns(skeleton, answers)
    whole = _with_text(conversation, shown + rounds)
    results = toolrounds.results_by_call_turn(whole[t.turn_id] for t in rounds if t.turn_id in whole)
    exchanges = []
    for p in positions:
        answer = whole.get(p.answer.turn_id, p.answer) if p.answer is not None else None
        exchanges.append(
            Exchange(
                question=whole.get(p.question.turn_id, p.question),
                answer=answer,
                answers=tuple(p.answers),
                questions=tuple(p.questions),
                tool_uses=tuple(toolrounds.tool_uses(answer, whole, results)) if answer is not None else (),
            )
        )
    return ExchangePage(exchanges=exchanges, earlier=path[start].turn_id if start > 0 else None)


def tool_round_turns(turns: list[Turn], answers: list[Turn]) -> list[Turn]:
    """Among ``turns`` (a conversation's, text not needed), the calling answers and tool
    results of the tool rounds each of ``answers`` was written after (conversations/
    toolrounds.py), so a page reads their text with its own, in the same query. Pure."""
    by_id = {t.turn_id: t for t in turns}
    results = toolrounds.results_by_call_turn(turns)
    wanted = {i for answer in answers for i in toolrounds.round_turn_ids(answer, by_id, results)}
    return [t for t in turns if t.turn_id in wanted]


@regions.routed
def answer_tool_uses(*, answer: Turn) -> list[toolrounds.ToolUse]:
    """The calls and results of the tool rounds ``answer`` (an assistant turn, already
    permission-checked) was written after, for one answer shown alone (a version flipped to).
    No query for an answer that continues nothing; else one, bounded to its question's answers
    and their results, written up to it."""
    if getattr(answer, "continues_id", None) is None:
        return []
    siblings = Turn.objects.filter(
        conversation_id=answer.conversation_id, role=Turn.Role.ASSISTANT, reply_to_id=answer.reply_to_id,
        created_at__lte=answer.created_at,
    )  # fmt: skip
    rows = Turn.objects.filter(conversation_id=answer.conversation_id, created_at__lte=answer.created_at).filter(
        Q(pk__in=siblings.values("turn_id")) | Q(role=Turn.Role.TOOL, reply_to_id__in=siblings.values("turn_id"))
    )
    turns = _with_held(answer.conversation_id, list(rows.order_by("created_at", "turn_id")))
    by_id = {t.turn_id: t for t in turns}
    return toolrounds.tool_uses(answer, by_id, toolrounds.results_by_call_turn(turns))


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
    return versions.answer_versions(_with_held(answer.conversation_id, stored), answer)


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
    return _with_held(conversation_id, turns, keep=lambda t: after is None or t.created_at > after)


@regions.routed
def positions_after(*, conversation_id: UUID, after) -> list[versions.Position]:
    """The positions of the conversation's selected path (conversations/versions.py) whose
    question was written after ``after`` (a datetime; None: all), each with its versions
    (stored and held turns), oldest first. [] if the conversation is gone."""
    conversation = Conversation.objects.filter(pk=conversation_id).first()
    if conversation is None:
        return []
    positions = versions.positions_build(
        _turns_after(conversation_id, None), conversation.branch_choices, conversation.answer_choices
    )
    return [p for p in positions if after is None or p.question.created_at > after]


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
            turns = _with_held(
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


def _keyset_before(field: str, pk_field: str, before) -> Q:
    created_at, pk = before
    return Q(**{f"{field}__lt": created_at}) | Q(**{field: created_at, f"{pk_field}__lt": pk})


def conversation_page(
    *, user: User, before: tuple | None, limit: int
) -> tuple[list[Conversation], bool]:
    """A page of the user's conversations, newest created first, strictly before the keyset
    ``before`` = (created_at, conversation_id). Returns (page, whether more follow). No OFFSET:
    the cost does not grow with the page number, and appends never shift a page. With several
    regional databases each gives its first ``limit + 1`` and the pages are merged. Temporary
    chats are not listed (as in :func:`conversation_list`)."""
    pieces = []
    for objects in regions.managers(Conversation, user=user):
        query = objects.filter(owner=user, temporary=False)
        if before is not None:
            query = query.filter(_keyset_before("created_at", "conversation_id", before))
        pieces.append(query.order_by("-created_at", "-conversation_id")[: limit + 1])
    rows = regions.merged(pieces, key=lambda c: (c.created_at, c.conversation_id), reverse=True)
    rows = list(rows)[: limit + 1]
    return rows[:limit], len(rows) > limit


def _turn_time_range(conversation: Conversation) -> tuple[datetime, datetime]:
    """The span of ``created_at`` the conversation's stored turns can have, for partition
    pruning (the turn log is partitioned by month on created_at, migration 0004):
    partitions.turn_created_range with ``last_turn_at`` read afresh from the row."""
    last = (
        Conversation.objects.filter(pk=conversation.pk)
        .values_list("last_turn_at", flat=True)
        .first()
    )
    last = max(last or conversation.last_turn_at, conversation.last_turn_at)
    return partitions.turn_created_range(created_at=conversation.created_at, last_turn_at=last)


def _first_page_cached(conversation: Conversation, limit: int) -> tuple[list[Turn], bool] | None:
    """:func:`turn_page`'s first page from the hot cache (conversations/cache.py), held answers
    merged; None when the cache cannot serve it (a longer page than the entry holds)."""
    history = cache.history(conversation.conversation_id, last_turn_at=conversation.last_turn_at)
    newest = history.newest(limit) if history is not None else None
    if newest is None:
        return None
    rows, older = newest  # newest first
    rows = _with_held(conversation.conversation_id, rows[::-1])[::-1][: limit + 1]
    page = rows[:limit]
    page.reverse()
    return page, len(rows) > limit or older


@regions.routed
def turn_page(*, conversation: Conversation, before: tuple | None, limit: int) -> tuple[list[Turn], bool]:
    """The newest ``limit`` turns strictly before the keyset ``before`` = (created_at, turn_id),
    returned oldest first, and whether older ones remain. Stable under concurrent appends
    (new turns are newer than any cursor).

    One index range scan (``turn_conv_keyset``) whatever the page's depth, and only the monthly
    partitions the page can lie in: created_at is bounded below by the conversation's creation
    and above by its last turn or the cursor (:func:`_turn_time_range`), so PostgreSQL prunes
    the others, DEFAULT included, when planning (tests/integration/test_partition_pruning.py).
    """
    if before is None:
        cached = _first_page_cached(conversation, limit)
        if cached is not None:
            return cached
    lowest, highest = _turn_time_range(conversation)
    if before is not None:
        highest = min(highest, before[0])
    query = Turn.objects.filter(
        conversation=conversation, created_at__gte=lowest, created_at__lte=highest
    )
    if before is not None:
        query = query.filter(_keyset_before("created_at", "turn_id", before))
    rows = list(query.order_by("-created_at", "-turn_id")[: limit + 1])
    cursor = (before[0], str(before[1])) if before is not None else None
    rows = _with_held(
        conversation.conversation_id,
        rows[::-1],
        keep=lambda t: cursor is None or _turn_order(t) < cursor,
    )[::-1][: limit + 1]
    page = rows[:limit]
    page.reverse()
    return page, len(rows) > limit


# Full-text search: the text search configuration of the GIN index turn_content_fts (migration
# 0005); the query must use the same expression, SearchVector("content", config=...), for the
# index to serve it.
SEARCH_CONFIG = "english"
SEARCH_MAX_CHARS = 200


def search_query_clean(q: str) -> str:
    """A search query with runs of whitespace collapsed ("" for a blank one). Raises
    ValidationError (code ``too_long`` over SEARCH_MAX_CHARS characters, ``nul`` for U+0000,
    which PostgreSQL text cannot hold)."""
    if len(q) > SEARCH_MAX_CHARS:
        raise ValidationError(
            f"A search can be at most {SEARCH_MAX_CHARS} characters long.", code="too_long"
        )
    if "\x00" in q:
        raise ValidationError("A search cannot contain the NUL character (U+0000).", code="nul")
    return " ".join(q.split())


def conversation_search(*, user: User, q: str, limit: int = 20) -> list[Conversation]:
    """The user's conversations whose title or any stored turn's text matches ``q``, most
    recently active first, at most ``limit``. Never another user's: only conversations the user
    owns are searched.

    ``q`` is web-search syntax (PostgreSQL ``websearch_to_tsquery``: words, "quoted phrases",
    ``or``, ``-word``), matched with English stemming ("running" finds "runs"); a title also
    matches if it contains ``q`` as typed (case-insensitive), so partly typed words find titles.
    Temporary chats are never found (they are in no history, and store no text to match).
    Turn text is matched through the GIN index turn_content_fts on every partition. A blank
    ``q`` matches nothing ([]). Raises ValidationError for a bad ``q`` (see
    :func:`search_query_clean`).
    """
    text = search_query_clean(q)
    if not text:
        return []
    query = SearchQuery(text, search_type="websearch", config=SEARCH_CONFIG)
    # The user's turns that match, as one uncorrelated subquery: PostgreSQL picks the GIN index
    # (few matches overall) or the user's conversations' turns (a common word), and hashes it.
    matching_turns = (
        Turn.objects.filter(conversation__owner=user)
        .annotate(document=SearchVector("content", config=SEARCH_CONFIG))
        .filter(document=query)
        .values("conversation_id")
    )
    # In each regional database (the subquery runs where its outer query does), then merged.
    orgs = _member_org_ids(user)
    found = regions.merged(
        [
            objects.filter(owner=user, temporary=False)
            .filter(Q(org__isnull=True) | Q(org_id__in=orgs))
            .annotate(title_document=SearchVector("title", config=SEARCH_CONFIG))
            .filter(
                Q(title_document=query)
                | Q(title__icontains=text)
                | Q(conversation_id__in=matching_turns)
            )
            .order_by("-last_turn_at", "-created_at")[:limit]
            for objects in regions.managers(Conversation, user=user)
        ],
        key=lambda c: (c.last_turn_at, c.created_at),
        reverse=True,
    )
    return list(found)[:limit]


# A search result's snippet: ts_headline's fragment around the match, about this many words.
SNIPPET_MAX_WORDS = 16
SNIPPET_MIN_WORDS = 6


def search_snippets(*, conversations: list[Conversation], q: str) -> dict[UUID, str]:
    """For each of ``conversations`` (already the user's: :func:`conversation_search`'s result)
    whose stored text matches ``q``: conversation id -> a fragment of its latest matching turn,
    about SNIPPET_MAX_WORDS words, each match between ``sidebar.MATCH_START`` and
    ``sidebar.MATCH_STOP`` (PostgreSQL ``ts_headline``; the text is raw, not HTML: render it
    with ``sidebar.snippet_html``, which escapes it). A conversation matched by its title only
    is absent. One query per regional database holding any of them. Withdrawn answers (the
    output gate blocked them) are never quoted. Raises ValidationError for a bad ``q``."""
    from conversations.sidebar import MATCH_START, MATCH_STOP  # noqa: PLC0415 - sidebar imports models only

    text = search_query_clean(q)
    if not text or not conversations:
        return {}
    query = SearchQuery(text, search_type="websearch", config=SEARCH_CONFIG)
    by_db: dict[str, list[UUID]] = {}
    for conversation in conversations:
        by_db.setdefault(regions.conversation_db(conversation), []).append(conversation.pk)
    snippets: dict[UUID, str] = {}
    for db, ids in by_db.items():
        rows = (
            regions.manager(Turn, db)
            .filter(conversation_id__in=ids, role__in=(Turn.Role.USER, Turn.Role.ASSISTANT))
            .exclude(role=Turn.Role.ASSISTANT, status=Turn.Status.BLOCKED)
            .annotate(document=SearchVector("content", config=SEARCH_CONFIG))
            .filter(document=query)
            .annotate(
                headline=SearchHeadline(
                    "content", query, config=SEARCH_CONFIG, start_sel=MATCH_START,
                    stop_sel=MATCH_STOP, max_words=SNIPPET_MAX_WORDS, min_words=SNIPPET_MIN_WORDS,
                )
            )  # fmt: skip
            .order_by("conversation_id", "-created_at")
            .distinct("conversation_id")
            .values_list("conversation_id", "headline")
        )
        snippets.update(rows)
    return snippets
