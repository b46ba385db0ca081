"""Test support for projects (issue 30): a READY file whose passages are made directly (each
embedded for real, no worker), and fixtures naming the ingestion and retrieval modules."""

from __future__ import annotations

import hashlib

import pytest

from conversations import regions
from memory.embeddings import embed
from projects.models import ProjectFile, ProjectPassage


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
