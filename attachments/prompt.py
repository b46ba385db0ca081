"""Attached files in the prompt (issue 8): their text goes into the user message they were sent
with, before the question, each between clear delimiters::

    [Attached file: notes.md]
    ...the file's text...
    [file truncated: first 1024 of 5310 tokens]
    [End of file]

    <the question>

The notice line is there only when the file was cut. The files go into the last user message,
after every stable part of the prompt (system prompt, memory, summary, earlier exchanges:
inference/prompts.py), so they never disturb the prefix the engine's cache reuses.

**Within the token budget.** Each file's stored text is at most
``settings.CHAT_ATTACHMENT_MAX_TOKENS`` tokens (cut at upload, attachments/files.py). If the
files together still do not fit the pool's prompt budget beside the system prompt and the
question, the room left is shared among them (smaller files whole, the rest cut to equal
shares) and the notice says how much of each went in. Earlier exchanges are dropped before
that (prompt_assemble keeps the question, which now holds the files, and drops history first).

**Which files.** A message being admitted (not stored yet, conversations/submit.py
``turn_submit``) gets the files its request sends, handed over in a context variable by
attachments/services.py ``turn_attachments``; a stored message (regenerate, a restart) the files
linked to it; an edit also the files of the message it replaces.
"""

from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass, field
from uuid import UUID

from attachments.files import text_truncate
from attachments.models import Attachment
from core import regions
from inference.prompts import chat_messages

FILE_HEADER = "[Attached file: {name}]"
FILE_FOOTER = "[End of file]"
TRUNCATION_NOTICE = "[file truncated: first {kept} of {about}{total} tokens]"
# Tokens kept free for what the separate counts cannot see (tokens merging across the joins).
MARGIN_TOKENS = 16


@dataclass
class Sending:
    """The files sent with the message being admitted, and (filled in by
    :func:`question_with_files`) how many tokens of each went into its prompt."""

    attachments: list[Attachment]
    fitted: dict[UUID, int] = field(default_factory=dict)


sending: contextvars.ContextVar[Sending | None] = contextvars.ContextVar("attachments_sending", default=None)

# Special-token spellings (<|im_start|>, <|eot_id|>, ...): a file must never open a new message
# of the chat template. The pipe is replaced by a look-alike so the text still reads the same.
_SPECIAL_TOKEN = re.compile(r"<\|([^|<>\n]{0,40})\|>")


def neutralised(text: str) -> str:
    """``text`` with chat-template special-token spellings made harmless (also used for project
    passages, projects/prompt.py)."""
    return _SPECIAL_TOKEN.sub(lambda m: f"<\u00a6{m.group(1)}\u00a6>", text)


def _prompt_name(name: str) -> str:
    """The file name as it appears in the header: no brackets, so it cannot close it."""
    return name.replace("[", "(").replace("]", ")")


def file_block(name: str, text: str, *, kept: int, total: int, estimated: bool = False) -> str:
    """One file's part of the message (module docstring); the notice when ``kept < total``
    ("of about M" when ``total`` is an estimate)."""
    lines = [FILE_HEADER.format(name=_prompt_name(name))]
    if text.strip():
        lines.append(neutralised(text.rstrip()))
    if kept < total:
        lines.append(TRUNCATION_NOTICE.format(kept=kept, total=total, about="about " if estimated else ""))
    lines.append(FILE_FOOTER)
    return "\n".join(lines)


def attachments_for_question(question) -> list[Attachment]:
    """The files that go into the prompt answering ``question`` (a user turn, stored or being
    admitted), in upload order: those sent with it (the request's, see :data:`sending`), those
    linked to it, and those of the message it edits. No query for a new message without files."""
    current = sending.get()
    pending = list(current.attachments) if current is not None else []
    turn_ids = [question.replaces_id] if question.replaces_id else []
    if not question._state.adding:
        turn_ids.append(question.turn_id)
    linked: list[Attachment] = []
    if turn_ids:
        db = regions.db_for_conversation_id(question.conversation_id)
        linked = list(
            regions.manager(Attachment, db)
            .filter(conversation_id=question.conversation_id, turn_id__in=turn_ids)
            .order_by("created_at", "attachment_id")
        )
    seen = {a.attachment_id for a in pending}
    return pending + [a for a in linked if a.attachment_id not in seen]


def _shares(sizes: list[int], room: int) -> list[int]:
    """Tokens for each file: all of a file when the room allows, else equal shares of what is
    left after the smaller files (water-filling). ``sizes`` and the result in the same order."""
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    shares = [0] * len(sizes)
    left = max(room, 0)
    for position, index in enumerate(order):
        share = min(sizes[index], left // (len(order) - position))
        shares[index] = share
        left -= share
    return shares


def question_with_files(question, *, system_prompt: str, engine, budget: int) -> str:
    """The user message for ``question``'s prompt: its files' blocks, then its text (just its
    text when it has no files). ``engine``: the answering pool's engine (its ``encode_chat`` and
    ``encode_text`` count tokens); ``budget``: the prompt budget in tokens (the pool's context
    minus the answer's ``max_tokens``). Records how many tokens of each file went in on the
    current :class:`Sending`, if any."""
    files = attachments_for_question(question)
    if not files:
        return question.content
    base = len(engine.encode_chat(chat_messages(system_prompt=system_prompt, question=question.content)))
    frames = [
        len(engine.encode_text(file_block(f.name, "", kept=0, total=max(f.tokens, 1)) + "\n\n"))
        for f in files
    ]
    room = budget - base - sum(frames) - MARGIN_TOKENS
    blocks = []
    current = sending.get()
    for attachment, share in zip(files, _shares([f.prompt_tokens for f in files], room), strict=True):
        if share >= attachment.prompt_tokens:
            text, kept = attachment.text, attachment.prompt_tokens
        else:
            text, kept = text_truncate(
                attachment.text, share, engine.encode_text, total=attachment.prompt_tokens
            )
        if current is not None:
            current.fitted[attachment.attachment_id] = kept
        total = max(attachment.tokens, kept)
        estimated = attachment.tokens_estimated
        blocks.append(file_block(attachment.name, text, kept=kept, total=total, estimated=estimated))
    return "\n\n".join([*blocks, question.content])
