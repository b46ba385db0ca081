"""Pages of a conversation and of a user's conversations, read without OFFSET: the chat page's
pages of exchanges of the branch shown (:func:`exchange_page`, issue 29), the history API's pages
of turns (:func:`turn_page`) and of conversations (:func:`conversation_page`), and the tool
rounds an answer shown was written after (:func:`tool_round_turns`, :func:`answer_tool_uses`).

Each page costs the same whatever its depth: keyset cursors, and ``created_at`` bounds that let
PostgreSQL prune the turn log's monthly partitions. Permission-checked upstream: the
conversation passed in is already the caller's (conversations/selectors.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db.models import Q

from accounts.models import User
from conversations import cache, partitions, toolrounds, versions
from conversations.models import Conversation, Turn
from conversations.selectors import Exchange, turn_order, with_held
from core import regions


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
    return with_held(conversation.conversation_id, turns)


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
    """The newest ``limit`` exchanges of the branch shown (what
    :func:`conversations.selectors.exchange_list` gives, its last ``limit``) strictly above the
    question ``before`` (None: the newest), oldest first.

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
    turns = with_held(answer.conversation_id, list(rows.order_by("created_at", "turn_id")))
    by_id = {t.turn_id: t for t in turns}
    return toolrounds.tool_uses(answer, by_id, toolrounds.results_by_call_turn(turns))


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
    chats are not listed (as in :func:`conversations.selectors.conversation_list`)."""
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
    rows = with_held(conversation.conversation_id, rows[::-1])[::-1][: limit + 1]
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
    rows = with_held(
        conversation.conversation_id,
        rows[::-1],
        keep=lambda t: cursor is None or turn_order(t) < cursor,
    )[::-1][: limit + 1]
    page = rows[:limit]
    page.reverse()
    return page, len(rows) > limit
