"""Conversations and their append-only turn log."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector
from django.db import models
from django.utils import timezone


class Conversation(models.Model):
    """One chat thread owned by a user, stored in the owner's home region."""

    conversation_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Accounts and organisations live in the global (default) database; conversations in their
    # home region's database. References across databases carry no FK constraint (DESIGN.md).
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        db_constraint=False,
        related_name="conversations",
    )
    org = models.ForeignKey(
        "accounts.Organisation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_constraint=False,
        related_name="conversations",
    )
    title = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200)
    # Instructions for the model in this conversation, after the site's prompt, the owner's
    # custom instructions and the memory block (inference/prompts.py system_message); blank: none.
    system_prompt = models.TextField(blank=True)
    region = models.CharField(max_length=32)
    created_at = models.DateTimeField(default=timezone.now)
    last_turn_at = models.DateTimeField(default=timezone.now)
    # The running summary of the turns up to ``summary_through`` (their created_at), written by
    # the summarisation task once the conversation outgrows the prompt budget; blank: none yet.
    summary = models.TextField(blank=True)
    summary_through = models.DateTimeField(null=True, blank=True)
    # Shared with its organisation's workspace (workspaces/): the org's current members may read
    # it (read-only); only the owner writes. Meaningless without ``org``.
    shared_with_org = models.BooleanField(default=False, db_default=False)
    # The branch the user last looked at (conversations/versions.py): at each fork of the turn
    # tree, the key (the parent message's id, "" for the first messages) -> the chosen child's
    # id. Stored, so a reload and another device show the same branch.
    branch_choices = models.JSONField(default=dict, blank=True, db_default={})
    # The answer version the user last looked at (``< i/n >``): question id -> the chosen
    # answer's id; a question without one shows its newest answer (conversations/versions.py).
    answer_choices = models.JSONField(default=dict, blank=True, db_default={})
    # A temporary chat (issue 18): zero-retention at the user's choice (selectors.
    # conversation_zero_retention), never listed, deleted when its page goes away or
    # settings.CHAT_ZDR_TTL_S after its last turn (retention.temporary_chats_purge_expired).
    temporary = models.BooleanField(default=False, db_default=False)
    # Pinned to the top of the owner's sidebar (issue 29 item 8), since when; null: not pinned.
    # Pinned chats are listed first, the latest pinned first (conversations/sidebar.py).
    pinned_at = models.DateTimeField(null=True, blank=True)
    # The project it belongs to (projects/, issue 30), null: none. Same region database (a
    # project's chats live where the project does). Deleting a project deletes its chats through
    # the deletion service (projects/services.py), never by this key's cascade.
    project = models.ForeignKey(
        "projects.Project",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="conversations",
    )

    class Meta:
        indexes = [
            models.Index(fields=["owner", "-last_turn_at"], name="conv_owner_recent"),
            # A workspace's shared conversations, most recently active first (workspaces/).
            models.Index(
                fields=["org", "-last_turn_at"],
                name="conv_org_shared_recent",
                condition=models.Q(shared_with_org=True),
            ),
        ]

    def __str__(self) -> str:
        return self.title or str(self.conversation_id)


class Turn(models.Model):
    """One message in a conversation. Append-only: content is never updated or deleted
    (a conversation's deletion aside).

    Shaped for monthly partitioning on ``created_at`` (DESIGN.md): the model's pk stays
    ``turn_id`` (a UUID, unique on its own), nothing else holds a database-level foreign key to
    this table, and turn-to-turn references (``reply_to``) use ``db_constraint=False``, so a later
    migration can make the database key ``(turn_id, created_at)`` without touching callers.
    """

    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"
        SYSTEM = "system", "System"
        TOOL = "tool", "Tool"

    class Status(models.TextChoices):
        COMPLETE = "complete", "Complete"
        CANCELLED = "cancelled", "Cancelled"
        FAILED = "failed", "Failed"
        # Stopped by a moderation gate: a user message that never reached the engine, or an
        # answer whose flagged text was withdrawn (moderation_verdict says why).
        BLOCKED = "blocked", "Blocked"

    turn_id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="turns")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField()
    # Tokens of ``content``: completion tokens for an assistant turn, prompt-side tokens for
    # the others. ``prompt_tokens`` is the whole prompt an assistant turn was generated from.
    token_count = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    moderation_verdict = models.JSONField(default=dict, blank=True)
    reply_to = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    # Append-only edits: an edited user message or a regenerated answer is a new turn that
    # names the turn it replaces (the UI flips between versions); nothing is overwritten.
    replaces = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    # For a user turn: the user message before it on its branch (None: a first message, or a
    # turn written before branches existed, whose parent conversations/versions.py derives).
    # An edit is a sibling of the message it edits: same parent, ``replaces`` = that message.
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    # For an assistant turn written by Continue (issue 18): the cut-off answer it continues.
    # Its content is the whole answer (the continued text, then the new), so it stands in for
    # that answer: the page shows one answer, the prompt uses it (conversations/versions.py).
    continues = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    # For an assistant turn: how many of the oldest earlier turns were left out of (or
    # summarised for) its prompt to fit the token budget; 0: the whole history fitted.
    context_trimmed = models.PositiveIntegerField(default=0)
    # For an assistant turn: the pool and model version that answered it (inference/pools.py),
    # the prompt tokens the engine served from its prefix cache, and the cost in USD at the
    # pool's prices (prompt - cached at the input price, cached at the cached-input price,
    # completion at the output price). Blank / null on user turns and on older rows.
    # Database defaults too: bulk loads (partition maintenance, restores) that write raw SQL
    # need not name them.
    pool = models.CharField(max_length=64, blank=True, default="", db_default="")
    model_version = models.CharField(max_length=100, blank=True, default="", db_default="")
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)
    # Whether the turn may be used to train models: False when it was written in a conversation
    # of an organisation with ``not_for_training`` set, True otherwise (decided when the turn is
    # written: conversations/services.py). A database default too, like ``pool`` above.
    training_eligible = models.BooleanField(default=True, db_default=True)
    # For an assistant turn: why it ended (conversations/events.py): "stop", "length" (cut off
    # at the completion budget), "cancelled", "moderation", "error"; blank on user turns and on
    # rows older than the field (their status tells the rest).
    finish_reason = models.CharField(max_length=16, blank=True, default="", db_default="")
    # For an assistant turn: its latency as the turn pipeline measured it (gateway/run.py
    # Answer), milliseconds: TTFT from the start of generation (admission wait included) to
    # the first text, TPOT (last text - first) / (completion tokens - 1); None where not
    # measured (no text, one token, or written before issue 19). The admin's canary page
    # compares model versions by them.
    ttft_ms = models.FloatField(null=True, blank=True)
    tpot_ms = models.FloatField(null=True, blank=True)
    # Function calling (issue 30): on an assistant turn, the calls it made (OpenAI's
    # ``tool_calls`` items: ``{"id", "type": "function", "function": {"name", "arguments"}}``,
    # arguments a JSON text; [] for none); on a ``tool`` turn, the id of the call whose result it
    # is (its ``reply_to`` is the assistant turn that made the call). Database defaults, as for
    # ``pool``: adding them to the partitioned table rewrites nothing.
    tool_calls = models.JSONField(default=list, blank=True, db_default=[])
    tool_call_id = models.CharField(max_length=200, blank=True, default="", db_default="")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ("created_at", "turn_id")
        indexes = [
            # Keyset history pages: one conversation, newest first (migration 0004).
            models.Index(fields=["conversation", "created_at", "turn_id"], name="turn_conv_keyset"),
            # Full-text search over turn text (search_selectors.conversation_search, migration 0005);
            # the query must use this very expression for the index to serve it.
            GinIndex(SearchVector("content", config="english"), name="turn_content_fts"),
        ]

    def __str__(self) -> str:
        return f"{self.role} turn {self.turn_id}"
