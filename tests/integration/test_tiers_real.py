"""Tiers with the real engine (issue 5): the real vLLM engine reports prefix-cache hits, so a
conversation's second turn is charged its cached prompt tokens at the cheaper price; each answer
is charged once in the ledger; a paid user's reasoning pick reaches the real model with its
preamble and its own ceilings."""

from __future__ import annotations

from decimal import Decimal

import pytest

from inference.pools import pool_set
from tests.integration.test_real_stream import answer_turn, read_events, send
from usage.models import UsageRecord

pytestmark = pytest.mark.real_engine


def test_the_second_turn_is_charged_its_prefix_cache_hits_at_the_cached_price(live, make_user, settings):
    settings.CHAT_MAX_TOKENS = 24  # short answers: what is charged, not what is said, is tested
    make_user("cora", tier="paid")
    client = live.login("cora")
    # vLLM's CPU backend caches whole 128-token KV blocks: a first prompt of some 300 tokens
    # leaves at least two blocks for the second turn to reuse.
    story = (
        "I am planning a long walk along the coast next weekend with two friends and a dog. "
        "We will start early in the morning and want to be back before dark. "
    ) * 8
    conversation_id, events_url = send(client, story + "Name three colours of the rainbow.")
    first_done = read_events(client, events_url)[-1][1]
    _, events_url = send(client, "And two more?", conversation_id)
    done = read_events(client, events_url)[-1][1]

    answer = answer_turn(events_url)
    assert (answer.pool, done["pool"]) == ("frontier", "frontier")
    # The history (system prompt, first question) was prefilled for turn one: the engine serves
    # its whole blocks of turn two from the prefix cache (block size 128 on the CPU backend).
    first_prompt = first_done["usage"]["prompt_tokens"]
    assert first_prompt >= 256
    assert answer.cached_tokens >= first_prompt // 128 * 128 >= 256
    assert done["usage"]["cached_tokens"] == answer.cached_tokens
    frontier = pool_set().resolve("frontier")
    expected = (
        (answer.prompt_tokens - answer.cached_tokens) * frontier.price_input_per_m
        + answer.cached_tokens * frontier.price_cached_input_per_m
        + answer.token_count * frontier.price_output_per_m
    ) / 1_000_000
    assert answer.cost_usd == expected.quantize(Decimal("0.00000001"))
    assert Decimal(done["usage"]["cost_usd"]) == answer.cost_usd
    record = UsageRecord.objects.get(turn_id=answer.turn_id)
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens, record.cost_usd) == (
        answer.prompt_tokens, answer.cached_tokens, answer.token_count, answer.cost_usd,
    )  # fmt: skip


def test_a_reasoning_turn_runs_on_the_real_model_with_its_preamble(live, make_user, settings):
    settings.CHAT_MAX_TOKENS = 24  # the preamble and the pool are tested, not the answer's length
    make_user("rey", tier="paid")
    client = live.login("rey")
    response = client.post(
        "/chat/turns", data={"content": "What is 2 + 3?", "model": "reasoning"}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 200, response.text
    events_url = response.text.split('sse-connect="')[1].split('"')[0]
    done = read_events(client, events_url)[-1][1]
    answer = answer_turn(events_url)
    assert (done["status"], answer.pool) == ("complete", "reasoning")
    # The preamble is part of the prompt: longer than the same question on frontier.
    make_user("fred", tier="paid")
    other = live.login("fred")
    _, plain_url = send(other, "What is 2 + 3?")
    plain = read_events(other, plain_url)[-1][1]
    preamble_tokens = done["usage"]["prompt_tokens"] - plain["usage"]["prompt_tokens"]
    assert preamble_tokens >= 15
