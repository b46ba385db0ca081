"""Every write to projects (issue 30), except adding a file and reading its text
(projects/ingest.py). Keyword-only, typed; permissions are checked by the caller with
projects/selectors.py.

**Where a project lives.** Where its owner's new conversations would: the organisation's region
for a workspace project, else the owner's (core/regions.py ``home_region``: a person
in an organisation makes workspace projects by default, as their chats are the organisation's).
Its id names that region (``regions.new_conversation_id``), and its chats are created in the
same database (conversations/services.py ``conversation_create`` with ``project``).

**Deleting.** A project goes with its chats, every member's (through the one deletion service,
conversations/deletion.py), its files' bytes (from storage, once the rows' deletion commits),
its files' rows and passages (CASCADE). An account's deletion removes the projects it owns, an
organisation's deletion its projects (privacy/services.py, :func:`projects_sweep`).
"""

from __future__ import annotations

import logging
from collections import Counter

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from accounts.models import Organisation, User
from conversations.models import Conversation
from conversations.services import conversations_delete
from core import regions
from projects import ingest
from projects.models import Project, ProjectFile
from projects.sources import turn_sources_store  # noqa: F401 - re-exported: an answer's sources

logger = logging.getLogger(__name__)

NAME_MAX_CHARS = 120  # Project.name
INSTRUCTIONS_MAX_CHARS = 8000  # as a conversation's own instructions (conversations/services.py)
BATCH = 1000  # conversations per deletion batch


def name_clean(name: str | None) -> str:
    """A project name on one line, stripped. Raises ValidationError (``empty``, ``too_long``)."""
    text = " ".join((name or "").replace("\x00", "").split())
    if not text:
        raise ValidationError("A project needs a name.", code="empty")
    if len(text) > NAME_MAX_CHARS:
        raise ValidationError(f"A project name can be at most {NAME_MAX_CHARS} characters.", code="too_long")
    return text


def instructions_clean(text: str | None) -> str:
    """Project instructions, stripped (blank: none). Raises ValidationError for NUL (``nul``:
    PostgreSQL text cannot hold it) or more than :data:`INSTRUCTIONS_MAX_CHARS` characters
    (``too_long``)."""
    text = (text or "").strip()
    if "\x00" in text:
        raise ValidationError("Instructions cannot contain the NUL character.", code="nul")
    if len(text) > INSTRUCTIONS_MAX_CHARS:
        raise ValidationError(
            f"Instructions can be at most {INSTRUCTIONS_MAX_CHARS:,} characters (these are {len(text):,}).",
            code="too_long",
        )
    return text


def project_create(
    *, owner: User, name: str, instructions: str = "", org: Organisation | None = None,
    personal: bool = False,
) -> Project:
    """Create a project for ``owner`` in its home region's database (module docstring):
    ``org`` (one the owner belongs to) makes it that workspace's, else the owner's first
    organisation's if any, else a personal project; ``personal``: a personal project in the
    owner's own region even while they belong to an organisation. Raises ValidationError for a bad name or
    instructions, if the owner is not a member of ``org``, or (RegionUnavailable) if the region
    has no database here."""
    name = name_clean(name)
    instructions = instructions_clean(instructions)
    if personal:
        region, org = owner.region, None
    else:
        region, org = regions.home_region(owner=owner, org=org)
    db = regions.db_for_region(region)
    with transaction.atomic(using=db):
        return regions.manager(Project, db, user_id=owner.pk).create(
            project_id=regions.new_conversation_id(region), owner=owner, org=org, name=name,
            instructions=instructions, region=region,
        )  # fmt: skip


def _update(project: Project, **fields) -> Project:
    fields["updated_at"] = timezone.now()
    db = regions.db_for_conversation_id(project.pk)
    with transaction.atomic(using=db):
        regions.manager(Project, db).filter(pk=project.pk).update(**fields)
    for name, value in fields.items():
        setattr(project, name, value)
    return project


def project_rename(*, project: Project, name: str) -> Project:
    """Rename ``project`` (:func:`name_clean`); returns it updated. Raises ValidationError."""
    return _update(project, name=name_clean(name))


def project_instructions_set(*, project: Project, instructions: str) -> Project:
    """Set ``project``'s instructions (:func:`instructions_clean`; blank clears them). Every
    chat of the project has them in its system message from its next turn
    (projects/prompt.py). Raises ValidationError; nothing is stored then."""
    return _update(project, instructions=instructions_clean(instructions))


def project_file_delete(*, file: ProjectFile) -> None:
    """Delete one file of a project: its row and passages now, its bytes (from the projects'
    storage) once that commits (projects/ingest.py ``project_file_delete``, the one path /v1
    and the admin take too). Answers that cited it keep their copies (projects/sources.py)."""
    ingest.project_file_delete(file=file)


def projects_delete(*, db: str, project_ids: list) -> Counter:
    """Delete the projects ``project_ids`` in database ``db`` with their chats (every member's,
    through conversations/deletion.py, in batches), files (bytes once committed) and passages.
    Returns the rows deleted per model (lower-case name: ``project``, ``projectfile``,
    ``projectpassage``, ``conversation``, ``turn``, ...)."""
    counts: Counter = Counter()
    if not project_ids:
        return counts
    chats = list(
        Conversation.objects.using(db).filter(project_id__in=project_ids).values_list("pk", flat=True)
    )
    for start in range(0, len(chats), BATCH):
        deleted = conversations_delete(
            conversations=Conversation.objects.using(db).filter(pk__in=chats[start : start + BATCH])
        )
        counts.update(deleted.counts)
    with transaction.atomic(using=db):
        names = list(
            ProjectFile.objects.using(db).filter(project_id__in=project_ids).values_list("storage_name", flat=True)
        )
        _, per_model = Project.objects.using(db).filter(pk__in=project_ids).delete()
        transaction.on_commit(lambda: ingest.stored_files_delete(names), using=db)
    counts.update({label.rpartition(".")[2].lower(): n for label, n in per_model.items()})
    return counts


def project_delete(*, project: Project) -> Counter:
    """Delete ``project`` for good (module docstring; :func:`projects_delete`)."""
    return projects_delete(db=regions.db_for_conversation_id(project.pk), project_ids=[project.pk])


def projects_sweep(*, owner_id: int | None = None, org_id: int | None = None) -> Counter:
    """Delete, in every region's database, the projects owned by ``owner_id`` (personal and
    workspace ones: an account's deletion) or those of organisation ``org_id`` (its deletion),
    with everything of theirs (:func:`projects_delete`). Returns the rows deleted per model."""
    filters = {"owner_id": owner_id} if owner_id is not None else {"org_id": org_id}
    counts: Counter = Counter()
    for db in regions.region_dbs():
        ids = list(Project.objects.using(db).filter(**filters).values_list("pk", flat=True))
        counts.update(projects_delete(db=db, project_ids=ids))
    return counts
