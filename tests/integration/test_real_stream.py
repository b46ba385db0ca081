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


def test_pf_s1_multi_token_stop_string_never_leaks(live, make_user, settings):
    """PF-S1: a configured stop string the model emits as several tokens ends the answer; the
    joined stream equals the stored text and holds no prefix of the stop string."""
    settings.CHAT_TEMPERATURE = 0.0
    settings.CHAT_MAX_TOKENS = 120
    make_user("dora")
    client = live.login("dora")
    prompt = "List five fruits and describe the taste of each in one sentence."
    _, url = send(client, prompt)
    full = "".join(d["text"] for n, d, _ in read_events(client, url) if n == "token")
    words = full.split()
    assert len(words) > 12, full
    # A three-word phrase from the middle: several tokens, starting with a letter.
    stop = " ".join(words[6:9]).strip(" ,.;:!?*-")
    cut = full.find(stop)
    assert stop and cut > 0 and live.engine.count_tokens(stop) >= 2

    settings.CHAT_STOP = (stop,)
    _, url = send(client, prompt)  # a new conversation: the same greedy prompt
    events = read_events(client, url)

    tokens = [d["text"] for n, d, _ in events if n == "token"]
    streamed = "".join(tokens)
    assert all(tokens), "no empty token events"
    assert streamed == answer_turn(url).content
    assert stop not in streamed
    assert not any(streamed.endswith(stop[:k]) for k in range(2, len(stop) + 1))
    assert streamed == full[:cut]


def test_pf_s2_split_multibyte_characters_decode_whole(live):
    """PF-S2 (engine half): emoji and CJK that the byte-level tokenizer splits across tokens come
    out of the engine as whole characters: no U+FFFD in any delta, the joined text exact.
    Structured output forces the model to write exactly this text."""
    from inference.engine import GenerationOptions

    target = "你好，世界 🙂🎉 café naïve 😀"
    options = GenerationOptions(
        max_tokens=80, temperature=0.0, json_schema={"type": "string", "enum": [target]}
    )
    prompt = live.engine.encode_chat([{"role": "user", "content": "Greet me in Chinese."}])

    async def collect():
        return [d async for d in live.engine.generate(prompt, options, "pf-s2-probe")]

    deltas = live.call(collect(), timeout=120)
    texts = [d.text for d in deltas]
    assert all("\ufffd" not in t for t in texts)
    assert "".join(texts) == json.dumps(target, ensure_ascii=False)
    # The tokenizer really split characters: more tokens than text-bearing deltas.
    assert deltas[-1].completion_tokens > len([t for t in texts if t])


def test_pf_c3_stop_before_first_token_and_next_turn_starts_at_once(live, make_user):
    """PF-C3: Stop right after sending (before any token) aborts in the engine within 1 s;
    the next message in the same conversation is answered at once."""
    make_user("erin")
    client = live.login("erin")
    baseline = live.unfinished()
    conversation_id, url = send(client, "Tell me about the history of Rome in detail.")
    started = time.monotonic()
    response = client.post(url.replace("/events", "/stop"))
    assert response.status_code == 204
    while live.unfinished() > baseline and time.monotonic() - started < 1.0:
        time.sleep(0.02)
    assert live.unfinished() == baseline
    stored = answer_turn(url)
    assert stored.status == Turn.Status.CANCELLED

    _, next_url = send(client, "Just say hi.", conversation_id)
    events = read_events(client, next_url)
    assert events[-1][0] == "done" and events[-1][1]["status"] == "complete"
    assert any(n == "token" for n, _, _ in events)


def test_pf_c3_stop_mid_stream_frees_the_engine_within_1s(live, make_user, settings):
    """PF-C3: Stop while tokens are streaming; the engine holds no request within 1 s and the
    partial answer is stored as cancelled, equal to what was streamed up to the stop."""
    settings.CHAT_MAX_TOKENS = 400
    make_user("finn")
    client = live.login("finn")
    baseline = live.unfinished()
    _, url = send(client, "Write a long poem about mountains.")
    seen = []
    with client.stream("GET", url) as response:
        lines = response.iter_lines()
        for line in lines:
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
            if len(seen) == 5:
                break
        started = time.monotonic()
        assert client.post(url.replace("/events", "/stop")).status_code == 204
        for line in lines:  # the rest of the stream, up to `done`
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
    while live.unfinished() > baseline and time.monotonic() - started < 1.0:
        time.sleep(0.02)
    assert live.unfinished() == baseline
    assert seen[-1]["status"] == "cancelled"
    stored = answer_turn(url)
    assert stored.status == Turn.Status.CANCELLED
    assert stored.content == "".join(d.get("text", "") for d in seen[:-1])
