"""Long-term user memory: durable facts about a user, with their sentence embeddings (issue 7)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from pgvector.django import HnswIndex, VectorField

from inference.embeddings import embedding_dimension


class UserMemory(models.Model):
    """One fact about a user ("prefers metric units"), embedded for similarity search.

    ``embedding`` is the fact's L2-normalised all-MiniLM-L6-v2 vector (inference/embeddings.py);
    its dimension comes from the model folder, not a literal. ``source_conversation_id`` names
    the conversation it was extracted from; conversations live in their region's database, so
    it is a plain UUID, not a foreign key (DESIGN.md: no constraints across databases).
    """

    class Source(models.TextChoices):
        EXTRACTED = "extracted", "Extracted from a conversation"
        EXPLICIT = "explicit", "Asked for in a conversation"  # "remember that I ...", "call me ..."
        MANUAL = "manual", "Added by hand"

    fact_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: the (user, created_at) index below serves user_id lookups.
    # No constraint: facts live in the user's home region's database, users in ``default``.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="memories",
        db_index=False,
        db_constraint=False,
    )
    text = models.TextField()
    embedding = VectorField(dimensions=embedding_dimension())
    source_conversation_id = models.UUIDField(null=True, blank=True)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.MANUAL)
    # Grounding (issue 28): the user turn the fact was read from and the span of its text
    # (character offsets, ``span_text`` == that turn's ``content[span_start:span_end]``). Empty
    # for facts added by hand. Turns live in the conversation's region: a plain UUID.
    source_turn_id = models.UUIDField(null=True, blank=True)
    span_start = models.PositiveIntegerField(null=True, blank=True)
    span_end = models.PositiveIntegerField(null=True, blank=True)
    span_text = models.TextField(blank=True, default="")
    # A single-valued kind of fact (memory/statements.py SLOTS: name, home, diet...): a newer
    # fact in the slot replaces the older one. Pinned slots go into every prompt.
    slot = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "user_memory"
        ordering = ["-created_at"]
        verbose_name = "user memory"
        verbose_name_plural = "user memories"
        indexes = [
            # Approximate nearest neighbours by cosine distance over the whole table (pgvector;
            # Malkov & Yashunin 2016). m / ef_construction: pgvector's defaults.
            HnswIndex(
                name="user_memory_embedding_hnsw",
                fields=["embedding"],
                m=16,
                ef_construction=64,
                opclasses=["vector_cosine_ops"],
            ),
            # One user's facts, newest first: the list page and the per-user exact scan.
            models.Index(fields=["user", "created_at"], name="user_memory_user_created"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id}: {self.text[:60]}"


class MemoryBlock(models.Model):
    """A user's memory block as it goes into every one of their conversations' instructions
    (DESIGN.md, "Memory in the prompt"; issues 19 and 28): their pinned profile (name, how to
    address them, standing preferences such as diet: memory/statements.py PINNED_SLOTS),
    sanitised, oldest first, one ``- fact`` line each (memory/blocks.py builds it). Their other
    facts enter a turn's prompt only when relevant to it (conversations/plan.py).

    ``version`` is bumped in the same transaction as every change of the user's facts or of
    their memory switch (memory/services.py); ``built_version`` is the version ``text`` was
    built from, so the block is current when they are equal (and ``budget`` is today's
    ``CHAT_MEMORY_MAX_TOKENS``). ``token_count``: the block's tokens as counted when built.
    ``overflow``: the facts did not fit the budget; ``text`` is then empty and turns retrieve
    the facts most like each message instead (memory.selectors.memory_block).
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="memory_block",
        db_constraint=False,  # the block lives in the user's home region's database
    )
    version = models.BigIntegerField(default=0)
    built_version = models.BigIntegerField(default=-1)
    text = models.TextField(blank=True, default="")
    token_count = models.PositiveIntegerField(default=0)
    budget = models.PositiveIntegerField(default=0)  # CHAT_MEMORY_MAX_TOKENS when built (tokens)
    overflow = models.BooleanField(default=False)
    # The user's facts outside the pinned profile when built: a turn retrieves the relevant
    # ones (issue 28); 0 -> nothing to retrieve, so a turn embeds nothing.
    retrievable = models.PositiveIntegerField(default=0)
    built_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "memory_block"

    def __str__(self) -> str:
        return f"memory block of {self.user_id} (version {self.built_version} of {self.version})"


class MemoryUpdate(models.Model):
    """A change to a user's memory asked for in a conversation ("remember that I ...", "forget
    that ...", "call me ..."; issue 28), shown as "Memory updated" under that turn's answer with
    an Undo. ``turn_id``: the user turn that asked; ``added``: ids (strings) of the facts it
    stored; ``removed``: the facts it deleted (replaced or forgotten), as dicts of their fields
    (text, slot, source, source_conversation_id, source_turn_id, span_start, span_end,
    span_text) so Undo can restore them; ``summary``: what the chat shows; ``undone_at``: when
    it was undone (None: in force)."""

    update_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memory_updates",
        db_index=False, db_constraint=False,  # in the user's home region's database
    )  # fmt: skip
    conversation_id = models.UUIDField(null=True, blank=True)
    turn_id = models.UUIDField(null=True, blank=True)
    added = models.JSONField(default=list)
    removed = models.JSONField(default=list)
    summary = models.CharField(max_length=400, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    undone_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "memory_update"
        indexes = [models.Index(fields=["user", "turn_id"], name="memory_update_user_turn")]

    def __str__(self) -> str:
        return f"{self.user_id}: {self.summary[:60]}"


# The extraction marker (memory/extraction_models.py) is a model of this app too: imported here so
# Django registers it with the app (flushes, admin, checks see its table).
from memory.extraction_models import ExtractionMarker  # noqa: E402, F401
