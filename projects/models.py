"""Projects (issue 30): a group of conversations with shared instructions and files.

**Where it lives.** ``projects`` is one of ``settings.CHAT_REGIONAL_APPS``: a project, its files'
rows and their passages (with their embeddings) are in the owner's home region database, the
organisation's region for a workspace project, like the conversations they hold. References to
users and organisations (global database) carry no constraint (DESIGN.md).

**Files.** The bytes are in Django storage under ``storage_name`` (never at a public URL); the
text is extracted in a Celery worker (never on a request's event loop), cut into passages, and
each passage is embedded with the model memory already ships (all-MiniLM-L6-v2, 384 dimensions).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone
from pgvector.django import VectorField

from inference.embeddings import embedding_dimension


class Project(models.Model):
    """A named group of conversations with its own instructions and files.

    Owned by a user; with ``org`` set, it is a workspace project: the organisation's current
    members may open it and chat in it (each member's chats stay their own), and it follows the
    organisation's retention.
    """

    project_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        db_constraint=False,
        related_name="projects",
    )
    org = models.ForeignKey(
        "accounts.Organisation",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        db_constraint=False,
        related_name="projects",
    )
    name = models.CharField(max_length=120)
    # Instructions for the model in every chat of the project: after the site's prompt, the
    # owner's custom instructions and the memory block, before the retrieved passages.
    instructions = models.TextField(blank=True)
    region = models.CharField(max_length=32)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [
            models.Index(fields=["owner", "updated_at"], name="project_owner_updated"),
            models.Index(fields=["org", "updated_at"], name="project_org_updated"),
        ]

    def __str__(self) -> str:
        return self.name


class ProjectFile(models.Model):
    """One file added to a project, and where its text extraction stands."""

    class Kind(models.TextChoices):
        TEXT = "text", "Text"
        MARKDOWN = "markdown", "Markdown"
        PDF = "pdf", "PDF"
        DOCX = "docx", "Word document"

    class Status(models.TextChoices):
        PENDING = "pending", "Reading"
        READY = "ready", "Ready"
        FAILED = "failed", "Could not be read"

    file_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="files")
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        db_constraint=False,
        related_name="+",
    )
    name = models.CharField(max_length=255)  # cleaned (attachments/files.py clean_name)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    size = models.PositiveBigIntegerField()  # bytes as uploaded
    sha256 = models.CharField(max_length=64)
    storage_name = models.CharField(max_length=255)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    # Why a file could not be read, in words a person can act on (blank unless FAILED).
    error = models.TextField(blank=True)
    pages = models.PositiveIntegerField(null=True, blank=True)  # PDF and DOCX; None for text
    chars = models.PositiveIntegerField(default=0)  # extracted text, characters
    created_at = models.DateTimeField(default=timezone.now)
    ready_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["project", "created_at"], name="project_file_created")]

    def __str__(self) -> str:
        return self.name


class ProjectPassage(models.Model):
    """A passage of a project file's text with its embedding: what a turn retrieves.

    ``start``/``end`` are character offsets into the file's extracted text, so a source can be
    shown in place; ``embedding`` is the passage's L2-normalised all-MiniLM-L6-v2 vector.
    Retrieval is an exact scan of one project's passages (a project holds few thousand at most;
    the same reasoning as memory's per-user scan: an HNSW search filtered afterwards loses rows).
    """

    passage_id = models.BigAutoField(primary_key=True)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="passages")
    file = models.ForeignKey(ProjectFile, on_delete=models.CASCADE, related_name="passages")
    ordinal = models.PositiveIntegerField()  # position in its file, from 0
    start = models.PositiveIntegerField()
    end = models.PositiveIntegerField()
    text = models.TextField()
    tokens = models.PositiveIntegerField()  # the chat model's tokenizer
    embedding = VectorField(dimensions=embedding_dimension())

    class Meta:
        ordering = ["file_id", "ordinal"]
        indexes = [models.Index(fields=["project", "file"], name="project_passage_project")]

    def __str__(self) -> str:
        return f"{self.file_id}#{self.ordinal}"


class ProjectTurnSource(models.Model):
    """One passage an answer in a project chat was given: what its "Sources" list shows.

    Keyed by the *assistant* turn (``answer_id``): each answer version has the passages its own
    prompt held, so Regenerate shows fresh sources and an older version keeps its own. Written
    when the answer starts (projects/sources.py ``turn_sources_store``), never for a
    zero-retention conversation (nothing of it is kept at rest).

    A copy, not a reference: ``file_name`` and ``text`` are copied from the passage, so the list
    reads the same after its file (or passage) is deleted, in the shared snapshot and in the
    export. ``file_id`` / ``passage_id`` carry no constraint for that reason. The row goes with
    its conversation (CASCADE, through the deletion service, conversations/deletion.py).
    """

    source_id = models.BigAutoField(primary_key=True)
    conversation = models.ForeignKey(
        "conversations.Conversation", on_delete=models.CASCADE, related_name="project_sources"
    )
    answer_id = models.UUIDField()  # the assistant turn (stored after this row, or never)
    question_id = models.UUIDField()  # the user turn it answers
    position = models.PositiveSmallIntegerField()  # order in the prompt, from 0
    file_id = models.UUIDField(null=True, blank=True)
    passage_id = models.BigIntegerField(null=True, blank=True)
    file_name = models.CharField(max_length=255)
    start = models.PositiveIntegerField()  # character offsets in the file's extracted text
    end = models.PositiveIntegerField()
    text = models.TextField()  # the passage as the prompt held it
    similarity = models.FloatField()  # cosine similarity to the question, 0..1
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["answer_id", "position"]
        indexes = [models.Index(fields=["conversation", "answer_id"], name="project_source_answer")]

    def __str__(self) -> str:
        return f"{self.file_name} for {self.answer_id}"
