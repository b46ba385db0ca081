"""Helpers for tests of turn versions and of answers read through the chat page: spy on the
prompts the engine double is sent, snapshot a conversation's stored turns, read an answer to
its end, send a message and read its answer, and make an unsaved turn."""

from __future__ import annotations

import uuid

from conversations import turnstream
from conversations.models import Turn
from tests.chat_support import events_url_of, parse_sse, post_message, read_stream


def spy_prompts(engine):
    """Record the chat messages of each prompt the engine double is asked to generate from:
    the assembler's last ``encode_chat`` call before each ``generate`` is the prompt sent."""
    encode, generate = engine.encode_chat, engine.generate
    last: list = []
    prompts: list[list[dict]] = []

    def encode_chat(messages):
        last[:] = [list(messages)]
        return encode(messages)

    def generate_recorded(ids, options, request_id):
        prompts.append(last[0])
        return generate(ids, options, request_id)

    engine.encode_chat = encode_chat
    engine.generate = generate_recorded
    return prompts


def contents(messages) -> list[str]:
    return [m["content"] for m in messages if m["role"] != "system"]


def snapshot(conversation_id) -> dict:
    """Every stored turn of a conversation, all columns: to prove nothing was updated."""
    return {
        t["turn_id"]: t
        for t in Turn.objects.filter(conversation_id=conversation_id).values()
    }


async def read_answer(client, response) -> list:
    """Read the answer a page fragment streams, to its end and until the conversation is free
    again (the cross-process lock goes after the event log is flushed, just after `done`)."""
    url = events_url_of(response)
    events = parse_sse(await read_stream(await client.get(url)))
    stream = turnstream.stream_for_question(uuid.UUID(url.split("/")[4]))
    if stream is not None:
        await stream.wait()
    return events


async def answered(client, content, conversation_id=None) -> tuple[str, str]:
    """Send a message through the page and read its answer to the end; (conversation id,
    question id)."""
    response = await post_message(client, content, conversation_id)
    assert response.status_code == 200, response.content
    await read_answer(client, response)
    url = events_url_of(response)
    return url.split("/")[2], url.split("/")[4]


def make_turn(role, content, at, **fields) -> Turn:
    return Turn(role=role, content=content, created_at=at, conversation_id=uuid.uuid4(), **fields)
