"""An answer's sources in a project chat (issue 30): the passages its prompt held, kept so the
page, a reload, the shared snapshot and the export show the same list.

Stored per *assistant* turn (projects.models.ProjectTurnSource, module docstring there): when
an answer starts (conversations/submit.py, right after its generation is started, while it
streams), one row per passage, with a copy of the file's name and the passage's text, so the
list survives the file's deletion. A regenerated answer is a new assistant turn with its own
retrieval, so its own sources. Nothing is stored for a zero-retention conversation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from uuid import UUID

from django.db import transaction

from conversations.models import Conversation
from core import regions
from projects.models import ProjectTurnSource

# Characters of a passage shown in the closed source line (the whole passage opens in place).
SNIPPET_CHARS = 140


@dataclass(frozen=True)
class Source:
    """One source as the page shows it: ``file_name``, ``snippet`` (the passage's first
    :data:`SNIPPET_CHARS` characters on one line, with an ellipsis when cut), ``text`` (the
    whole passage), ``start``/``end`` (character offsets in the file's text)."""

    file_name: str
    snippet: str
    text: str
    start: int
    end: int
    file_id: UUID | None = None


def snippet_of(text: str, limit: int = SNIPPET_CHARS) -> str:
    """``text`` on one line, cut at a word boundary to at most ``limit`` characters."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    return (line[: limit - 1].rsplit(" ", 1)[0] or line[: limit - 1]) + "\u2026"


@transaction.atomic
@regions.atomic
def turn_sources_store(
    *, conversation: Conversation, question_id: UUID, answer_id: UUID, passages: Sequence
) -> int:
    """Store ``passages`` (projects.retrieval.Retrieved, in prompt order) as the sources of
    answer ``answer_id`` to ``question_id`` in ``conversation``, on its database. Returns how
    many rows were written (0: no passages). The caller skips zero-retention conversations."""
    if not passages:
        return 0
    rows = [
        ProjectTurnSource(
            conversation_id=conversation.pk, answer_id=answer_id, question_id=question_id,
            position=i, file_id=p.file_id, passage_id=p.passage_id, file_name=p.file_name,
            start=p.start, end=p.end, text=p.text, similarity=float(p.similarity),
        )  # fmt: skip
        for i, p in enumerate(passages)
    ]
    ProjectTurnSource.objects.bulk_create(rows)
    return len(rows)


def _source(row: ProjectTurnSource) -> Source:
    return Source(
        file_name=row.file_name, snippet=snippet_of(row.text), text=row.text,
        start=row.start, end=row.end, file_id=row.file_id,
    )  # fmt: skip


@regions.routed
def sources_by_answer(*, conversation: Conversation, answer_ids: Iterable[UUID] | None = None) -> dict[UUID, list[Source]]:
    """The sources of ``conversation``'s answers, by assistant turn id, each list in prompt
    order (only ``answer_ids`` when given). One query; none for a conversation in no project
    (``{}``). The caller has checked the reader may see the conversation."""
    if conversation.project_id is None:
        return {}
    rows = ProjectTurnSource.objects.filter(conversation_id=conversation.pk)
    if answer_ids is not None:
        rows = rows.filter(answer_id__in=list(answer_ids))
    found: dict[UUID, list[Source]] = defaultdict(list)
    for row in rows.order_by("answer_id", "position"):
        found[row.answer_id].append(_source(row))
    return dict(found)


def source_json(source: Source) -> dict:
    """A source as /v1 and the export give it."""
    return {
        "file_id": str(source.file_id) if source.file_id else None,
        "file_name": source.file_name,
        "start": source.start,
        "end": source.end,
        "text": source.text,
    }
