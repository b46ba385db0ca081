"""/v1 turns with the scripted engine double: the stream's shape, max_tokens, bad bodies and
values of the wrong JSON type, one turn at a time per conversation, cancel, resume with
Last-Event-ID, idempotency keys and the expiry of the turn's keys in Redis."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from conversations import turnstream
from conversations.models import Conversation, Turn
from tests.api_support import api_client, assert_error, new_conversation, post_json
from tests.chat_support import parse_sse, read_stream, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


# --- turns --------------------------------------------------------------------------------------


async def test_turn_streams_tokens_then_done_in_the_design_shape(make_user, engine_double):
    engine_double.scripts = [["Hel", "lo", "!"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await post_json(
        client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "hi", "max_tokens": 50}
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/event-stream")
    events = parse_sse(await read_stream(response))
    assert [(n, d) for n, d, _ in events[:-1]] == [("token", {"text": "Hel"}), ("token", {"text": "lo"}), ("token", {"text": "!"})]
    name, done, _ = events[-1]
    assert name == "done"
    assert done["turn_id"] == response["X-Turn-Id"]
    assert done["usage"]["completion_tokens"] == 3
    assert all(eid is not None for _, _, eid in events)
    assert engine_double.requests[0][1].max_tokens == 50
    history = (await client.get(f"/v1/conversations/{conversation_id}")).json()
    assert [(t["role"], t["content"]) for t in history["turns"]] == [("user", "hi"), ("assistant", "Hello!")]


async def test_max_tokens_is_capped_at_the_tier_ceiling(make_user, engine_double, settings):
    settings.CHAT_MAX_TOKENS_CEILING_BY_TIER = {"free": 64, "paid": 128}
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await post_json(
        client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "hi", "max_tokens": 1500}
    )
    await read_stream(response)
    assert engine_double.requests[0][1].max_tokens == 64


async def test_max_tokens_beyond_the_pools_context_is_a_400_naming_it(make_user, engine_double):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await post_json(
        client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "hi", "max_tokens": 5000}
    )
    assert_error(response, 400, "context_length_exceeded")
    assert "2,048" in response.json()["error"]["message"]  # the mini pool's context
    assert engine_double.requests == []


@pytest.mark.parametrize(
    "body",
    [
        {"role": "assistant", "content": "hi"},
        {"role": "user"},
        {"role": "user", "content": "   "},
        {"role": "user", "content": "hi", "max_tokens": 0},
        {"role": "user", "content": "hi", "extra": True},
    ],
)
async def test_bad_turn_bodies_get_400_and_store_nothing(make_user, engine_double, body):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", body)
    assert_error(response, 400, "invalid_request")
    assert not await Turn.objects.aexists()
    assert engine_double.requests == []


async def test_second_turn_while_streaming_gets_409_json(make_user, engine_double):
    """PF-P1: one generating turn per conversation; the other POST gets a readable 409."""
    engine_double.scripts = [["slow", 30.0, "tail"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    first = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "one"})
    assert first.status_code == 200
    second = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "two"})
    assert_error(second, 409, "conflict")
    assert await Turn.objects.filter(role="user").acount() == 1
    assert (await client.post(f"/v1/conversations/{conversation_id}/cancel")).status_code == 204
    third = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "three"})
    assert third.status_code == 200
    await read_stream(third)


async def test_the_next_turn_is_accepted_the_moment_done_arrives(make_user, engine_double, monkeypatch):
    """PF-P1's "a third message later works", at the earliest moment: the conversation is free
    when `done` reaches the client, even while the turn's event log is still being written to
    Redis (slowed down here), so the next POST gets 200, not 409."""
    from conversations import turnlog

    slow_mirror = turnlog.TurnLogWriter._mirror

    async def mirror_slowly(self, fn):
        await asyncio.sleep(0.2)
        await slow_mirror(self, fn)

    monkeypatch.setattr(turnlog.TurnLogWriter, "_mirror", mirror_slowly)
    engine_double.scripts = [["a", "b", "c", "d"], ["next"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    first = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "one"})
    events = parse_sse(await read_stream(first))
    assert events[-1][0] == "done"
    second = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "two"})
    assert second.status_code == 200, second.content
    assert parse_sse(await read_stream(second))[-1][0] == "done"


async def test_cancel_aborts_at_once_and_a_second_cancel_is_a_no_op(make_user, engine_double):
    engine_double.scripts = [["partial", 30.0, "never"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "go"})
    reader = asyncio.ensure_future(read_stream(response))
    await wait_for(lambda: engine_double.unfinished)
    await asyncio.sleep(0.05)
    assert (await client.post(f"/v1/conversations/{conversation_id}/cancel")).status_code == 204
    assert engine_double.requests[0][2] in engine_double.aborted
    events = parse_sse(await asyncio.wait_for(reader, 5))
    assert events[-1][1]["status"] == "cancelled"
    assert (await client.post(f"/v1/conversations/{conversation_id}/cancel")).status_code == 204
    answer = await Turn.objects.aget(role="assistant")
    assert (answer.status, answer.content) == ("cancelled", "partial")


async def test_resume_with_last_event_id_replays_exactly_the_rest(make_user, engine_double, settings):
    """PF-S4 (one process): events k+1.. arrive once, in order, each with an id."""
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 5
    engine_double.scripts = [["a", "b", 0.2, "c", "d"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "go"})
    turn_id = response["X-Turn-Id"]
    reader = asyncio.ensure_future(read_stream(response))
    stream = turnstream.stream_for_answer(uuid.UUID(turn_id))
    await wait_for(lambda: len(stream.events) >= 2)
    reader.cancel()  # the connection drops after event 2
    resumed = await client.get(
        f"/v1/conversations/{conversation_id}/turns/{turn_id}/events", headers={"Last-Event-ID": "2"}
    )
    events = parse_sse(await read_stream(resumed))
    assert [eid for _, _, eid in events] == [3, 4, 5]
    assert [d.get("text") for n, d, _ in events if n == "token"] == ["c", "d"]
    assert events[-1][0] == "done"
    assert engine_double.aborted == {}


async def test_nul_characters_are_refused_not_a_500(make_user):
    """Found by schemathesis: a NUL in a text field made PostgreSQL fail the insert."""
    client, _ = await api_client(make_user)
    response = await post_json(client, "/v1/conversations", {"system_prompt": "a\x00b"})
    assert_error(response, 400, "invalid_request")
    assert not await Conversation.objects.aexists()


async def test_pf_p1_two_posts_at_the_same_moment_one_streams_one_409(make_user, engine_double):
    """PF-P1: two POSTs to one conversation at the same moment: one streams, the other gets a
    clear 409; no interleaved turns; a third message later works."""
    engine_double.scripts = [["one", 0.2, " answer"], ["third"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    url = f"/v1/conversations/{conversation_id}/turns"
    first, second = await asyncio.gather(
        post_json(client, url, {"role": "user", "content": "A"}),
        post_json(client, url, {"role": "user", "content": "B"}),
    )
    statuses = sorted([first.status_code, second.status_code])
    assert statuses == [200, 409]
    winner = first if first.status_code == 200 else second
    await read_stream(winner)
    assert await Turn.objects.filter(role="user").acount() == 1
    third = await post_json(client, url, {"role": "user", "content": "C"})
    assert third.status_code == 200
    await read_stream(third)
    roles = [t.role async for t in Turn.objects.filter(conversation_id=conversation_id).order_by("created_at")]
    assert roles == ["user", "assistant", "user", "assistant"]


async def test_idempotency_key_retry_returns_the_same_turn_without_a_second_generation(make_user, engine_double):
    engine_double.scripts = [["only", " once"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    url = f"/v1/conversations/{conversation_id}/turns"
    body = {"role": "user", "content": "hello"}
    first = await post_json(client, url, body, **{"Idempotency-Key": "retry-1"})
    first_events = parse_sse(await read_stream(first))
    retry = await post_json(client, url, body, **{"Idempotency-Key": "retry-1"})
    assert retry.status_code == 200
    assert retry["X-Turn-Id"] == first["X-Turn-Id"]
    retry_events = parse_sse(await read_stream(retry))
    assert retry_events[-1][1]["turn_id"] == first_events[-1][1]["turn_id"]
    assert len(engine_double.requests) == 1
    assert await Turn.objects.filter(role="user").acount() == 1
    assert await Turn.objects.filter(role="assistant").acount() == 1


async def test_idempotency_key_reused_for_another_request_is_refused(make_user, engine_double):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    url = f"/v1/conversations/{conversation_id}/turns"
    await read_stream(await post_json(client, url, {"role": "user", "content": "one"}, **{"Idempotency-Key": "k"}))
    other = await post_json(client, url, {"role": "user", "content": "two"}, **{"Idempotency-Key": "k"})
    assert_error(other, 422, "idempotency_key_reused")
    assert await Turn.objects.filter(role="user").acount() == 1


async def test_idempotency_keys_are_per_user(make_user, engine_double):
    a, _ = await api_client(make_user, "a")
    b, _ = await api_client(make_user, "b")
    for client in (a, b):
        conversation_id = await new_conversation(client)
        response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "x"}, **{"Idempotency-Key": "same"})
        assert response.status_code == 200
        await read_stream(response)
    assert len(engine_double.requests) == 2


async def test_concurrent_retries_share_one_generation(make_user, engine_double):
    engine_double.scripts = [["slow", 0.3, " answer"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    url = f"/v1/conversations/{conversation_id}/turns"
    body = {"role": "user", "content": "double click"}
    r1, r2 = await asyncio.gather(
        post_json(client, url, body, **{"Idempotency-Key": "dbl"}),
        post_json(client, url, body, **{"Idempotency-Key": "dbl"}),
    )
    assert r1.status_code == r2.status_code == 200
    assert r1["X-Turn-Id"] == r2["X-Turn-Id"]
    await read_stream(r1)
    await read_stream(r2)
    assert len(engine_double.requests) == 1
    assert await Turn.objects.filter(role="user").acount() == 1


async def test_turn_event_logs_and_idempotency_keys_expire(make_user, engine_double, settings):
    """Redis never grows without bound: every per-turn key and idempotency record has a TTL."""
    import redis.asyncio as aioredis

    settings.CHAT_STREAM_TTL_S = 120
    settings.CHAT_IDEMPOTENCY_TTL_S = 300
    client, user = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await post_json(
        client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "hi"},
        **{"Idempotency-Key": "ttl-check"},
    )  # fmt: skip
    await read_stream(response)
    answer_id = response["X-Turn-Id"]
    question_id = response["X-User-Turn-Id"]
    r = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        for key in (f"chat:turn:{answer_id}", f"chat:a:{answer_id}:conversation", f"chat:q:{question_id}"):
            assert 0 < await r.ttl(key) <= 120, key
        idem_keys = [k async for k in r.scan_iter(f"chat:idem:{user.pk}:*")]
        assert len(idem_keys) == 1
        assert 0 < await r.ttl(idem_keys[0]) <= 300
        assert not await r.exists(f"chat:conv:{conversation_id}:generating")  # released
    finally:
        await r.aclose()


@pytest.mark.parametrize(
    ("url", "body"),
    [
        ("turns", {"role": "user", "content": "hi", "max_tokens": "5"}),
        ("turns", {"role": "user", "content": "hi", "max_tokens": True}),
        ("chat", {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}),
        ("chat", {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"}),
    ],
)
async def test_values_of_the_wrong_json_type_are_refused_not_coerced(make_user, engine_double, url, body):
    """"5" or true for an integer and "yes" for a boolean get a 400 naming the field; nothing is
    stored and the engine is not asked."""
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    path = f"/v1/conversations/{conversation_id}/turns" if url == "turns" else "/v1/chat/completions"
    response = await post_json(client, path, body)
    assert_error(response, 400, "invalid_request")
    assert not await Turn.objects.aexists()
    assert engine_double.requests == []
