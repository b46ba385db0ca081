"""Test support for projects (issue 30): a READY file whose passages are made directly (each
embedded for real, no worker), and fixtures naming the ingestion and retrieval modules."""

from __future__ import annotations

import hashlib

import pytest

from core import regions
from inference.embeddings import embed
from projects.models import ProjectFile, ProjectPassage
from projects.retrieval import Retrieved


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


@pytest.fixture
def retrieval():
    """projects.retrieval (the module a project turn retrieves with)."""
    import projects.retrieval as module  # noqa: PLC0415

    return module


@pytest.fixture
def ingest():
    """projects.ingest (the module a file upload goes through)."""
    import projects.ingest as module  # noqa: PLC0415

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
