"""The chat page's event stream with the scripted engine double: tokens then done, the stored
answer and its cost, valid UTF-8, engine failures and restarts, replays of an answered turn, and
the history in the next prompt."""

from __future__ import annotations

from decimal import Decimal

import pytest

from conversations import turnstream
from conversations.models import Turn
from tests.chat_support import events_url_of, parse_sse, post_message, read_stream, signed_in

pytestmark = pytest.mark.django_db(transaction=True)


# --- streaming ------------------------------------------------------------------------------


async def test_send_streams_tokens_then_done_and_stores_the_answer(make_user, engine_double):
    engine_double.scripts = [["Hello", ", ", "", "**world**", "."]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "Say hello")
    assert response.status_code == 200
    assert response["HX-Push-Url"].startswith("/c/")
    # The user turn is committed before generation starts.
    assert await Turn.objects.filter(role="user", content="Say hello").aexists()

    stream = await client.get(events_url_of(response))
    assert stream["Content-Type"].startswith("text/event-stream")
    assert stream["Cache-Control"] == "no-cache"
    assert stream["X-Accel-Buffering"] == "no"
    events = parse_sse(await read_stream(stream))

    tokens = [data["text"] for name, data, _ in events if name == "token"]
    assert tokens == ["Hello", ", ", "**world**", "."]  # PF-S1: no empty events
    name, done, _ = events[-1]
    assert name == "done"
    assert [eid for _, _, eid in events] == list(range(1, len(events) + 1))
    answer = await Turn.objects.aget(role="assistant")
    assert answer.content == "".join(tokens) == "Hello, **world**."
    assert answer.status == "complete"
    assert done["turn_id"] == str(answer.turn_id)
    # The empty delta was still a token (as a partial UTF-8 byte is): usage counts it.
    assert done["usage"] == {
        "prompt_tokens": answer.prompt_tokens, "cached_tokens": 0, "completion_tokens": 5,
        "cost_usd": str(answer.cost_usd),
    }  # fmt: skip
    assert (done["pool"], answer.pool) == ("mini", "mini")  # a free user's default pool
    # mini's prices ($0.75 / $4.50 per 1M input / output tokens, the design brief's).
    assert answer.cost_usd == (Decimal(answer.prompt_tokens) * Decimal("0.75") + 5 * Decimal("4.50")) / 1_000_000
    assert "<strong>world</strong>" in done["html"]


async def test_unicode_deltas_arrive_as_valid_utf8_and_match_the_stored_turn(make_user, engine_double):
    """PF-S2 (gateway half): every data payload is valid UTF-8 JSON, no U+FFFD."""
    engine_double.scripts = [["你好", "世界 ", "🙂🎉", " café ", "naïve"]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "greet me")
    raw = await read_stream(await client.get(events_url_of(response)))
    text = raw.decode("utf-8")  # raises on invalid UTF-8
    assert "\ufffd" not in text
    events = parse_sse(raw)
    joined = "".join(d["text"] for n, d, _ in events if n == "token")
    answer = await Turn.objects.aget(role="assistant")
    assert joined == answer.content == "你好世界 🙂🎉 café naïve"


async def test_engine_failure_ends_with_a_readable_error_event(make_user, engine_double):
    engine_double.scripts = [["partial", RuntimeError("boom")]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "hi")
    events = parse_sse(await read_stream(await client.get(events_url_of(response))))
    name, data, _ = events[-1]
    assert name == "error"
    assert "went wrong" in data["message"]
    answer = await Turn.objects.aget(role="assistant")
    assert answer.status == "failed"


async def test_answered_turn_replays_only_done(make_user, engine_double):
    client, _ = await signed_in(make_user)
    response = await post_message(client, "hi")
    url = events_url_of(response)
    await read_stream(await client.get(url))
    turnstream._streams.clear()  # as after the finished stream has been released
    events = parse_sse(await read_stream(await client.get(url)))
    assert [name for name, _, _ in events] == ["done"]
    assert len(engine_double.requests) == 1  # not generated again


async def test_next_turn_prompt_contains_the_history(make_user, engine_double):
    engine_double.scripts = [["Paris", "."], ["Yes", "."]]
    client, _ = await signed_in(make_user)
    first = await post_message(client, "capital of france")
    await read_stream(await client.get(events_url_of(first)))
    conversation_id = events_url_of(first).split("/")[2]
    second = await post_message(client, "are you sure", conversation_id)
    assert second.status_code == 200
    await read_stream(await client.get(events_url_of(second)))
    prompt_2 = engine_double.requests[1][0]
    prompt_1 = engine_double.requests[0][0]
    assert len(prompt_2) > len(prompt_1)  # history + the new question


async def test_engine_death_mid_answer_continues_after_restart(make_user, engine_double):
    """The engine process dies after two tokens: the turn waits for the restarted engine and
    continues from the text already sent (re-prefilled), so nothing streamed is lost."""
    from inference.engine import EngineUnavailable

    engine_double.scripts = [["Hello", " there", EngineUnavailable("core died")], [",", " friend."]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "hi")
    events = parse_sse(await read_stream(await client.get(events_url_of(response))))
    tokens = [d["text"] for n, d, _ in events if n == "token"]
    assert tokens == ["Hello", " there", ",", " friend."]
    assert events[-1][0] == "done" and events[-1][1]["status"] == "complete"
    assert engine_double.waited_ready == 1
    first_prompt, second_prompt = engine_double.requests[0][0], engine_double.requests[1][0]
    assert len(second_prompt) == len(first_prompt) + 2  # + "Hello there" re-prefilled
    answer = await Turn.objects.aget(role="assistant")
    assert answer.content == "Hello there, friend."
    assert answer.token_count == 4


async def test_engine_that_stays_dead_ends_with_a_readable_error(make_user, engine_double, settings):
    from inference.engine import EngineUnavailable

    settings.CHAT_ENGINE_RESUME_ATTEMPTS = 1
    engine_double.scripts = [["Hi", EngineUnavailable("dead")], [EngineUnavailable("still dead")]]
    client, _ = await signed_in(make_user)
    response = await post_message(client, "hi")
    events = parse_sse(await read_stream(await client.get(events_url_of(response))))
    assert events[-1][0] == "error"
    assert "unavailable" in events[-1][1]["message"]
    answer = await Turn.objects.aget(role="assistant")
    assert answer.status == "failed" and answer.content == "Hi"
