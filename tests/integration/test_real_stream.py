"""The real thing: daphne + Django + the real vLLM engine + PostgreSQL, over real HTTP."""

from __future__ import annotations

import json
import re
import socket
import time
from urllib.parse import urlsplit

import pytest

from conversations.models import Turn

pytestmark = pytest.mark.real_engine


def send(client, content: str, conversation_id=None) -> tuple[str, str]:
    """Post a message as the page does; return (conversation_id, events_url)."""
    url = f"/c/{conversation_id}/turns" if conversation_id else "/chat/turns"
    response = client.post(url, data={"content": content}, headers={"HX-Request": "true"})
    assert response.status_code == 200, response.text
    events_url = re.search(r'sse-connect="([^"]+)"', response.text).group(1)
    conversation_id = events_url.split("/")[2]
    return conversation_id, events_url


def read_events(client, events_url: str, *, until: str = "done", timeout: float = 120):
    """Read an event stream; return [(event, data, arrival_s)] up to and including ``until``."""
    events = []
    started = time.monotonic()
    with client.stream("GET", events_url, timeout=timeout) as response:
        assert response.status_code == 200
        name = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[6:]), time.monotonic() - started))
                if name in (until, "error"):
                    break
    return events


def answer_turn(events_url: str) -> Turn:
    question_id = events_url.split("/")[4]
    return Turn.objects.get(reply_to_id=question_id)


def test_reply_streams_token_by_token_and_stored_text_equals_stream(live, make_user):
    """A real reply arrives as many token events spread over time; the stored assistant turn
    equals the joined stream, with usage."""
    make_user("alice")
    client = live.login("alice")
    _, events_url = send(client, "Write three sentences about the ocean.")

    events = read_events(client, events_url)

    tokens = [e for e in events if e[0] == "token"]
    done = events[-1]
    assert done[0] == "done"
    assert len(tokens) >= 5
    assert done[2] - tokens[0][2] > 0.1  # the first token came well before the end
    streamed = "".join(data["text"] for _, data, _ in tokens)
    stored = answer_turn(events_url)
    assert stored.content == streamed
    assert stored.status == Turn.Status.COMPLETE
    assert stored.token_count == done[1]["usage"]["completion_tokens"] > 0
    assert stored.prompt_tokens == done[1]["usage"]["prompt_tokens"] > 0
    assert live.unfinished() == 0


def test_pf_c1_client_killed_mid_stream_aborts_within_1s_and_stores_partial(live, make_user, settings):
    """PF-C1 (streaming): kill the client 1 s into a long generation; the engine's unfinished
    count returns to its baseline within 1 s and the turn is stored cancelled with its partial
    text. (Grace period 0, as the case asks.)"""
    settings.CHAT_MAX_TOKENS = 400
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 0
    make_user("bob")
    client = live.login("bob")
    baseline = live.unfinished()
    _, events_url = send(client, "Write a very long story about a dragon and a knight.")
    parts = urlsplit(live.url)
    sock = socket.create_connection((parts.hostname, parts.port))
    cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
    sock.sendall(
        f"GET {events_url} HTTP/1.1\r\nHost: {parts.netloc}\r\nCookie: {cookie}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    received = b""
    deadline = time.monotonic() + 1.0
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            received += sock.recv(65536)
        except TimeoutError:
            pass
    assert b"event: token" in received
    assert live.unfinished() == baseline + 1

    sock.close()
    closed_at = time.monotonic()
    while live.unfinished() > baseline and time.monotonic() - closed_at < 1.0:
        time.sleep(0.02)

    assert live.unfinished() == baseline
    live.drain()
    stored = answer_turn(events_url)
    assert stored.status == Turn.Status.CANCELLED
    assert stored.content  # the partial text is kept
    assert 0 < stored.token_count < 400
