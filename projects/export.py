"""A person's projects in their data export (privacy/export.py ``user_export_build``, issue 30):
each project they own, with its instructions and its files' names, states and extracted text
(the passages in order; the original bytes stay out, as the archive's README says of nothing
else: they are what the person uploaded). Their chats in a project carry its ``project_id``
(privacy/export_sections.py ``conversation_json``), and each answer its sources
(:func:`answer_sources`: the file's name and the passage's text, as the page shows them)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from uuid import UUID

from core import regions
from projects.models import Project, ProjectFile, ProjectPassage, ProjectTurnSource
from projects.sources import source_json


def _file_json(db: str, file: ProjectFile) -> dict:
    passages = ProjectPassage.objects.using(db).filter(file_id=file.pk).order_by("ordinal")
    return {
        "file_id": file.file_id,
        "name": file.name,
        "kind": file.kind,
        "size": file.size,
        "sha256": file.sha256,
        "status": file.status,
        "error": file.error,
        "pages": file.pages,
        "created_at": file.created_at,
        # The text as it was extracted and cut into passages (start/end: character offsets).
        "passages": [
            {"ordinal": p.ordinal, "start": p.start, "end": p.end, "text": p.text}
            for p in passages.only("ordinal", "start", "end", "text")
        ],
    }


def project_items(*, user_id: int) -> Iterator[dict]:
    """The projects ``user_id`` owns, from every region's database, oldest first, as data.json
    holds them. Lazy: one project (and its files) read at a time."""
    for db in regions.region_dbs():
        for project in Project.objects.using(db).filter(owner_id=user_id).order_by("created_at", "pk"):
            files = ProjectFile.objects.using(db).filter(project_id=project.pk).order_by("created_at", "pk")
            yield {
                "project_id": project.project_id,
                "name": project.name,
                "instructions": project.instructions,
                "region": project.region,
                "organisation_id": project.org_id,
                "created_at": project.created_at,
                "updated_at": project.updated_at,
                "files": [_file_json(db, f) for f in files],
            }


def answer_sources(db: str, conversation) -> dict[UUID, list[dict]]:
    """The sources of ``conversation``'s answers (projects/sources.py: the copies kept with
    each answer), by assistant turn id, each list in prompt order, as the exports give them
    (``source_json``: file id and name, offsets, the passage's text). Read from ``db`` (the
    conversation's region database); no query for a chat in no project (``{}``)."""
    if conversation.project_id is None:
        return {}
    found: dict[UUID, list[dict]] = defaultdict(list)
    rows = ProjectTurnSource.objects.using(db).filter(conversation_id=conversation.pk).order_by("answer_id", "position")
    for row in rows:
        found[row.answer_id].append(source_json(row))  # a row has the fields a Source has
    return dict(found)
