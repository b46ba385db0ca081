"""Helpers for tests that drive the chat page and its event stream (and the /v1 streams): parse
SSE bytes, read a streaming response, a signed-in async client, post a message, and wait for a
condition in the event loop."""

from __future__ import annotations

import asyncio
import json
import re

from asgiref.sync import sync_to_async
from django.test import AsyncClient

HTMX = {"HX-Request": "true"}


def parse_sse(raw: bytes) -> list[tuple[str, dict, int | None]]:
    """[(event, data, id)] from SSE bytes (comments ignored)."""
    events = []
    for block in raw.decode("utf-8").split("\n\n"):
        fields = {}
        for line in block.split("\n"):
            if line and not line.startswith(":"):
                key, _, value = line.partition(": ")
                fields[key] = value
        if "event" in fields:
            eid = int(fields["id"]) if "id" in fields else None
            events.append((fields["event"], json.loads(fields["data"]), eid))
    return events


async def read_stream(response, *, limit: int | None = None) -> bytes:
    """Consume a streaming response (optionally only ``limit`` chunks, then disconnect)."""
    body = b""
    iterator = response.streaming_content
    count = 0
    try:
        async for chunk in iterator:
            body += chunk
            count += 1
            if limit is not None and count >= limit:
                break
    finally:
        await iterator.aclose()
    return body


async def signed_in(make_user, username="alice") -> tuple[AsyncClient, object]:
    user = await sync_to_async(make_user)(username)
    client = AsyncClient()
    await client.aforce_login(user)
    return client, user


async def post_message(client, content, conversation_id=None, **headers):
    url = f"/c/{conversation_id}/turns" if conversation_id else "/chat/turns"
    return await client.post(url, {"content": content}, headers={**HTMX, **headers})


def events_url_of(response) -> str:
    return re.search(r'sse-connect="([^"]+)"', response.content.decode()).group(1)


async def wait_for_async(read, expected, timeout=2.0):
    """Await ``read()`` until it returns ``expected`` (AssertionError after ``timeout`` s)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (value := await read()) != expected:
        assert loop.time() < deadline, f"still {value!r}, not {expected!r}"
        await asyncio.sleep(0.02)


async def wait_for(predicate, timeout=2.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
