"""Per-region Redis servers (issue 20, "Region-scoped stores"): a conversation's event log, held
answers, hot cache, locks and tombstones are on its region's server (``CHAT_REGION_REDIS_URLS``),
found from its ids alone; each server has its own
circuit breaker; the write-back sweep reads every server and names the region in the task.

Three real redis-servers (tests/redis_server.py): the global one and one per region; and
attachment roots per region (``CHAT_REGION_ATTACHMENT_ROOTS``).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis

from conversations import answer_lock, cache, held, tombstones, turnfollow, turnlog, writeback
from core import regions
from core import redis_guard
from tests.redis_server import RedisServer


@pytest.fixture
def servers(settings):
    """{"global": ..., "us-east": ..., "eu-west": ...} running servers, configured."""
    made = {name: RedisServer() for name in ("global", "us-east", "eu-west")}
    for server in made.values():
        server.start()
    settings.REDIS_URL = made["global"].url
    settings.CHAT_REGION_REDIS_URLS = {
        "us-east": made["us-east"].url,
        "eu-west": made["eu-west"].url,
    }
    settings.CHAT_REDIS_BREAKER_OPEN_S = 30
    redis_guard.breaker.reset()
    yield made
    for server in made.values():
        server.close()
    redis_guard._region_breakers.clear()
    redis_guard.breaker.reset()


def everything(server: RedisServer) -> str:
    """Every key and value on ``server`` as one text (strings, hashes, sets, sorted sets,
    streams), for "is this id or text anywhere here" checks."""
    client = redis.Redis.from_url(server.url, decode_responses=True)
    parts = []
    for key in client.scan_iter():
        kind = client.type(key)
        value = {
            "string": lambda k: client.get(k),
            "hash": lambda k: client.hgetall(k),
            "set": lambda k: client.smembers(k),
            "zset": lambda k: client.zrange(k, 0, -1),
            "list": lambda k: client.lrange(k, 0, -1),
            "stream": lambda k: client.xrange(k),
        }.get(kind, lambda k: "")(key)
        parts.append(f"{key} {value}")
    return "\n".join(parts)


def record(conversation_id: uuid.UUID, text: str) -> dict:
    return held.answer_record(
        conversation_id=conversation_id,
        turn_id=regions.new_turn_id(conversation_id),
        reply_to_id=regions.new_turn_id(conversation_id),
        content=text,
        status="complete",
        prompt_tokens=3,
        completion_tokens=2,
    )


def test_turn_ids_carry_their_conversations_region():
    """A turn id minted for a us-east conversation names us-east, so its keys are found on
    us-east's server from the turn id alone."""
    conversation_id = regions.new_conversation_id("us-east")
    turn_id = regions.new_turn_id(conversation_id)
    assert regions.region_of_id(turn_id) == "us-east"
    assert regions.redis_region(None, turn_id) == "us-east"
    assert regions.redis_region(uuid.uuid4()) is None  # untagged: the global server


def test_held_answers_cache_and_tombstones_live_on_the_regions_server(servers):
    """Given a us-east and an eu-west conversation, when each holds an answer, fills the hot
    cache entry's summary and is tombstoned, then each server has its own region's keys and
    text only, and the global server has none of them."""
    us, eu = regions.new_conversation_id("us-east"), regions.new_conversation_id("eu-west")
    us_record, eu_record = record(us, "us secret text"), record(eu, "eu secret text")
    held.hold(us_record, ttl_s=60, due=True)
    held.hold(eu_record, ttl_s=60, due=True)
    tombstones.tombstones_write([us, eu])

    us_text, eu_text = everything(servers["us-east"]), everything(servers["eu-west"])
    assert "us secret text" in us_text and str(us) in us_text and us_record["turn_id"] in us_text
    assert "eu secret text" in eu_text and str(eu) in eu_text
    for other in (eu_text, everything(servers["global"])):
        assert "us secret text" not in other and str(us) not in other
        assert us_record["turn_id"] not in other
    assert "eu secret text" not in us_text and str(eu) not in us_text
    assert held.record_get(us_record["turn_id"])["content"] == "us secret text"
    assert [t.content for t in held.held_turns(eu)] == ["eu secret text"]
    assert tombstones.tombstoned(us) and tombstones.tombstoned(eu)

    cache.forget(us)  # reaches us-east's server (no error, nothing left behind elsewhere)
    held.conversation_held_forget(us)
    assert "us secret text" not in everything(servers["us-east"])
    assert "eu secret text" in everything(servers["eu-west"])


def test_event_log_and_lock_of_a_turn_are_on_its_regions_server(servers):
    """Given a us-east turn mirrored by TurnLogWriter, then its event log, question pointer and
    generating lock are on us-east's server, readable by id alone, and on no other server."""
    conversation_id = regions.new_conversation_id("us-east")
    question_id, answer_id = uuid.uuid4(), regions.new_turn_id(conversation_id)

    async def scenario():
        assert await answer_lock.conversation_lock(conversation_id, answer_id)
        writer = turnlog.TurnLogWriter(answer_id, question_id, conversation_id)
        writer.append(1, "token", {"text": "hello from us-east"})
        writer.append(2, "done", {"turn_id": str(answer_id)})
        writer.close()
        await writer.wait_flushed()
        found = await turnlog.answer_for_question(question_id, conversation_id=conversation_id)
        events = [item async for item in turnfollow.follow(answer_id) if item is not None]
        return found, events

    found, events = asyncio.run(scenario())
    assert found == answer_id
    assert [e[2] for e in events] == [{"text": "hello from us-east"}, {"turn_id": str(answer_id)}]
    us_text = everything(servers["us-east"])
    assert "hello from us-east" in us_text and str(answer_id) in us_text
    for name in ("eu-west", "global"):
        text = everything(servers[name])
        assert "hello from us-east" not in text and str(answer_id) not in text
        assert str(conversation_id) not in text


def test_a_regions_outage_opens_only_its_own_breaker(servers):
    """Given us-east's server down, when a us-east call fails, then us-east's breaker is open
    and eu-west and the global server still serve calls."""
    servers["us-east"].stop()
    us, eu = regions.new_conversation_id("us-east"), regions.new_conversation_id("eu-west")
    assert held.held_turns(us) == []  # degraded: the default, counted and logged
    assert not redis_guard.available(region="us-east")
    assert redis_guard.available(region="eu-west")
    assert redis_guard.available()
    held.hold(record(eu, "still fine"), ttl_s=60, due=False)
    assert [t.content for t in held.held_turns(eu)] == ["still fine"]


def test_write_back_sweep_reads_every_server_and_names_the_region(servers, settings, monkeypatch):
    """Given a due held answer on each region's server, when the sweep runs, then each is
    queued again with its own region in the task's arguments."""
    settings.CHAT_WRITEBACK_REQUEUE_AFTER_S = 0
    us, eu = regions.new_conversation_id("us-east"), regions.new_conversation_id("eu-west")
    us_record, eu_record = record(us, "u"), record(eu, "e")
    held.hold(us_record, ttl_s=60, due=True)
    held.hold(eu_record, ttl_s=60, due=True)
    queued: list[tuple] = []
    monkeypatch.setattr(writeback.turn_write_back, "delay", lambda *args: queued.append(args))
    assert writeback.held_answers_requeue(now=10**10) == 2
    assert sorted(queued) == sorted(
        [(eu_record["turn_id"], "eu-west"), (us_record["turn_id"], "us-east")]
    )


def test_attachment_files_go_under_their_regions_root(settings, tmp_path):
    """Given a root per region, a us-east conversation's file is written under us-east's root
    (and found there by name alone when deleted), never under eu-west's or the default one."""
    from django.core.files.base import ContentFile

    from attachments.services import _delete_files, attachment_storage

    roots = {"us-east": tmp_path / "us", "eu-west": tmp_path / "eu"}
    default_root = tmp_path / "default"
    settings.CHAT_REGION_ATTACHMENT_ROOTS = {region: str(root) for region, root in roots.items()}
    settings.CHAT_ATTACHMENT_STORAGE = {
        **settings.CHAT_ATTACHMENT_STORAGE,
        "OPTIONS": {**settings.CHAT_ATTACHMENT_STORAGE["OPTIONS"], "location": str(default_root)},
    }
    conversation_id = regions.new_conversation_id("us-east")
    storage = attachment_storage(conversation_id=conversation_id)
    name = storage.save(f"{conversation_id}/{uuid.uuid4()}", ContentFile(b"us file bytes"))

    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert [p.read_bytes() for p in written] == [b"us file bytes"]
    assert written[0].is_relative_to(roots["us-east"])
    _delete_files([name])
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
