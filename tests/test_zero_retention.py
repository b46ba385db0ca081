"""Zero-retention organisations (issue 4, Retention): answers are given, no turn is stored in
PostgreSQL, and every transient copy in Redis expires within ``CHAT_ZDR_TTL_S`` (<= 600 s)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from asgiref.sync import sync_to_async

from accounts.models import Membership, Organisation
from conversations import services, turnstream
from conversations.models import Conversation, Turn
from tests.api_support import api_client, new_conversation, post_json
from tests.chat_support import events_url_of, parse_sse, post_message, read_stream, signed_in
from tests.test_writeback import plain_redis

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "my account number is 12345678"


def zero_retention_org(**fields) -> Organisation:
    return Organisation.objects.create(
        name="ZDR Corp", slug=f"zdr-{uuid.uuid4().hex[:8]}", zero_retention=True, **fields
    )


async def make_zero_retention(conversation_id: str) -> None:
    org = await sync_to_async(zero_retention_org)()
    conversation = await Conversation.objects.aget(pk=conversation_id)
    # The owner is a member: an organisation's conversation is reachable only by its members.
    await Membership.objects.acreate(organisation=org, user_id=conversation.owner_id)
    conversation.org = org
    await conversation.asave(update_fields=["org"])


async def zdr_turn(client, conversation_id: str, content: str = SECRET) -> tuple[str, list]:
    """Post one turn, read its whole stream, wait until the turn has ended (event log flushed);
    return (answer id, events)."""
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": content})
    assert response.status_code == 200, response.content
    answer_id = response["X-Turn-Id"]
    events = parse_sse(await read_stream(response))
    stream = turnstream.stream_for_answer(uuid.UUID(answer_id))
    if stream is not None:
        await stream.wait()
    return answer_id, events


def redis_copies(*needles: str) -> dict[str, int]:
    """Every Redis key whose name or value mentions one of ``needles`` -> its TTL in seconds
    (-1: no expiry)."""
    client = plain_redis()
    found = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == "string":
            value = client.get(key) or ""
        elif kind == "stream":
            value = repr(client.xrange(key))
        elif kind == "list":
            value = repr(client.lrange(key, 0, -1))
        elif kind == "set":
            value = repr(client.smembers(key))
        elif kind == "hash":
            value = repr(client.hgetall(key))
        elif kind == "zset":
            value = repr(client.zrange(key, 0, -1))
        else:
            value = ""
        if any(n in key or n in value for n in needles):
            found[key] = client.ttl(key)
    return found


async def test_a_zero_retention_turn_is_answered_and_nothing_reaches_postgresql(make_user, engine_double):
    """Given a conversation of a zero-retention org, when a turn is asked, then the answer
    streams to the end, and PostgreSQL holds no turn of it (neither user nor assistant) and no
    title taken from the message."""
    engine_double.scripts = [["Noted", "."]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    await make_zero_retention(conversation_id)
    _, events = await zdr_turn(client, conversation_id)
    assert [d["text"] for n, d, _ in events if n == "token"] == ["Noted", "."]
    assert events[-1][0] == "done" and events[-1][1]["status"] == "complete"
    assert not await Turn.objects.filter(conversation_id=conversation_id).aexists()
    assert (await Conversation.objects.aget(pk=conversation_id)).title == ""


async def test_zero_retention_copies_in_redis_expire_within_ten_minutes(make_user, engine_double):
    """Given a finished zero-retention turn, every Redis key that names it or holds its text has
    a TTL <= 600 s (none without expiry), its event log is about to go (<= the linger), and the
    broker holds no message for it."""
    question, answer = f"question {uuid.uuid4().hex}", f"answer {uuid.uuid4().hex}"
    engine_double.scripts = [answer.split(" ", 1)]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    await make_zero_retention(conversation_id)
    answer_id, _ = await zdr_turn(client, conversation_id, question)
    copies = redis_copies(conversation_id, answer_id, question, answer.split(" ", 1)[1])
    assert copies, "the history for the next turn should be in Redis"
    assert {key: ttl for key, ttl in copies.items() if not 0 < ttl <= 600} == {}
    assert 0 < copies[f"chat:turn:{answer_id}"] <= 5  # the turn's event log: gone in seconds
    assert plain_redis().llen("celery") == 0


async def test_the_next_zero_retention_turn_sees_the_history_from_redis(make_user, engine_double):
    """Given a zero-retention conversation with one answered turn, when the next turn is asked
    and the history is read, both come from Redis (PostgreSQL has nothing)."""
    engine_double.scripts = [["Paris", "."], ["Yes", "."]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    await make_zero_retention(conversation_id)
    await zdr_turn(client, conversation_id, "capital of france")
    await zdr_turn(client, conversation_id, "are you sure")
    first_prompt, second_prompt = engine_double.requests[0][0], engine_double.requests[1][0]
    assert len(second_prompt) == len(first_prompt) + (3 + 1) + (3 + 3)  # + the first exchange
    page = (await client.get(f"/v1/conversations/{conversation_id}")).json()
    assert [(t["role"], t["content"]) for t in page["turns"]] == [
        ("user", "capital of france"), ("assistant", "Paris."),
        ("user", "are you sure"), ("assistant", "Yes."),
    ]  # fmt: skip
    assert not await Turn.objects.filter(conversation_id=conversation_id).aexists()


async def test_after_the_ttl_the_zero_retention_history_is_gone(make_user, engine_double, settings):
    """Given CHAT_ZDR_TTL_S = 1, one second after a turn its history is gone: the page is empty
    and the next turn's prompt has only the new question."""
    settings.CHAT_ZDR_TTL_S = 1
    engine_double.scripts = [["Paris", "."], ["Yes", "."]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    await make_zero_retention(conversation_id)
    await zdr_turn(client, conversation_id, "capital of france")
    await asyncio.sleep(2.1)
    assert (await client.get(f"/v1/conversations/{conversation_id}")).json()["turns"] == []
    await zdr_turn(client, conversation_id, "capital of france")
    assert engine_double.requests[1][0] == engine_double.requests[0][0]


async def test_a_zero_retention_turn_streams_on_the_chat_page(make_user, engine_double):
    """The chat page's event stream finds a zero-retention question (it is only in Redis)."""
    engine_double.scripts = [["Hi", "!"]]
    client, user = await signed_in(make_user)
    conversation = await sync_to_async(services.conversation_create)(owner=user)
    await make_zero_retention(str(conversation.pk))
    response = await post_message(client, SECRET, conversation.pk)
    assert response.status_code == 200
    events = parse_sse(await read_stream(await client.get(events_url_of(response))))
    assert events[-1][0] == "done"
    assert [d["text"] for n, d, _ in events if n == "token"] == ["Hi", "!"]
    assert not await Turn.objects.filter(conversation_id=conversation.pk).aexists()


def test_an_answer_written_back_for_a_zero_retention_conversation_is_not_stored(make_user):
    """Defence in depth: even if a write-back reaches the service for a zero-retention
    conversation (e.g. the org turned it on mid-turn), no row is written."""
    conversation = services.conversation_create(owner=make_user())
    question = services.turn_append_user(conversation=conversation, content="before")
    Conversation.objects.filter(pk=conversation.pk).update(org=zero_retention_org())
    answer = services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content="after", status="complete", prompt_tokens=1, completion_tokens=1,
    )  # fmt: skip
    assert answer.content == "after"
    assert list(Turn.objects.values_list("content", flat=True)) == ["before"]
