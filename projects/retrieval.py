"""The passages of a project's files relevant to a question (issue 30): what a turn in a project
puts before the question.

An exact scan: the question is embedded (inference/embeddings.py, the model the passages were
embedded with) and the project's passages of READY files are ordered by pgvector's cosine
distance in the project's region database, ``LIMIT k``. A project holds a few thousand passages at
most, so the scan is a few ms; an approximate index filtered by project afterwards would lose
rows (memory's per-user scan makes the same choice). Then, most similar first: passages under the
similarity floor are dropped, and passages are kept while they fit the token budget (one that
does not fit is skipped and a shorter, less similar one may still go in).

The defaults (settings ``CHAT_PROJECT_TOP_K``, ``CHAT_PROJECT_MIN_SIMILARITY``,
``CHAT_PROJECT_RETRIEVAL_TOKENS``) are read per call; their sources are in chatsite/settings and
bench/project_bench.py measures them on the labelled set of bench/data/projects/.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from pgvector.django import CosineDistance

from core import dbrouter
from core.db import run_in_db_thread
from projects.ingest import project_db
from projects.models import Project, ProjectFile, ProjectPassage


@dataclass(frozen=True)
class Retrieved:
    """One retrieved passage: ``text == extracted_text[start:end]`` of file ``file_id``
    (``ordinal``: its position there); ``tokens``: the chat model's; ``similarity``: cosine
    similarity to the question, in [-1, 1] (1 - pgvector's cosine distance)."""

    passage_id: int
    file_id: UUID
    file_name: str
    ordinal: int
    start: int
    end: int
    text: str
    tokens: int
    similarity: float


def passages_retrieve(
    *,
    project: Project,
    question: str,
    k: int | None = None,
    min_similarity: float | None = None,
    budget_tokens: int | None = None,
    vector: list[float] | None = None,
) -> list[Retrieved]:
    """The passages of ``project``'s READY files most similar to ``question``, most similar
    first (module docstring): at most ``k`` (default ``settings.CHAT_PROJECT_TOP_K``), each at
    least ``min_similarity`` (default ``settings.CHAT_PROJECT_MIN_SIMILARITY``), together at most
    ``budget_tokens`` tokens (default ``settings.CHAT_PROJECT_RETRIEVAL_TOKENS``). ``[]`` for a
    blank question, a project with no ready file, or ``k``/``budget_tokens`` <= 0. The caller
    has checked that the user may read ``project``. Cost: one query embedding (~10-15 ms) and
    one query (``vector``: the question's embedding when already computed, then none). Raises
    RegionUnavailable when the project's region has no database here."""
    k = settings.CHAT_PROJECT_TOP_K if k is None else k
    floor = settings.CHAT_PROJECT_MIN_SIMILARITY if min_similarity is None else min_similarity
    budget = settings.CHAT_PROJECT_RETRIEVAL_TOKENS if budget_tokens is None else budget_tokens
    if k <= 0 or budget <= 0 or not question.strip():
        return []
    from inference.embeddings import embed_one  # noqa: PLC0415 - loads torch on first use

    if vector is None:
        vector = embed_one(question)
    with dbrouter.pinned(project_db(project)):
        rows = list(
            ProjectPassage.objects.filter(project_id=project.pk, file__status=ProjectFile.Status.READY)
            .annotate(distance=CosineDistance("embedding", vector))
            .order_by("distance", "passage_id")
            .values_list("passage_id", "file_id", "file__name", "ordinal", "start", "end", "text", "tokens", "distance")[:k]
        )  # fmt: skip
    kept: list[Retrieved] = []
    used = 0
    for passage_id, file_id, name, ordinal, start, end, text, tokens, distance in rows:
        similarity = 1.0 - float(distance)
        if similarity < floor:
            break  # ordered by similarity: the rest are under the floor too
        if used + tokens > budget:
            continue
        used += tokens
        kept.append(Retrieved(passage_id, file_id, name, ordinal, start, end, text, tokens, similarity))
    return kept


async def apassages_retrieve(**kwargs) -> list[Retrieved]:
    """:func:`passages_retrieve` from async code (the embedding and the query on a worker
    thread, off the event loop, whose connections go back to the pool after: core/db.py
    ``run_in_db_thread``)."""
    return await run_in_db_thread(passages_retrieve, **kwargs)
