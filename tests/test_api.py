"""The /v1 API with the scripted engine double: shapes, auth, pagination, bad input."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from accounts import services as account_services
from conversations import services, turnstream
from conversations.models import Conversation, Turn
from tests.test_views import parse_sse, read_stream, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class BearerClient(AsyncClient):
    """An async test client that sends ``Authorization: Bearer <key>`` on every request
    (AsyncClient's own ``headers=`` defaults are sent under WSGI names, so not used)."""

    def __init__(self, key: str):
        super().__init__()
        self.key = key

    def generic(self, method, path, data="", content_type="application/octet-stream", secure=False, *, headers=None, **extra):
        headers = {"Authorization": f"Bearer {self.key}", **(headers or {})}
        return super().generic(method, path, data, content_type, secure, headers=headers, **extra)


async def api_client(make_user, username="api-user", **fields) -> tuple[AsyncClient, object]:
    user = await sync_to_async(make_user)(username, **fields)
    issued = await sync_to_async(account_services.api_key_create)(user=user, name="tests")
    return BearerClient(issued.raw), user


async def post_json(client, url, body, **headers):
    return await client.post(url, json.dumps(body), content_type="application/json", headers=headers)


async def new_conversation(client, **body) -> str:
    response = await post_json(client, "/v1/conversations", body)
    assert response.status_code == 201, response.content
    return response.json()["conversation_id"]


def assert_error(response, status: int, type_: str):
    assert response.status_code == status, response.content
    body = response.json()
    assert body["error"]["type"] == type_
    assert body["error"]["message"]


# --- auth -------------------------------------------------------------------------------------


async def test_missing_wrong_and_revoked_keys_get_401_json(make_user):
    anonymous = AsyncClient()
    assert_error(await anonymous.get("/v1/conversations"), 401, "authentication")
    wrong = BearerClient("sk-abc.def")
    assert_error(await wrong.get("/v1/conversations"), 401, "authentication")

    user = await sync_to_async(make_user)("revoked")
    issued = await sync_to_async(account_services.api_key_create)(user=user, name="k")
    client = BearerClient(issued.raw)
    assert (await client.get("/v1/conversations")).status_code == 200
    await sync_to_async(account_services.api_key_revoke)(api_key=issued.api_key)
    response = await client.get("/v1/conversations")
    assert_error(response, 401, "authentication")
    assert response["WWW-Authenticate"].startswith("Bearer")


async def test_session_cookie_does_not_authenticate_the_api(make_user):
    user = await sync_to_async(make_user)("browser-only")
    client = AsyncClient()
    await client.aforce_login(user)
    assert_error(await client.get("/v1/conversations"), 401, "authentication")


# --- conversations ----------------------------------------------------------------------------


async def test_create_conversation_returns_201_with_id_and_region(make_user):
    client, user = await api_client(make_user, region="us-east")
    response = await post_json(client, "/v1/conversations", {"system_prompt": "Answer in French."})
    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"conversation_id", "region", "project_id"}
    assert body["project_id"] is None  # not in a project
    assert body["region"] == "us-east"
    conversation = await Conversation.objects.aget(pk=body["conversation_id"])
    assert conversation.system_prompt == "Answer in French."
    assert conversation.owner_id == user.pk


@pytest.mark.parametrize(
    ("body", "content_type", "status", "type_"),
    [
        ("{not json", "application/json", 400, "invalid_request"),
        ('["a list"]', "application/json", 400, "invalid_request"),
        ('{"unknown": 1}', "application/json", 400, "invalid_request"),
        # An unknown model: OpenAI's status and type for it (openai.NotFoundError in its SDK).
        ('{"model": "gpt-17"}', "application/json", 404, "model_not_found"),
        ('{"system_prompt": 5}', "application/json", 400, "invalid_request"),
        ("model=x", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
    ],
)
async def test_bad_conversation_bodies_get_4xx_and_store_nothing(make_user, body, content_type, status, type_):
    client, _ = await api_client(make_user)
    response = await client.post("/v1/conversations", body, content_type=content_type)
    assert_error(response, status, type_)
    assert not await Conversation.objects.aexists()


async def test_oversize_body_gets_413(make_user, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    client, _ = await api_client(make_user)
    response = await post_json(client, "/v1/conversations", {"system_prompt": "x" * 2000})
    assert_error(response, 413, "payload_too_large")


async def test_list_is_keyset_paginated_and_only_the_callers(make_user):
    client, user = await api_client(make_user)
    other = await sync_to_async(make_user)("someone-else")
    await sync_to_async(services.conversation_create)(owner=other)
    ids = [await new_conversation(client) for _ in range(5)]
    seen, cursor = [], None
    while True:
        url = "/v1/conversations?limit=2" + (f"&before={cursor}" if cursor else "")
        body = (await client.get(url)).json()
        seen += [c["conversation_id"] for c in body["conversations"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))


async def test_history_pages_are_stable_under_concurrent_appends(make_user):
    client, user = await api_client(make_user)
    conversation_id = await new_conversation(client)
    conversation = await Conversation.objects.aget(pk=conversation_id)
    for i in range(5):
        await sync_to_async(services.turn_append_user)(conversation=conversation, content=f"m{i}")
    first = (await client.get(f"/v1/conversations/{conversation_id}?limit=2")).json()
    assert [t["content"] for t in first["turns"]] == ["m3", "m4"]
    # Someone appends while we page backwards: the next page is unaffected.
    await sync_to_async(services.turn_append_user)(conversation=conversation, content="new")
    second = (await client.get(f"/v1/conversations/{conversation_id}?limit=2&before={first['next_cursor']}")).json()
    assert [t["content"] for t in second["turns"]] == ["m1", "m2"]
    third = (await client.get(f"/v1/conversations/{conversation_id}?limit=2&before={second['next_cursor']}")).json()
    assert [t["content"] for t in third["turns"]] == ["m0"]
    assert third["next_cursor"] is None


@pytest.mark.parametrize("query", ["limit=0", "limit=101", "limit=abc", "before=tampered", "before=" + "x" * 40])
async def test_bad_paging_parameters_get_400(make_user, query):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    assert_error(await client.get(f"/v1/conversations/{conversation_id}?{query}"), 400, "invalid_request")


async def test_a_cursor_from_another_listing_is_refused(make_user):
    client, _ = await api_client(make_user)
    for _ in range(2):
        conversation_id = await new_conversation(client)
    cursor = (await client.get("/v1/conversations?limit=1")).json()["next_cursor"]
    assert cursor
    response = await client.get(f"/v1/conversations/{conversation_id}?before={cursor}")
    assert_error(response, 400, "invalid_request")


async def test_other_users_conversation_is_404_everywhere(make_user):
    owner, _ = await api_client(make_user, "owner")
    conversation_id = await new_conversation(owner)
    intruder, _ = await api_client(make_user, "intruder")
    base = f"/v1/conversations/{conversation_id}"
    assert_error(await intruder.get(base), 404, "not_found")
    assert_error(await intruder.delete(base), 404, "not_found")
    assert_error(await post_json(intruder, f"{base}/turns", {"role": "user", "content": "hi"}), 404, "not_found")
    assert_error(await intruder.post(f"{base}/cancel"), 404, "not_found")
    assert_error(await intruder.get(f"{base}/turns/{uuid.uuid4()}/events"), 404, "not_found")
    assert not await Turn.objects.aexists()


async def test_delete_removes_conversation_and_turns(make_user, engine_double):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "hi"})
    await read_stream(response)
    assert (await client.delete(f"/v1/conversations/{conversation_id}")).status_code == 204
    assert not await Conversation.objects.aexists()
    assert not await Turn.objects.aexists()
    assert_error(await client.get(f"/v1/conversations/{conversation_id}"), 404, "not_found")


async def test_wrong_method_gets_405_json(make_user):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await client.get(f"/v1/conversations/{conversation_id}/turns")
    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"] == "POST"


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


async def test_text_completion_accepts_token_id_prompts_as_is(make_user, engine_double):
    """/v1/completions (used by gateways without an engine): a token-id prompt reaches the
    engine unchanged, no chat template; usage is reported."""
    engine_double.scripts = [["Hi", " there"]]
    client, _ = await api_client(make_user)
    response = await post_json(
        client, "/v1/completions",
        {"model": "SmolLM2-135M-Instruct", "prompt": [5, 6, 7], "max_tokens": 20, "temperature": 0},
    )  # fmt: skip
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "Hi there"
    assert body["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }  # fmt: skip
    assert engine_double.requests[0][0] == [5, 6, 7]
    assert engine_double.requests[0][1].max_tokens == 20


async def test_text_completion_streams_chunks_then_usage_then_done(make_user, engine_double):
    engine_double.scripts = [["a", "b"]]
    client, _ = await api_client(make_user)
    response = await post_json(
        client, "/v1/completions",
        {"model": "SmolLM2-135M-Instruct", "prompt": "Once", "stream": True, "stream_options": {"include_usage": True}},
    )  # fmt: skip
    raw = (await read_stream(response)).decode()
    datas = [line[6:] for line in raw.split("\n") if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "ab"
    assert chunks[-1]["usage"]["completion_tokens"] == 2


async def test_text_completion_rejects_unknown_model_and_bad_prompts(make_user, engine_double):
    client, _ = await api_client(make_user)
    assert_error(await post_json(client, "/v1/completions", {"model": "x", "prompt": "hi"}), 404, "model_not_found")
    assert_error(await post_json(client, "/v1/completions", {"model": "SmolLM2-135M-Instruct", "prompt": [-1]}), 400, "invalid_request")
    assert_error(await post_json(client, "/v1/completions", {"model": "SmolLM2-135M-Instruct", "prompt": []}), 400, "invalid_request")
    assert engine_double.requests == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/v1/conversations/not-a-uuid"),
        ("delete", "/v1/conversations/xyz"),
        ("post", "/v1/conversations/xyz/cancel"),
        ("get", "/v1/conversations/{c}/turns/xyz/events"),
        ("post", "/v1/conversations/{c}/turns/xyz/regenerate"),
        ("get", "/v1/nope"),
    ],
)
async def test_malformed_ids_and_unknown_v1_paths_get_a_json_404(make_user, method, path):
    """A /v1 URL that matches no route (an id that is not a UUID, an unknown endpoint) gets the
    JSON error shape, not Django's HTML page."""
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await getattr(client, method)(path.format(c=conversation_id))
    assert response["Content-Type"] == "application/json"
    assert_error(response, 404, "not_found")


async def test_a_page_outside_v1_keeps_djangos_404_page(make_user):
    response = await AsyncClient().get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("prompt", [[999_999_999], [5, 49152]])
async def test_out_of_vocabulary_token_ids_get_400_not_500(make_user, engine_double, prompt):
    """/v1/completions with token ids the model does not know: a 400 the caller can act on;
    the engine is never asked."""
    client, _ = await api_client(make_user)
    response = await post_json(
        client, "/v1/completions", {"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": 2}
    )
    assert_error(response, 400, "invalid_request")
    assert "vocabulary" in response.json()["error"]["message"]
    assert engine_double.requests == []


@pytest.mark.parametrize("max_tokens", [1, 5, 15])
async def test_chat_completions_honour_a_small_max_tokens(make_user, engine_double, max_tokens):
    """max_tokens below the prompt-shrinking floor (16) is the caller's choice, not a context
    overflow: 200, and the engine is asked for exactly that many."""
    client, _ = await api_client(make_user)
    body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    response = await post_json(client, "/v1/chat/completions", body)
    assert response.status_code == 200, response.content
    assert engine_double.requests[0][1].max_tokens == max_tokens


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


# --- the turn tree (issue 18, part 5) -----------------------------------------------------------


def answer_stored(conversation, question, content):
    return services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content=content, status="complete", prompt_tokens=3, completion_tokens=2,
    )  # fmt: skip


def branched_conversation(user, title="Branches"):
    """A conversation with a branch, built through the services (no engine): q1/a1 -> q2/a2,
    then an edit of q1 (q1'/a1') that is the branch shown. Returns (conversation, turns by
    name: q1, a1, q2, a2, q1e, a1e)."""
    conversation = services.conversation_create(owner=user, title=title)
    q1 = services.turn_append_user(conversation=conversation, content="first question")
    a1 = answer_stored(conversation, q1, "first answer")
    q2 = services.turn_append_user(conversation=conversation, content="second question", parent_id=q1.turn_id)
    a2 = answer_stored(conversation, q2, "second answer")
    q1e = services.turn_append_user(conversation=conversation, content="first question, edited", replaces=q1)
    a1e = answer_stored(conversation, q1e, "answer to the edit")
    conversation.refresh_from_db()
    return conversation, {"q1": q1, "a1": a1, "q2": q2, "a2": a2, "q1e": q1e, "a1e": a1e}


async def test_path_selected_returns_only_the_branch_shown(make_user):
    """Given a branched conversation showing the edit, when GET ?path=selected, then only the
    edit and its answer come back (path "selected", one page); ?path=all (the default) has all
    six turns, each user turn with its parent; after selecting the old branch, ?path=selected
    gives q1, a1, q2, a2."""
    client, user = await api_client(make_user)
    conversation, t = await sync_to_async(branched_conversation)(user)
    url = f"/v1/conversations/{conversation.pk}"

    selected = (await client.get(url, {"path": "selected"})).json()
    everything = (await client.get(url)).json()
    await sync_to_async(services.branch_select)(conversation=conversation, question=t["q1"], parent_id=None)
    old_branch = (await client.get(url, {"path": "selected"})).json()

    assert selected["path"] == "selected" and selected["next_cursor"] is None
    assert [x["turn_id"] for x in selected["turns"]] == [str(t["q1e"].turn_id), str(t["a1e"].turn_id)]
    assert everything["path"] == "all" and len(everything["turns"]) == 6
    by_id = {x["turn_id"]: x for x in everything["turns"]}
    assert by_id[str(t["q2"].turn_id)]["parent"] == str(t["q1"].turn_id)
    assert by_id[str(t["q1e"].turn_id)]["parent"] is None
    assert [x["content"] for x in old_branch["turns"]] == [
        "first question", "first answer", "second question", "second answer",
    ]  # fmt: skip


@pytest.mark.parametrize("query", ["path=newest", "path=", "path=selected&before=x", "path=selected&limit=5"])
async def test_bad_path_values_get_400_with_a_message(make_user, query):
    client, user = await api_client(make_user)
    conversation, _ = await sync_to_async(branched_conversation)(user)

    response = await client.get(f"/v1/conversations/{conversation.pk}?{query}")

    assert_error(response, 400, "invalid_request")
    assert "path" in response.json()["error"]["message"]


def test_the_openapi_document_describes_the_path_parameter():
    """The getConversation operation documents ?path= (all | selected) and the Turn schema
    its parent, so clients can rebuild the tree."""
    from api.openapi import build_document

    document = build_document()
    operation = document["paths"]["/v1/conversations/{conversation_id}"]["get"]
    [path] = [p for p in operation["parameters"] if p["name"] == "path"]
    assert path["in"] == "query" and path["schema"]["enum"] == ["all", "selected"]
    assert "selected" in path["description"]
    assert "parent" in document["components"]["schemas"]["Turn"]["properties"]
    assert document["components"]["schemas"]["ConversationHistory"]["properties"]["path"]["enum"] == ["all", "selected"]
