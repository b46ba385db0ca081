"""Adding a file to a project, on the request (issue 30): the caller's rate limit, the cheap
checks, the bytes into storage, a PENDING row and the worker's task queued after commit. The
reading itself is projects/ingest.py's, in the worker (projects/tasks.py); this module is above
both, so neither imports it.
"""

from __future__ import annotations

import hashlib
from uuid import UUID

from django.conf import settings
from django.db import transaction

from attachments.files import clean_name, size_text
from core import db_breaker, dbrouter, regions
from projects import tasks
from projects.files import FileRefused, kind_detect
from projects.ingest import stored_files_delete, project_db, project_file_storage
from projects.models import Project, ProjectFile


def upload_admit(*, project: Project, user) -> None:
    """Count an upload request against ``user``'s requests per minute, as a chat request is
    (gateway/gate.py ``rate_limit``: one request from the RPM buckets of the user and of the
    project's organisation, no tokens), before its body is read. Both entrypoints call it once
    per request (the page's form may carry several files; /v1 one). Raises gate.Refused 429
    with Retry-After when a bucket is empty; fails open while Redis is down, as the chat's
    limits do. Sync (reads the caller's organisation)."""
    from asgiref.sync import async_to_sync  # noqa: PLC0415

    from accounts.callers import caller_for  # noqa: PLC0415 - accounts loads the gateway
    from gateway import gate  # noqa: PLC0415

    org = project.org if project.org_id is not None else None
    async_to_sync(gate.rate_limit)(caller_for(user, org), prompt_tokens=0, max_tokens=0)



def project_file_add(*, project: Project, user, upload) -> ProjectFile:
    """Add ``upload`` (a Django ``UploadedFile``) to ``project`` as ``user``: checked, stored,
    a PENDING row, and its reading queued after commit (module docstring). The caller has
    checked that ``user`` may add files to ``project``. Cost on the request: one pass over the
    bytes (SHA-256, the copy into storage), none parsing them. Raises FileRefused: 400 empty,
    413 over ``settings.CHAT_PROJECT_FILE_MAX_BYTES``, 413 ``too_many_files`` when the project
    holds :func:`max_files` already (counted under a lock of the project's row, so two uploads at
    once cannot both take the last place), 415 not text, Markdown, PDF or DOCX (by content);
    PrimaryDown (503) while the region's primary is down."""
    name = clean_name(getattr(upload, "name", None))
    _room_check(project, name)  # before a byte is read
    limit = settings.CHAT_PROJECT_FILE_MAX_BYTES
    if not upload.size:
        raise FileRefused(400, "empty_file", f"{name} is empty (0 bytes). Add a file with text in it.")
    if upload.size > limit:
        raise FileRefused(
            413, "file_too_large",
            f"{name} is {size_text(upload.size)}; a project file can be at most {size_text(limit)}. "
            "Split it and add the parts.",
        )  # fmt: skip
    kind = kind_detect(name=name, stream=upload)
    digest = hashlib.sha256()
    for piece in upload.chunks():
        digest.update(piece)
    upload.seek(0)
    db = project_db(project)
    db_breaker.primary_ensure(db)  # PrimaryDown (503) before a byte is stored
    file_id = regions.new_conversation_id(project.region)
    storage = project_file_storage(file_id=file_id)
    stored = storage.save(f"{project.pk}/{file_id}", upload)
    try:
        with dbrouter.pinned(db, user.pk), transaction.atomic(using=db):
            Project.objects.using(db).select_for_update().filter(pk=project.pk).first()
            _room_check(project, name, db=db)
            row = ProjectFile.objects.using(db).create(
                file_id=file_id, project=project, uploaded_by_id=user.pk, name=name, kind=kind,
                size=upload.size, sha256=digest.hexdigest(), storage_name=stored,
            )  # fmt: skip
            transaction.on_commit(lambda: _queue(file_id), using=db)
    except BaseException:
        stored_files_delete([stored])
        raise
    return row


def max_files() -> int:
    """How many files a project may hold: ``settings.CHAT_PROJECT_MAX_FILES`` (default 100;
    failed files count too, until deleted: each holds its stored bytes)."""
    return settings.CHAT_PROJECT_MAX_FILES


def _room_check(project: Project, name: str, *, db: str | None = None) -> None:
    """Raise FileRefused 413 ``too_many_files`` when ``project`` holds :func:`max_files`."""
    most = max_files()
    held = ProjectFile.objects.using(db or project_db(project)).filter(project_id=project.pk).count()
    if held >= most:
        raise FileRefused(
            413, "too_many_files",
            f"This project has {held} files; a project can hold at most {most}. Delete a file you no "
            f"longer need before adding {name}.",
        )  # fmt: skip


def _queue(file_id: UUID) -> None:
    tasks.file_ingest.delay(str(file_id))
