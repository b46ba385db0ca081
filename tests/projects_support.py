"""Test support for projects (issue 30): passages made directly, and stand-ins for the file
ingestion and retrieval modules another branch builds (projects/ingest.py, projects/retrieval.py).

The stand-ins live here, in tests only, and are installed by fixtures: when the real module is
importable it is used instead (so these tests run against it once both branches are merged).
"""

from __future__ import annotations

import hashlib
import sys
import types
from dataclasses import dataclass
from uuid import UUID

import pytest
from pgvector.django import CosineDistance

from conversations import regions
from memory.embeddings import embed
from projects.models import ProjectFile, ProjectPassage


@dataclass(frozen=True)
class Retrieved:
    """projects/retrieval.py's value object, field for field."""

    passage_id: int
    file_id: UUID
    file_name: str
    ordinal: int
    start: int
    end: int
    text: str
    tokens: int
    similarity: float


def _passages_retrieve(*, project, question: str, k: int = 5, min_similarity: float = 0.1, budget_tokens: int = 2000):
    """Exact cosine scan of the project's passages, best first, above the floor, within the
    budget (the interface of projects/retrieval.py)."""
    db = regions.db_for_conversation_id(project.pk)
    vector = embed([question])[0]
    rows = (
        ProjectPassage.objects.using(db).filter(project_id=project.pk)
        .select_related("file").annotate(distance=CosineDistance("embedding", vector))
        .order_by("distance")[:k]
    )  # fmt: skip
    found, used = [], 0
    for row in rows:
        similarity = 1.0 - float(row.distance)
        if similarity < min_similarity or used + row.tokens > budget_tokens:
            continue
        used += row.tokens
        found.append(Retrieved(
            passage_id=row.pk, file_id=row.file_id, file_name=row.file.name, ordinal=row.ordinal,
            start=row.start, end=row.end, text=row.text, tokens=row.tokens, similarity=similarity,
        ))  # fmt: skip
    return found


def passage_file_add(project, *, user, name: str, passages: list[str]) -> ProjectFile:
    """A READY file of ``project`` whose text is ``passages`` (each embedded for real)."""
    db = regions.db_for_conversation_id(project.pk)
    text = "\n\n".join(passages)
    file = ProjectFile.objects.using(db).create(
        project=project, uploaded_by=user, name=name, kind=ProjectFile.Kind.MARKDOWN, size=len(text.encode()),
        sha256=hashlib.sha256(text.encode()).hexdigest(), storage_name=f"{project.pk}/{name}",
        status=ProjectFile.Status.READY, chars=len(text),
    )  # fmt: skip
    start = 0
    for ordinal, (passage, vector) in enumerate(zip(passages, embed(passages), strict=True)):
        ProjectPassage.objects.using(db).create(
            project=project, file=file, ordinal=ordinal, start=start, end=start + len(passage),
            text=passage, tokens=len(passage.split()), embedding=vector,
        )  # fmt: skip
        start += len(passage) + 2
    return file


class IngestRefused(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
        self.status = 400


def _project_file_add(*, project, user, upload):
    """Stand-in of projects/ingest.py: a text file becomes one READY passage at once; an empty
    one is refused (a gate.Refused subclass, like the real one)."""
    from gateway.gate import Refused  # noqa: PLC0415

    data = upload.read()
    if not data.strip():
        raise Refused(400, "empty_file", "This file is empty.")
    return passage_file_add(project, user=user, name=upload.name, passages=[data.decode()])


@pytest.fixture
def retrieval(monkeypatch):
    """projects.retrieval: the real module if present, else :func:`_passages_retrieve`."""
    try:
        import projects.retrieval as module  # noqa: PLC0415
    except ImportError:
        module = types.ModuleType("projects.retrieval")
        module.Retrieved = Retrieved
        module.passages_retrieve = _passages_retrieve
        monkeypatch.setitem(sys.modules, "projects.retrieval", module)
    return module


@pytest.fixture
def ingest(monkeypatch):
    """projects.ingest: the real module if present, else :func:`_project_file_add`."""
    try:
        import projects.ingest as module  # noqa: PLC0415
    except ImportError:
        module = types.ModuleType("projects.ingest")
        module.project_file_add = _project_file_add
        monkeypatch.setitem(sys.modules, "projects.ingest", module)
    return module


def project_chat_with_sources(owner, *, name: str = "Antares", passages=("Launch is at 06:00 from pad 39A.",)):
    """A project of ``owner`` with a file ``mission.md`` of ``passages``, and a chat in it whose
    one answer has those passages as its sources (projects/sources.py ``turn_sources_store``,
    as submit does when an answer starts). Returns (project, conversation, answer turn)."""
    from conversations import services  # noqa: PLC0415
    from conversations.models import Turn  # noqa: PLC0415
    from projects import services as project_services  # noqa: PLC0415
    from projects.sources import turn_sources_store  # noqa: PLC0415

    project = project_services.project_create(owner=owner, name=name)
    file = passage_file_add(project, user=owner, name="mission.md", passages=list(passages))
    chat = services.conversation_create(owner=owner, project=project)
    question = services.turn_append_user(conversation=chat, content="When is the launch?")
    answer = services.turn_append_assistant(
        conversation_id=chat.pk, turn_id=regions.new_turn_id(chat.pk), reply_to_id=question.turn_id,
        content="At 06:00.", status="complete", prompt_tokens=10, completion_tokens=3,
    )  # fmt: skip
    rows = ProjectPassage.objects.using(regions.db_for_conversation_id(chat.pk)).filter(file=file).order_by("ordinal")
    turn_sources_store(conversation=chat, question_id=question.turn_id, answer_id=answer.turn_id, passages=[
        Retrieved(p.pk, file.pk, file.name, p.ordinal, p.start, p.end, p.text, 9, 0.8) for p in rows
    ])  # fmt: skip
    chat.refresh_from_db()
    return project, chat, Turn.objects.get(pk=answer.turn_id)
