"""Reads of long-term memory: a user's facts, and the ones most similar to a new message.

Retrieval plan (issue 7: p99 under 20 ms with 100,000 facts in the table, embedding included).
The search is an *exact* scan over one user's rows, not an HNSW index scan:

- pgvector's HNSW index is global. With ``WHERE user_id = %s`` it returns the ``hnsw.ef_search``
  (default 40) nearest vectors of the *whole table* and filters them afterwards (pgvector README,
  "Filtering"); with 100,000 facts of ~100+ users, the user's own facts are rarely among those
  40, so an HNSW plan returns too few or none (and raising ef_search to cover it costs more
  than the exact scan). pgvector >= 0.8's iterative scans fix recall but still walk the graph
  through other users' vectors.
- A user has at most ``CHAT_MEMORY_MAX_FACTS_PER_USER`` (1,000) facts. Reading them through the
  ``(user, created_at)`` B-tree and computing up to 1,000 cosine distances of 384 floats takes
  well under 1 ms, and recall is exact whatever else is in the table.

The query computes the distances inside a ``MATERIALIZED`` CTE that selects the user's rows, so
the planner cannot pick the HNSW index for the ``ORDER BY ... LIMIT`` (a plan that would drop
results) whatever its statistics say. Facts live in their user's home region's database
(core/user_regions.py ``user_db``); every selector here reads there (``user_regions.for_user``). tests/test_memory.py checks the plan. The HNSW index
(memory/models.py) serves table-wide similarity queries (operators, analysis), not a turn.
The query's embedding (inference/embeddings.py, ~10 ms on one CPU thread) is most of the cost;
users with no facts (or memory off) skip it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import Future

from django.conf import settings

from core import user_regions
from inference.embeddings import embed_one
from memory.models import UserMemory

_SEARCH_SQL = """
WITH mine AS MATERIALIZED (
    SELECT fact_id, user_id, text, source, slot, source_conversation_id, created_at,
           (embedding <=> %s::vector) AS distance
    FROM user_memory
    WHERE user_id = %s
)
SELECT * FROM mine ORDER BY distance, fact_id LIMIT %s
"""


def vector_literal(vector: list[float]) -> str:
    """pgvector's text form of ``vector`` (``'[0.1,0.2,...]'``), for a ``%s::vector`` parameter."""
    return "[" + ",".join(repr(float(x)) for x in vector) + "]"


def memory_enabled_for(user) -> bool:
    """True when memory is on for the whole service (``CHAT_MEMORY_ENABLED``) and for ``user``
    (``User.memory_enabled``)."""
    return bool(getattr(settings, "CHAT_MEMORY_ENABLED", True) and getattr(user, "memory_enabled", False))


@user_regions.for_user
def memory_list(*, user) -> list[UserMemory]:
    """The user's facts, newest first (the embeddings are not loaded)."""
    return list(UserMemory.objects.filter(user=user).defer("embedding").order_by("-created_at", "fact_id"))


@user_regions.for_user
def memory_nearest(*, user, vector: list[float], k: int) -> list[tuple[UserMemory, float]]:
    """The user's ``k`` facts nearest to ``vector`` (a normalised embedding), with their cosine
    similarity (1 - cosine distance, -1..1), most similar first; one query, an exact scan over
    the user's rows (module docstring). The facts' embeddings are not loaded."""
    facts = UserMemory.objects.raw(_SEARCH_SQL, [vector_literal(vector), user.pk, k])
    return [(fact, 1.0 - float(fact.distance)) for fact in facts]


@user_regions.for_user
def memory_search(
    *,
    user,
    query: str,
    k: int | None = None,
    min_similarity: float | None = None,
    query_vector: Future | None = None,
) -> list[tuple[UserMemory, float]]:
    """The user's facts most similar to ``query`` (a new message), as ``(fact, similarity)``
    pairs, most similar first: at most ``k`` (default ``CHAT_MEMORY_TOP_K``), each with cosine
    similarity >= ``min_similarity`` (default ``CHAT_MEMORY_MIN_SIMILARITY``).

    Only ``user``'s facts, however many others the table holds. ``[]`` when memory is off
    (``CHAT_MEMORY_ENABLED`` or ``user.memory_enabled``), the query is blank, or the user has no
    facts (then the query is not embedded). A deleted fact is never returned (no cache).
    ``query_vector``: ``query``'s embedding, already started (inference.embeddings.embed_one_start);
    used instead of embedding it here, and cancelled when it is not needed.
    """
    k = settings.CHAT_MEMORY_TOP_K if k is None else k
    if (
        not memory_enabled_for(user)
        or not query.strip()
        or k <= 0
        or not UserMemory.objects.filter(user=user).exists()
    ):
        if query_vector is not None:
            query_vector.cancel()
        return []
    floor = settings.CHAT_MEMORY_MIN_SIMILARITY if min_similarity is None else min_similarity
    vector = query_vector.result() if query_vector is not None else embed_one(query)
    return [(fact, sim) for fact, sim in memory_nearest(user=user, vector=vector, k=k) if sim >= floor]


# Chat-template and role markers of the common template families (ChatML <|im_start|>, Llama 3
# <|start_header_id|>, Llama 2 [INST] / <<SYS>>, Gemma <start_of_turn>, <s> / </s>), and any
# <|...|> special-token spelling.
_TEMPLATE_MARKERS = re.compile(
    r"<\|[^|<>]{0,40}\|>|</?s>|\[/?INST\]|<</?SYS>>|<(?:start|end)_of_turn>|</?(?:system|user|assistant)>",
    re.IGNORECASE,
)
# Control characters (C0, DEL, C1), line / paragraph separators, zero-width and bidi controls.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def memory_fact_sanitise(text: str) -> str:
    """``text`` made safe to put on one line of the prompt's memory block: chat-template and role
    markers removed (repeatedly, so removing one cannot assemble another), control characters
    and newlines turned into spaces, leading list / heading characters dropped, whitespace
    collapsed. It then reads as a plain statement, never as a new message or block."""
    previous = None
    while previous != text:
        previous = text
        text = _TEMPLATE_MARKERS.sub(" ", _CONTROL.sub(" ", text))
    text = " ".join(text.split())
    return text.lstrip("-*#>• ").strip()


def _approx_tokens(text: str) -> int:
    # No tokenizer given: ~4 characters per token (English BPE), rounded up.
    return -(-len(text) // 4)


def memory_block(
    *,
    user,
    query: str,
    encode_tokens: Callable[[str], int] | None = None,
    max_tokens: int | None = None,
    query_vector: Future | None = None,
) -> str:
    """The prompt's memory block for a turn: the user's facts most similar to ``query`` as plain
    ``- fact`` lines joined by newlines, oldest first (chosen most similar first, memory_search), sanitised
    (memory_fact_sanitise), and within ``max_tokens`` (default ``CHAT_MEMORY_MAX_TOKENS``) as
    counted by ``encode_tokens`` (text -> token count; default ~4 characters per token). A fact
    that would pass the budget is left out and the next, shorter one tried. ``""`` when nothing
    is retrieved (memory off, no facts, none similar enough). ``query_vector``: as for
    :func:`memory_search`."""
    budget = settings.CHAT_MEMORY_MAX_TOKENS if max_tokens is None else max_tokens
    count = encode_tokens or _approx_tokens
    chosen: list[tuple[UserMemory, str]] = []
    for fact, _similarity in memory_search(user=user, query=query, query_vector=query_vector):
        clean = memory_fact_sanitise(fact.text)
        if not clean:
            continue
        candidate = "\n".join([*(line for _, line in chosen), f"- {clean}"])
        if count(candidate) <= budget:
            chosen.append((fact, f"- {clean}"))
    # Chosen by similarity, listed oldest first: turns that retrieve the same facts get the same
    # block, whatever the similarity order, so their prompts share a prefix (the prefix cache
    # hits; inference/prompts.py puts the block right after the system prompt).
    chosen.sort(key=lambda item: (item[0].created_at, str(item[0].fact_id)))
    return "\n".join(line for _, line in chosen)



def relevant_similarity() -> float:
    """The cosine similarity a fact needs to a turn's message to enter its prompt
    (``CHAT_MEMORY_RELEVANT_SIMILARITY``, default 0.25: with all-MiniLM-L6-v2, unrelated
    requests such as "Say the word yes." scored at most 0.20 against the bench's 20 facts, and
    related ones 0.22-0.41; bench/memory_bench.py prints the tokens this admits)."""
    return float(getattr(settings, "CHAT_MEMORY_RELEVANT_SIMILARITY", 0.25))


def memory_relevant(
    *,
    user,
    query: str,
    encode_tokens: Callable[[str], int] | None = None,
    query_vector: Future | None = None,
) -> str:
    """The user's facts outside the pinned profile that are relevant to ``query`` (a turn's
    message), as ``- fact`` lines oldest first: at most ``CHAT_MEMORY_RELEVANT_K`` (default 3),
    each with similarity >= :func:`relevant_similarity`, within ``CHAT_MEMORY_RELEVANT_TOKENS``
    (default 40) counted by ``encode_tokens``. "" when none is (the common case for a request
    about the world). Pinned facts are left out: the memory block carries them."""
    from memory.statements import PINNED_SLOTS  # noqa: PLC0415

    k = int(getattr(settings, "CHAT_MEMORY_RELEVANT_K", 3))
    found = memory_search(
        user=user, query=query, k=k + len(PINNED_SLOTS), min_similarity=relevant_similarity(),
        query_vector=query_vector,
    )  # fmt: skip
    budget = int(getattr(settings, "CHAT_MEMORY_RELEVANT_TOKENS", 40))
    count = encode_tokens or _approx_tokens
    chosen: list[tuple[UserMemory, str]] = []
    for fact, _similarity in found:
        if fact.slot in PINNED_SLOTS or len(chosen) == k:
            continue
        clean = memory_fact_sanitise(fact.text)
        candidate = "\n".join([*(line for _, line in chosen), f"- {clean}"])
        if clean and count(candidate) <= budget:
            chosen.append((fact, f"- {clean}"))
    chosen.sort(key=lambda item: (item[0].created_at, str(item[0].fact_id)))
    return "\n".join(line for _, line in chosen)
