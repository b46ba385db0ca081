"""Full-text search over a user's own conversations (the sidebar's search and ``GET
/v1/conversations?q=``): the query's checks (:func:`search_query_clean`), the matching
conversations (:func:`conversation_search`) and a snippet of each one's latest matching turn
(:func:`search_snippets`), all through the GIN index turn_content_fts (migration 0005).
"""

from __future__ import annotations

from uuid import UUID

from django.contrib.postgres.search import SearchHeadline, SearchQuery, SearchVector
from django.core.exceptions import ValidationError
from django.db.models import Q

from accounts.models import User
from conversations.models import Conversation, Turn
from conversations.selectors import member_org_ids
from core import regions


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
    orgs = member_org_ids(user)
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
