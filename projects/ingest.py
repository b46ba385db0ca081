"""Project files in the worker and their deletion (issue 30): read a file, fail it, delete it.

The path of a file:

1. projects/uploads.py ``project_file_add``, on the request: the cheap checks only (size, kind by content:
   projects/files.py ``kind_detect``), the bytes into Django storage
   (:func:`project_file_storage` here), the row PENDING in the project's region database, and the
   ``projects.file_ingest`` task queued once that row is committed.
2. :func:`file_ingest`, in a Celery worker (projects/tasks.py): extract the text within the
   limits (projects/files.py), cut it into passages (projects/chunking.py), embed them in batches
   with the model memory ships (inference/embeddings.py), store them and mark the file READY; or
   mark it FAILED with the refusal's message. Never on a web process's event loop: parsing a
   50 MB PDF takes the worker seconds of CPU, and nobody's stream waits for it.
3. :func:`project_file_delete`: the row and its passages now, the bytes once that is committed.

Where things are: rows in the project's region database (``Project.region``); file ids are
minted like conversation ids (``regions.new_conversation_id``), so an id alone names its region
and the worker goes straight to the right database; the bytes under ``<project id>/<file id>`` in
the region's storage root.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from uuid import UUID

from django.conf import settings
from django.core.files.storage import Storage, storages
from celery.exceptions import SoftTimeLimitExceeded
from django.db import DatabaseError, InterfaceError, transaction
from django.utils import timezone

from attachments.files import AttachmentRejected
from core import db_breaker, dbrouter, regions
from projects.chunking import Chunk, chunk_text
from projects.files import Extracted, FileRefused, text_extract
from projects.models import Project, ProjectFile, ProjectPassage

logger = logging.getLogger(__name__)

# Passages embedded per call (the deadline is checked between calls) and stored per INSERT.
EMBED_BATCH = 64
INSERT_BATCH = 500
UNEXPECTED = (
    "This file could not be read because of an error on our side (it has been logged). Delete "
    "it and add it again; if it fails again, save it in another format (e.g. PDF or .txt)."
)


def project_db(project: Project) -> str:
    """The primary alias holding ``project`` (where it was loaded from, else its region's)."""
    if project._state.db:
        return dbrouter.primary_of(project._state.db)
    return regions.db_for_region(project.region)


def project_file_storage(*, file_id: UUID | str | None = None) -> Storage:
    """The storage holding project file ``file_id``: ``settings.CHAT_PROJECT_FILE_STORAGE`` (a
    STORAGES entry; by default FileSystemStorage under ``MEDIA_ROOT/projects``, files 0600), with
    its location set to ``settings.CHAT_REGION_PROJECT_FILE_ROOTS[region]`` when the region the
    id names has one (issue 20's region-scoped stores, as attachments' storage does)."""
    entry = settings.CHAT_PROJECT_FILE_STORAGE
    region = regions.region_of_id(file_id) if file_id is not None else None
    root = settings.CHAT_REGION_PROJECT_FILE_ROOTS.get(region) if region else None
    if root:
        entry = {**entry, "OPTIONS": {**entry.get("OPTIONS", {}), "location": root}}
    return storages.create_storage(entry)


# --- on the request -------------------------------------------------------------------------


# --- in the worker --------------------------------------------------------------------------


def file_ingest(*, file_id: UUID) -> None:
    """Read project file ``file_id`` into passages (module docstring, step 2). Does nothing for
    a file that is gone or no longer PENDING. Safe to deliver more than once: a redelivered
    file's passages are replaced in the transaction that marks it READY. A refusal
    (FileRefused / AttachmentRejected: limits, damaged or image-only files, the
    ``CHAT_PROJECT_FILE_MAX_SECONDS`` deadline) marks it FAILED with its message; database
    errors propagate (the task retries)."""
    located = _file_find(file_id)
    if located is None:
        return
    db, row = located
    if row.status != ProjectFile.Status.PENDING:
        return
    deadline = time.monotonic() + settings.CHAT_PROJECT_FILE_MAX_SECONDS
    try:
        extracted = text_extract(name=row.name, kind=row.kind, data=_file_bytes(row), deadline=deadline)
        chunks = chunk_text(
            extracted.text, count_tokens=_count_tokens(),
            target_tokens=settings.CHAT_PROJECT_CHUNK_TOKENS,
            overlap_tokens=settings.CHAT_PROJECT_CHUNK_OVERLAP_TOKENS,
        )  # fmt: skip
        vectors = _embed(chunks, row.name, deadline)
    except AttachmentRejected as exc:
        file_fail(file_id=file_id, error=exc.message)
        return
    except (DatabaseError, InterfaceError, SoftTimeLimitExceeded):
        raise  # the task retries / marks the time limit
    except Exception:  # noqa: BLE001 - a bug must not leave the file "Reading" forever
        logger.exception("project file %s could not be read", file_id)
        file_fail(file_id=file_id, error=UNEXPECTED)
        return
    _file_store(db, row, extracted, chunks, vectors)


def file_fail(*, file_id: UUID, error: str) -> None:
    """Mark PENDING file ``file_id`` FAILED with ``error`` (for a person); no-op otherwise."""
    located = _file_find(file_id)
    if located is None:
        return
    db, _row = located
    with dbrouter.pinned(db), transaction.atomic(using=db):
        ProjectFile.objects.using(db).filter(pk=file_id, status=ProjectFile.Status.PENDING).update(
            status=ProjectFile.Status.FAILED, error=error
        )


def _file_find(file_id: UUID) -> tuple[str, ProjectFile] | None:
    """(database, row) of file ``file_id``: the region its id names, else each region's."""
    region = regions.region_of_id(file_id)
    dbs = regions.region_dbs()
    if region is not None:
        try:
            dbs = [regions.db_for_region(region)]
        except regions.RegionUnavailable:
            pass
    for db in dbs:
        row = ProjectFile.objects.using(db).filter(pk=file_id).first()
        if row is not None:
            return db, row
    return None


def _file_bytes(row: ProjectFile) -> bytes:
    storage = project_file_storage(file_id=row.file_id)
    with storage.open(row.storage_name, "rb") as stored:
        return stored.read(settings.CHAT_PROJECT_FILE_MAX_BYTES + 1)


def _count_tokens() -> Callable[[str], int]:
    """The chat model's token count (its tokenizer alone: the worker starts no engine)."""
    from inference.engine import get_engine  # noqa: PLC0415 - the engine layer loads lazily

    encode = get_engine().encode_text
    return lambda text: len(encode(text))


def _embed(chunks: Sequence[Chunk], name: str, deadline: float) -> list[list[float]]:
    """The passages' embeddings (inference/embeddings.py ``embed``; with their headings when
    ``settings.CHAT_PROJECT_EMBED_HEADINGS``), :data:`EMBED_BATCH` at a time, checking the
    deadline between batches. Raises FileRefused 413 ``took_too_long``."""
    from inference.embeddings import embed  # noqa: PLC0415 - loads torch on first use

    with_heading = settings.CHAT_PROJECT_EMBED_HEADINGS
    vectors: list[list[float]] = []
    for i in range(0, len(chunks), EMBED_BATCH):
        if time.monotonic() > deadline:
            raise FileRefused(
                413, "took_too_long",
                f"Reading {name} took longer than {settings.CHAT_PROJECT_FILE_MAX_SECONDS:g} s, so "
                "it was stopped. Split it into smaller files and add them one by one.",
            )  # fmt: skip
        batch = chunks[i : i + EMBED_BATCH]
        vectors += embed([c.embedding_text(with_heading=with_heading) for c in batch])
    return vectors


def _file_store(db: str, row: ProjectFile, extracted: Extracted, chunks, vectors) -> None:
    """Replace the file's passages and mark it READY, in one transaction, if it is still there
    and PENDING (deleted meanwhile: nothing is stored)."""
    with dbrouter.pinned(db), transaction.atomic(using=db):
        current = (
            ProjectFile.objects.using(db).select_for_update()
            .filter(pk=row.pk, status=ProjectFile.Status.PENDING).first()
        )  # fmt: skip
        if current is None:
            return
        ProjectPassage.objects.using(db).filter(file_id=row.pk).delete()
        ProjectPassage.objects.using(db).bulk_create(
            (
                ProjectPassage(
                    project_id=row.project_id, file_id=row.pk, ordinal=c.ordinal, start=c.start,
                    end=c.end, text=c.text, tokens=c.tokens, embedding=v,
                )  # fmt: skip
                for c, v in zip(chunks, vectors, strict=True)
            ),
            batch_size=INSERT_BATCH,
        )
        current.status = ProjectFile.Status.READY
        current.error = ""
        current.chars = len(extracted.text)
        current.pages = extracted.pages
        current.ready_at = timezone.now()
        current.save(update_fields=["status", "error", "chars", "pages", "ready_at"])


# --- deletion -------------------------------------------------------------------------------


def project_file_delete(*, file: ProjectFile) -> None:
    """Delete ``file``: its row and passages now (one transaction on its database), its bytes
    once that commits. A worker still reading it finds it gone and stores nothing."""
    db = dbrouter.primary_of(file._state.db) if file._state.db else project_db(file.project)
    db_breaker.primary_ensure(db)
    with dbrouter.pinned(db), transaction.atomic(using=db):
        names = [file.storage_name]
        ProjectPassage.objects.using(db).filter(file_id=file.pk).delete()
        ProjectFile.objects.using(db).filter(pk=file.pk).delete()
        transaction.on_commit(lambda: stored_files_delete(names), using=db)


def stored_files_delete(names: Iterable[str]) -> None:
    """Remove stored files (``<project id>/<file id>``); a failure is logged and the rest are
    still removed (the row is gone: a leftover file is unreachable through the app)."""
    for name in names:
        try:
            project_file_storage(file_id=name.rsplit("/", 1)[-1]).delete(name)
        except Exception:  # noqa: BLE001 - one file's failure must not keep the others
            logger.exception("could not delete project file %s", name)
