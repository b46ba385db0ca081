"""One answer at a time per conversation (PF-P1), in this process and across processes.

:func:`conversation_claim` checks and claims in this process with no await in between (atomic in
the event loop), then across server processes with Redis SET NX (conversations/answer_lock.py): of
two requests at the same moment one proceeds and the other gets ConversationBusy with nothing
stored.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from uuid import UUID

from conversations import answer_lock
from conversations.turnstream import stream_for_conversation

BUSY_MESSAGE = "An answer is still being written in this conversation. Wait for it or press Stop."

_claimed: set[UUID] = set()  # conversations whose next turn is being written


class ConversationBusy(Exception):
    """The conversation is still generating an answer; a new message must wait or stop it."""


def ensure_idle(conversation_id: UUID) -> None:
    """Raise ConversationBusy if the conversation is generating an answer right now (or a
    message to it is being stored)."""
    if stream_for_conversation(conversation_id) is not None or conversation_id in _claimed:
        raise ConversationBusy(BUSY_MESSAGE)


@contextlib.asynccontextmanager
async def conversation_claim(conversation_id: UUID, answer_id: UUID) -> AsyncIterator[None]:
    """Claim the conversation for a new answer ``answer_id`` for the block's duration (see the
    module docstring). If the block raises, the cross-process lock is released again; if it
    returns, the lock stays with ``answer_id`` until its answer is stored
    (conversations/generate.py). Raises ConversationBusy."""
    ensure_idle(conversation_id)
    _claimed.add(conversation_id)
    try:
        if not await answer_lock.conversation_lock(conversation_id, answer_id):
            raise ConversationBusy(BUSY_MESSAGE)
        try:
            yield
        except BaseException:
            await answer_lock.conversation_unlock(conversation_id, answer_id)
            raise
    finally:
        _claimed.discard(conversation_id)
