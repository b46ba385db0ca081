"""The training export (issue 20): the conversations whose turns may be used to train models, as
JSON Lines in chat format, for ``manage.py training_export``.

**What a line is.** One conversation:
``{"messages": [{"role": "system", "content": ...}, {"role": "user", ...}, {"role":
"assistant", ...}, ...]}`` (the chat format of OpenAI's and Hugging Face's fine-tuning tools).
The messages are the branch its page shows: the selected path of its turn tree
(conversations/versions.py, ``Conversation.branch_choices``), each position's current question
with the answer shown (its newest version; a continued answer's continuation, which holds the
whole text). The conversation's own instructions (``system_prompt``), when it has any, come
first as the system message; the site's prompt, a person's custom instructions and memory are
not part of the conversation and are never exported.

**What is left out.**

- Every turn with ``training_eligible`` false: the tag is decided when the turn is written, from
  the owner's and the organisation's opt-out (accounts/selectors.py ``turn_training_eligible``),
  and never changed afterwards, so turns written before an opt-out keep their tag.
- Turns that are no sample of a finished exchange: a blocked message, a cancelled, failed or
  blocked answer, an empty one.
- An exchange goes out whole or not at all: a question whose shown answer is left out is left
  out too (and the other way round), so a line alternates user and assistant and never holds a
  question without its answer. Positions after a left-out one still go out.
- A conversation with no exchange left writes no line (not even its system message).
- Zero-retention organisations' and temporary chats' turns are never stored, so never read;
  answers still held in Redis awaiting write-back are not read either (they get their tag when
  they are stored, and go out with the next export).

**Filters.** ``since``: only exchanges whose question was written at or after it (conversations
whose last turn is older are not read at all). ``region``: only that region's conversations;
without it, every region's database in turn (core/regions.py ``region_dbs``).

**Memory.** Streamed: conversations are read in batches of ``privacy.export_sections.BATCH``
per region database (keyset on ``(created_at, conversation_id)``), each batch's turns with one
query through a server-side cursor, one conversation's turns held at a time, and each line is
yielded as soon as it is built.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime

from conversations.models import Conversation, Turn
from conversations.selectors import positions_build
from core import regions
from privacy.export_sections import conversation_batches

TURN_FIELDS = (
    "turn_id", "conversation_id", "role", "content", "status", "reply_to_id", "replaces_id",
    "parent_id", "continues_id", "created_at", "training_eligible",
)  # fmt: skip
CURSOR_ROWS = 2000  # turns fetched per round trip of the server-side cursor


def _usable(turn: Turn | None) -> bool:
    """Whether ``turn`` may go into a training sample: eligible, complete and with text."""
    return (
        turn is not None
        and turn.training_eligible
        and turn.status == Turn.Status.COMPLETE
        and bool(turn.content.strip())
    )


def training_messages(
    conversation: Conversation, turns: list[Turn], *, since: datetime | None = None
) -> list[dict[str, str]]:
    """The chat-format messages of ``conversation`` for training (module docstring), from all
    its stored ``turns`` (any order; the whole log, so the tree and its branches are known):
    ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``, or [] when no exchange
    may go out. ``since``: leave out exchanges whose question is older (aware datetime)."""
    messages: list[dict[str, str]] = []
    for position in positions_build(turns, conversation.branch_choices):
        question, answer = position.question, position.answer
        if since is not None and question.created_at < since:
            continue
        if _usable(question) and _usable(answer):
            messages.append({"role": "user", "content": question.content})
            messages.append({"role": "assistant", "content": answer.content})
    if messages and conversation.system_prompt.strip():
        messages.insert(0, {"role": "system", "content": conversation.system_prompt})
    return messages


def training_records(
    *, since: datetime | None = None, region: str | None = None
) -> Iterator[dict[str, list[dict[str, str]]]]:
    """``{"messages": [...]}`` for each conversation with something to export
    (:func:`training_messages`), every region's database in turn (only ``region``'s when given),
    each oldest conversation first. A generator: nothing is read before the first item is
    asked for, and one batch of conversations is held at a time. Raises
    core.regions.RegionUnavailable for a region not served here."""
    filters: dict = {"last_turn_at__isnull": False}
    dbs = None
    if region is not None:
        dbs = [regions.db_for_region(region)]
        # With one database for every region the label is all that tells them apart.
        filters["region"] = region
    if since is not None:
        filters["last_turn_at__gte"] = since
    for db, batch in conversation_batches(dbs=dbs, **filters):
        by_id = {c.pk: c for c in batch}
        turns = (
            Turn.objects.using(db)
            .filter(conversation_id__in=list(by_id))
            .only(*TURN_FIELDS)
            .order_by("conversation_id", "created_at", "turn_id")
            .iterator(chunk_size=CURSOR_ROWS)
        )
        for conversation_id, group in itertools.groupby(turns, key=lambda t: t.conversation_id):
            messages = training_messages(by_id[conversation_id], list(group), since=since)
            if messages:
                yield {"messages": messages}
