"""The hot conversation cache (conversations/cache.py) and Redis degraded mode
(core/redis_guard.py), against the real test Redis and, for outages, a real redis-server
that the test stops and starts again."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import pytest
import redis
from asgiref.sync import async_to_sync
from django.utils import timezone

from api import idempotency
from core import metrics
from core import redis_guard
from conversations import answer_lock, cache, services
from conversations.models import Turn
from tests.redis_server import RedisServer

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _breaker_closed():
    """Every test starts and ends with Redis considered reachable."""
    redis_guard.breaker.reset()
    yield
    redis_guard.breaker.reset()


@pytest.fixture
def test_redis(settings) -> redis.Redis:
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def own_redis(settings):
    """A redis-server of this test's own, used by the whole process (settings.REDIS_URL), that
    the test may stop and start again; fast breaker for the test."""
    server = RedisServer()
    server.start()
    settings.REDIS_URL = server.url
    settings.CHAT_REDIS_BREAKER_OPEN_S = 0.2
    try:
        yield server
    finally:
        server.close()


def conversation_with_turns(make_user, exchanges: int = 2):
    """A conversation with ``exchanges`` stored question/answer pairs."""
    conversation = services.conversation_create(owner=make_user())
    for i in range(exchanges):
        question = services.turn_append_user(conversation=conversation, content=f"question {i}")
        services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
            content=f"answer {i}", status=Turn.Status.COMPLETE, prompt_tokens=5,
            completion_tokens=2,
        )  # fmt: skip
    conversation.refresh_from_db()
    return conversation


def unsaved_answer(conversation, question: Turn, text: str = "fresh answer") -> Turn:
    """A finished answer that PostgreSQL does not have yet (write-back pending)."""
    return Turn(
        turn_id=uuid.uuid4(), conversation_id=conversation.pk, role=Turn.Role.ASSISTANT,
        content=text, status=Turn.Status.COMPLETE, reply_to_id=question.turn_id,
        created_at=timezone.now(), token_count=2,
    )  # fmt: skip


def contents(history) -> list[str]:
    return [t.content for t in history.turns]


# --- fill, promote, write-through, eviction ---------------------------------------------------


def test_a_miss_reads_postgres_and_fills_the_cache(make_user, test_redis):
    """Given a conversation with no cache entry, when its history is read, then it comes from
    PostgreSQL and conv:{id} now holds its turns and owner; the next read is a cache hit."""
    conversation = conversation_with_turns(make_user)
    assert not test_redis.exists(cache.cache_key(conversation.pk))

    first = cache.history(conversation.pk, last_turn_at=conversation.last_turn_at)
    second = cache.history(conversation.pk, last_turn_at=conversation.last_turn_at)

    assert first.source == "postgres"
    assert second.source == "cache"
    assert contents(second) == ["question 0", "answer 0", "question 1", "answer 1"]
    assert second.complete and second.owner_id == conversation.owner_id
    assert [t.turn_id for t in second.turns] == [t.turn_id for t in first.turns]


def test_a_read_promotes_the_entry_ttl(make_user, test_redis, settings):
    """Promoted on read: a hit resets the entry's TTL to CHAT_HOT_CACHE_TTL_S."""
    settings.CHAT_HOT_CACHE_TTL_S = 86400
    conversation = conversation_with_turns(make_user)
    cache.history(conversation.pk)
    test_redis.expire(cache.cache_key(conversation.pk), 100)

    found = cache.history(conversation.pk)

    assert found.source == "cache"
    assert test_redis.ttl(cache.cache_key(conversation.pk)) > 86000


def test_write_through_makes_an_answer_visible_before_postgres_has_it(make_user):
    """Kept in step on write: a finished answer written through to the entry is read back from
    the cache although PostgreSQL does not have it yet."""
    conversation = conversation_with_turns(make_user, exchanges=1)
    question = services.turn_append_user(conversation=conversation, content="question 1")
    cache.history(conversation.pk)  # filled, with the new question
    answer = unsaved_answer(conversation, question)

    updated = async_to_sync(cache.aturn_cached)(answer, after=question.created_at)

    found = cache.history(conversation.pk, holding=question.turn_id)
    assert updated == 1
    assert found.source == "cache"
    assert contents(found)[-2:] == ["question 1", "fresh answer"]
    assert not Turn.objects.filter(pk=answer.turn_id).exists()


def test_write_through_without_an_entry_creates_none(make_user, test_redis):
    """Entries are created by reads (from PostgreSQL) only: a write-through to a conversation
    with no entry changes nothing."""
    conversation = conversation_with_turns(make_user, exchanges=1)
    question = services.turn_append_user(conversation=conversation, content="q")
    answer = unsaved_answer(conversation, question)

    updated = async_to_sync(cache.aturn_cached)(answer, after=question.created_at)

    assert updated == 0
    assert not test_redis.exists(cache.cache_key(conversation.pk))


def test_write_through_keeps_only_the_newest_n_turns(make_user, settings):
    """The entry holds the last N turns (CHAT_HOT_CACHE_TURNS) and then says it is partial."""
    settings.CHAT_HOT_CACHE_TURNS = 4
    conversation = conversation_with_turns(make_user, exchanges=2)
    cache.history(conversation.pk)
    question = services.turn_append_user(conversation=conversation, content="question 2")
    async_to_sync(cache.aturn_cached)(question, after=conversation.last_turn_at)

    found = cache.history(conversation.pk)

    assert contents(found) == ["answer 0", "question 1", "answer 1", "question 2"]
    assert not found.complete


def test_an_evicted_entry_falls_through_to_postgres_and_is_refilled(make_user, test_redis):
    """Eviction: with conv:{id} deleted, a read falls through to PostgreSQL and refills it."""
    conversation = conversation_with_turns(make_user)
    cache.history(conversation.pk)
    test_redis.delete(cache.cache_key(conversation.pk))
    misses = metrics.value("chat_hot_cache_reads_total", result="miss")

    found = cache.history(conversation.pk)

    assert found.source == "postgres"
    assert contents(found) == ["question 0", "answer 0", "question 1", "answer 1"]
    assert test_redis.exists(cache.cache_key(conversation.pk))
    assert metrics.value("chat_hot_cache_reads_total", result="miss") == misses + 1


def test_an_entry_that_missed_a_write_is_stale_and_refilled(make_user):
    """An entry older than the conversation row (turns written while Redis was unreachable) is
    not used: the read returns PostgreSQL's turns and replaces the entry."""
    conversation = conversation_with_turns(make_user, exchanges=1)
    cache.history(conversation.pk)
    missed = services.turn_append_user(conversation=conversation, content="written during outage")

    found = cache.history(conversation.pk, last_turn_at=conversation.last_turn_at)
    again = cache.history(conversation.pk, last_turn_at=conversation.last_turn_at)

    assert found.source == "postgres"
    assert found.turns[-1].turn_id == missed.turn_id
    assert again.source == "cache" and again.turns[-1].turn_id == missed.turn_id


def test_a_write_through_onto_a_stale_entry_deletes_it(make_user, test_redis):
    """A write-through whose previous turn the entry does not hold drops the entry (-1) rather
    than leaving a gap in the cached history."""
    conversation = conversation_with_turns(make_user, exchanges=1)
    cache.history(conversation.pk)
    missed = services.turn_append_user(conversation=conversation, content="missed")
    answer = unsaved_answer(conversation, missed)

    updated = async_to_sync(cache.aturn_cached)(answer, after=missed.created_at)

    assert updated == -1
    assert not test_redis.exists(cache.cache_key(conversation.pk))


def test_the_prompt_history_ends_at_the_question_and_comes_from_the_cache(make_user):
    """The prompt path (selectors.prompt_context) reads the turns before the question, oldest
    first, from an entry that holds the question; a turn written after it is left out."""
    from conversations import selectors  # noqa: PLC0415

    conversation = conversation_with_turns(make_user, exchanges=2)
    question = services.turn_append_user(conversation=conversation, content="question 2")
    cache.history(conversation.pk)
    services.turn_append_user(conversation=conversation, content="later")  # after the question
    hits = metrics.value("chat_hot_cache_reads_total", result="hit")

    context = selectors.prompt_context(conversation_id=conversation.pk, question=question)

    assert context.exchanges == [("question 0", "answer 0"), ("question 1", "answer 1")]
    assert metrics.value("chat_hot_cache_reads_total", result="hit") == hits + 1


def test_summary_write_through_updates_the_entry(make_user):
    """The running summary is kept in step: summary_set changes the cached summary."""
    conversation = conversation_with_turns(make_user)
    cache.history(conversation.pk)
    through = timezone.now() - timedelta(minutes=1)

    cache.summary_set(conversation_id=conversation.pk, summary="They talked.", summary_through=through)

    found = cache.history(conversation.pk)
    assert found.source == "cache"
    assert found.summary == "They talked."
    assert found.summary_through == through


# --- degraded mode ----------------------------------------------------------------------------


def test_with_redis_down_history_comes_from_postgres_with_a_metric_and_one_log_line(
    make_user, own_redis, caplog
):
    """Redis down is a degraded mode: reads come from PostgreSQL, each is counted, and the
    outage is logged once (not once per call)."""
    conversation = conversation_with_turns(make_user)
    own_redis.stop()
    down = metrics.value("chat_hot_cache_reads_total", result="down")
    unavailable = metrics.value("chat_redis_unavailable_total", part="cache")

    with caplog.at_level(logging.WARNING):
        reads = [cache.history(conversation.pk) for _ in range(3)]

    assert [r.source for r in reads] == ["postgres"] * 3
    assert contents(reads[0]) == ["question 0", "answer 0", "question 1", "answer 1"]
    assert metrics.value("chat_hot_cache_reads_total", result="down") == down + 3
    assert metrics.value("chat_redis_unavailable_total", part="cache") >= unavailable + 3
    assert len([r for r in caplog.records if "Redis call for cache failed" in r.message]) == 1
    assert not redis_guard.available()


def test_after_redis_returns_the_cache_fills_again_by_itself(make_user, own_redis, settings):
    """Recovery needs no restart: once Redis answers again (after the breaker's pause), reads
    refill conv:{id}."""
    conversation = conversation_with_turns(make_user)
    own_redis.stop()
    assert cache.history(conversation.pk).source == "postgres"
    own_redis.start()
    import time

    time.sleep(settings.CHAT_REDIS_BREAKER_OPEN_S + 0.05)

    cache.history(conversation.pk)

    assert redis_guard.available()
    assert redis.Redis.from_url(own_redis.url).exists(cache.cache_key(conversation.pk))
    assert cache.history(conversation.pk).source == "cache"


def test_write_through_with_redis_down_is_skipped_without_raising(make_user, own_redis):
    conversation = conversation_with_turns(make_user, exchanges=1)
    question = services.turn_append_user(conversation=conversation, content="q")
    own_redis.stop()

    updated = async_to_sync(cache.aturn_cached)(unsaved_answer(conversation, question), after=None)

    assert updated is None


def test_open_breaker_refuses_calls_until_its_probe():
    """After an outage error the breaker refuses calls for open_s, then lets one probe
    through; the probe's success closes it."""
    now = [100.0]
    breaker = redis_guard.CircuitBreaker(open_s=3, clock=lambda: now[0])
    breaker.record_failure(redis.exceptions.ConnectionError("refused"))

    refused = breaker.allow()
    now[0] += 3.1
    probe, second = breaker.allow(), breaker.allow()
    breaker.record_success()

    assert (refused, probe, second) == (False, True, False)
    assert breaker.allow() and not breaker.is_open


def test_an_open_breaker_costs_no_network_call(own_redis, settings):
    """While the breaker is open a call returns its fallback without trying to connect."""
    settings.CHAT_REDIS_BREAKER_OPEN_S = 60
    own_redis.stop()
    calls = []

    def probe(client):
        calls.append(1)
        return client.ping()

    first = redis_guard.call("test", probe, default="fallback")
    second = redis_guard.call("test", probe, default="fallback")

    assert (first, second) == ("fallback", "fallback")
    assert calls == [1]


def test_rate_limit_helper_fails_open_and_counts(own_redis):
    """Issue 5's limiter: with Redis down the check returns None (allow) and is counted."""
    own_redis.stop()
    before = metrics.value("chat_rate_limit_fail_open_total", limit="rpm")

    async def check():
        return await redis_guard.rate_limit_fail_open("rpm", lambda r: r.incr("bucket"))

    assert async_to_sync(check)() is None
    assert metrics.value("chat_rate_limit_fail_open_total", limit="rpm") == before + 1


def test_generating_lock_fails_open_and_is_released_after_recovery(own_redis):
    """The lock: with Redis unavailable it fails open (the process-local check applies); an
    unlock that failed is done when this process next locks the conversation."""
    conversation_id, answer_id, next_answer = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    async def scenario():
        taken = await answer_lock.conversation_lock(conversation_id, answer_id)
        redis_guard.breaker.record_failure(redis.exceptions.ConnectionError("simulated"))
        open_lock = await answer_lock.conversation_lock(conversation_id, uuid.uuid4())
        await answer_lock.conversation_unlock(conversation_id, answer_id)  # fails: remembered
        redis_guard.breaker.reset()
        relocked = await answer_lock.conversation_lock(conversation_id, next_answer)
        holder = await answer_lock.conversation_holder(conversation_id)
        return taken, open_lock, relocked, holder

    taken, open_lock, relocked, holder = async_to_sync(scenario)()

    assert (taken, open_lock, relocked) == (True, True, True)
    assert holder == next_answer


def test_idempotency_keys_are_kept_in_process_while_redis_is_down(own_redis):
    """Idempotency-Key with Redis down: the retry to the same process replays the first turn;
    the record outlives the outage."""
    fingerprint = "fp"
    conversation_id, answer_id = uuid.uuid4(), uuid.uuid4()
    user_id = 4242

    async def scenario():
        first = await idempotency.claim(user_id, "retry-me", fingerprint)
        await idempotency.record(user_id, "retry-me", fingerprint, conversation_id, answer_id)
        retry = await idempotency.claim(user_id, "retry-me", fingerprint)
        return first, retry

    idempotency._local.clear()
    own_redis.stop()
    first, retry = async_to_sync(scenario)()
    own_redis.start()
    redis_guard.breaker.reset()
    after = async_to_sync(idempotency.claim)(user_id, "retry-me", fingerprint)

    assert first is None
    assert retry == idempotency.Replay(conversation_id, answer_id)
    assert after == idempotency.Replay(conversation_id, answer_id)


# --- the read paths use it --------------------------------------------------------------------


def test_the_next_prompt_sees_a_written_through_answer_before_postgres_has_it(make_user):
    """The prompt for the next turn is built from the cache: an answer written through (its
    write-back to PostgreSQL still pending) is part of the history."""
    from conversations import selectors  # noqa: PLC0415

    conversation = conversation_with_turns(make_user, exchanges=1)
    question = services.turn_append_user(conversation=conversation, content="question 1")
    cache.history(conversation.pk)
    answer = unsaved_answer(conversation, question, "only in the cache")
    async_to_sync(cache.aturn_cached)(answer, after=question.created_at)
    before = conversation.last_turn_at
    conversation.refresh_from_db()
    follow_up = services.turn_append_user(conversation=conversation, content="question 2")
    async_to_sync(cache.aturn_cached)(follow_up, after=before)

    context = selectors.prompt_context(conversation_id=conversation.pk, question=follow_up)

    assert context.exchanges[-1] == ("question 1", "only in the cache")


def test_the_first_history_page_comes_from_the_cache_and_falls_back_when_evicted(
    make_user, test_redis
):
    """GET /v1/conversations/{id}'s first page (page_selectors.turn_page) is served from conv:{id};
    with the key evicted it is read from PostgreSQL."""
    from conversations import page_selectors  # noqa: PLC0415

    conversation = conversation_with_turns(make_user, exchanges=1)
    question = services.turn_append_user(conversation=conversation, content="question 1")
    conversation.refresh_from_db()
    cache.history(conversation.pk)
    answer = unsaved_answer(conversation, question, "cached only")
    async_to_sync(cache.aturn_cached)(answer, after=question.created_at)

    cached_page, cached_more = page_selectors.turn_page(conversation=conversation, before=None, limit=2)
    test_redis.delete(cache.cache_key(conversation.pk))
    pg_page, _ = page_selectors.turn_page(conversation=conversation, before=None, limit=2)

    assert [t.content for t in cached_page] == ["question 1", "cached only"]
    assert cached_more is True
    assert [t.content for t in pg_page] == ["answer 0", "question 1"]


@pytest.mark.django_db(transaction=True)
async def test_a_resume_that_needs_redis_gets_503_while_it_is_down(make_user, own_redis):
    """Answers cannot be resumed while Redis is down: a resume of a turn this process does not
    hold gets a clear 503 with Retry-After (not a 404, not a 500); with Redis up it is 404."""
    from tests.api_support import api_client, new_conversation  # noqa: PLC0415

    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    url = f"/v1/conversations/{conversation_id}/turns/{uuid.uuid4()}/events"
    up = await client.get(url, headers={"Last-Event-ID": "3"})
    own_redis.stop()

    down = await client.get(url, headers={"Last-Event-ID": "3"})

    assert up.status_code == 404
    assert down.status_code == 503
    assert down.json()["error"]["type"] == "unavailable"
    assert int(down["Retry-After"]) >= 1
