"""Celery tasks of projects (issue 30): thin wrappers of projects/ingest.py.

``projects.file_ingest`` reads an added file in the worker: parsing never runs on a web
process's event loop. Its time limits back up the reader's own deadline
(``CHAT_PROJECT_FILE_MAX_SECONDS``, checked between pages, XML chunks and embedding batches): the
soft limit, 30 s later, marks the file FAILED; the hard limit, 60 s later, ends the pool process
(a parser stuck inside one call).
"""

from __future__ import annotations

from uuid import UUID

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import DatabaseError, InterfaceError

from projects import ingest


@shared_task(
    name="projects.file_ingest",
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(DatabaseError, InterfaceError),
    retry_backoff=5,
    max_retries=3,
    soft_time_limit=settings.CHAT_PROJECT_FILE_MAX_SECONDS + 30,
    time_limit=settings.CHAT_PROJECT_FILE_MAX_SECONDS + 60,
)
def file_ingest(file_id: str) -> None:
    """Celery: :func:`projects.ingest.file_ingest` for ``file_id`` (a UUID string). Safe to
    deliver more than once (a file no longer PENDING is skipped; passages are replaced)."""
    try:
        ingest.file_ingest(file_id=UUID(file_id))
    except SoftTimeLimitExceeded:
        ingest.file_fail(
            file_id=UUID(file_id),
            error=(
                f"Reading this file took longer than {settings.CHAT_PROJECT_FILE_MAX_SECONDS:g} s, "
                "so it was stopped. Split it into smaller files and add them one by one."
            ),
        )
