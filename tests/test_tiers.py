"""Tiers through the request path (issue 5), with the scripted engine double: routing to pools,
rate limits (PF-R1..R3, PF-R5 over HTTP), load shedding, usage and cost per answer.

The limiter, router, admission queue and ledger have their own unit tests (test_ratelimit.py,
test_router.py, test_admission.py, test_usage.py); these check that the gateway uses them: a
refusal comes before any engine work and stores nothing, and what is stored says who answered.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async

from accounts.models import Membership, Organisation
from accounts.services import service_api_key
from core import metrics
from conversations.models import Conversation, Turn
from inference import serving
from inference.pools import pool_set
from tests.api_support import BearerClient, api_client, assert_error, new_conversation, post_json
from tests.chat_support import HTMX, parse_sse, read_stream, signed_in
from usage.models import UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)

LIMITS = {"free": {"rpm": 1000, "tpm": 1_000_000}, "paid": {"rpm": 1000, "tpm": 1_000_000}}


def turn_url(conversation_id: str) -> str:
    return f"/v1/conversations/{conversation_id}/turns"


async def ask(client, conversation_id: str, content: str = "hi", **body):
    return await post_json(client, turn_url(conversation_id), {"role": "user", "content": content, **body})


async def turns_of(conversation_id: str) -> list[Turn]:
    return await sync_to_async(list)(Turn.objects.filter(conversation_id=conversation_id).order_by("created_at"))


# --- routing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tier", "pool", "priority"), [("free", "mini", 1), ("paid", "frontier", 0), ("enterprise", "frontier", 0)]
)
async def test_each_tier_is_answered_by_its_default_pool_which_the_turn_records(
    make_user, engine_double, tier, pool, priority
):
    client, _ = await api_client(make_user, tier=tier)
    conversation_id = await new_conversation(client)
    response = await ask(client, conversation_id)
    events = parse_sse(await read_stream(response))
    assert response["X-Pool"] == pool_set().resolve(pool).key
    done = events[-1][1]
    assert (done["pool"], done["model_version"]) == (pool, pool_set().resolve(pool).version)
    _, answer = await turns_of(conversation_id)
    assert (answer.pool, answer.model_version) == (pool, pool_set().resolve(pool).version)
    assert engine_double.requests[0][1].priority == priority


async def test_a_free_user_asking_for_frontier_gets_403_naming_their_models_and_nothing_is_stored(
    make_user, engine_double
):
    client, _ = await api_client(make_user, tier="free")
    conversation_id = await new_conversation(client)
    response = await ask(client, conversation_id, model="frontier")
    assert_error(response, 403, "model_not_allowed")
    assert "mini" in response.json()["error"]["message"]
    assert await turns_of(conversation_id) == []
    assert engine_double.requests == []


async def test_a_free_user_cannot_create_a_conversation_on_frontier(make_user):
    client, _ = await api_client(make_user, tier="free")
    response = await post_json(client, "/v1/conversations", {"model": "frontier"})
    assert_error(response, 403, "model_not_allowed")
    assert await Conversation.objects.acount() == 0


async def test_an_unknown_model_on_a_turn_is_a_404_listing_the_models(make_user, engine_double):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await ask(client, conversation_id, model="gpt-17")
    assert_error(response, 404, "model_not_found")
    assert "frontier" in response.json()["error"]["message"]
    assert await turns_of(conversation_id) == []


async def test_a_paid_user_picking_reasoning_gets_the_step_by_step_preamble_and_keeps_the_pick(
    make_user, engine_double, monkeypatch
):
    seen: list[list[dict]] = []
    encode = engine_double.encode_chat
    monkeypatch.setattr(engine_double, "encode_chat", lambda messages: seen.append(list(messages)) or encode(messages))
    client, _ = await api_client(make_user, tier="paid")
    conversation_id = await new_conversation(client)
    await read_stream(await ask(client, conversation_id, model="reasoning"))
    await read_stream(await ask(client, conversation_id, "and then?"))  # no model: the pick stays
    reasoning = pool_set().resolve("reasoning")
    assert [t.pool for t in await turns_of(conversation_id) if t.role == "assistant"] == ["reasoning", "reasoning"]
    assert reasoning.system_preamble.split(".")[0] in seen[-1][0]["content"]
    assert engine_double.requests[0][1].max_tokens <= reasoning.max_tokens
    conversation = await Conversation.objects.aget(pk=conversation_id)
    assert conversation.model == "reasoning"


async def test_an_org_pin_routes_every_member_to_the_pinned_version(make_user, engine_double, settings):
    frontier = next(p for p in settings.CHAT_POOLS if p["name"] == "frontier")
    settings.CHAT_POOLS = [*settings.CHAT_POOLS, {**frontier, "version": "frontier-2"}]
    client, user = await api_client(make_user, tier="paid")
    org = await Organisation.objects.acreate(name="Acme", slug="acme", pinned_pool="frontier@frontier-2")
    await Membership.objects.acreate(organisation=org, user=user)
    conversation_id = await new_conversation(client)
    response = await ask(client, conversation_id, model="frontier")
    await read_stream(response)
    assert response["X-Pool"] == "frontier@frontier-2"
    _, answer = await turns_of(conversation_id)
    assert answer.model_version == "frontier-2"


async def test_a_turn_in_flight_finishes_on_the_canary_it_started_on(make_user, engine_double, settings):
    """A canary sends a share of a tier to a new version; ending the canary mid-answer does not
    move the answer being written (it was routed once, when it was admitted)."""
    frontier = next(p for p in settings.CHAT_POOLS if p["name"] == "frontier")
    settings.CHAT_POOLS = [*settings.CHAT_POOLS, {**frontier, "version": "frontier-2"}]
    settings.CHAT_CANARIES = [{"pool": "frontier", "version": "frontier-2", "tier": "paid", "percent": 100}]
    engine_double.scripts = [["slow", 0.3, " answer"], ["next"]]
    client, _ = await api_client(make_user, tier="paid")
    conversation_id = await new_conversation(client)
    response = await ask(client, conversation_id)
    settings.CHAT_CANARIES = []  # the canary ends while the first answer streams
    await read_stream(response)
    await read_stream(await ask(client, conversation_id, "again"))
    answers = [t for t in await turns_of(conversation_id) if t.role == "assistant"]
    assert [a.model_version for a in answers] == ["frontier-2", frontier["version"]]
    assert answers[0].content == "slow answer"


# --- rate limits -----------------------------------------------------------------------------


async def test_over_the_rpm_limit_a_turn_is_a_429_before_any_engine_work(make_user, engine_double, settings):
    """PF-R3: a real 429 (not a 200 then an error event), Retry-After an integer >= 1, the
    remaining-quota headers, nothing stored, the engine never asked."""
    settings.CHAT_RATE_LIMITS_BY_TIER = {"free": {"rpm": 2, "tpm": 1_000_000}}
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    for text in ("one", "two"):
        response = await ask(client, conversation_id, text)
        await read_stream(response)
    assert response["X-RateLimit-Remaining-Requests"] == "0"
    refused = await ask(client, conversation_id, "three")
    assert_error(refused, 429, "rate_limited")
    assert int(refused["Retry-After"]) >= 1
    assert refused["X-RateLimit-Remaining-Requests"] == "0"
    assert len(engine_double.requests) == 2
    assert [t.content for t in await turns_of(conversation_id) if t.role == "user"] == ["one", "two"]
    assert metrics.value("chat_rate_limited_total", scope="user", limit="rpm") >= 1


async def test_the_chat_page_shows_a_rate_limit_as_a_message_a_person_can_act_on(
    make_user, engine_double, settings
):
    settings.CHAT_RATE_LIMITS_BY_TIER = {"free": {"rpm": 1, "tpm": 1_000_000}}
    client, _ = await signed_in(make_user)
    first = await client.post("/chat/turns", {"content": "hello"}, headers=HTMX)
    assert first.status_code == 200
    refused = await client.post("/chat/turns", {"content": "again"}, headers=HTMX)
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) >= 1
    assert refused["HX-Retarget"] == "#composer-error"
    assert "Try again in" in refused.content.decode()
    # The refused first message of a new chat leaves no empty conversation behind.
    assert await Conversation.objects.acount() == 1


async def test_pf_r2_a_long_prompt_counts_against_tpm(make_user, engine_double, settings):
    """PF-R2: TPM 2000; a 1,900-token prompt with max_tokens 10, twice: the second is refused;
    the remaining-tokens header fell by prompt + completion tokens (the unused part refunded)."""
    settings.CHAT_RATE_LIMITS_BY_TIER = {"free": {"rpm": 100, "tpm": 2000}}
    engine_double.scripts = [["a", "b"]]
    client, _ = await api_client(make_user)
    prompt = " ".join(["word"] * 1897)  # + 3 template tokens = 1,900 prompt tokens for the double
    body = {"model": "mini", "messages": [{"role": "user", "content": prompt}], "max_tokens": 10}
    first = await post_json(client, "/v1/chat/completions", body)
    assert first.status_code == 200, first.content
    assert first.json()["usage"]["prompt_tokens"] == 1900
    assert int(first["X-RateLimit-Remaining-Tokens"]) <= 2000 - 1910  # reserved prompt + max_tokens
    second = await post_json(client, "/v1/chat/completions", body)
    assert_error(second, 429, "rate_limited")
    assert len(engine_double.requests) == 1
    # After the refund only prompt + completion (1,902) stay taken: a 90-token request fits.
    small = {"model": "mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    third = await post_json(client, "/v1/chat/completions", small)
    assert third.status_code == 200, third.content


async def test_a_request_larger_than_the_tpm_limit_is_a_400_naming_the_limit(make_user, engine_double, settings):
    settings.CHAT_RATE_LIMITS_BY_TIER = {"free": {"rpm": 100, "tpm": 100}}
    client, _ = await api_client(make_user)
    body = {"model": "mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 500}
    response = await post_json(client, "/v1/chat/completions", body)
    assert_error(response, 400, "request_too_large")
    assert "100" in response.json()["error"]["message"]
    assert engine_double.requests == []


async def test_the_service_credential_draws_on_no_limits(make_user, engine_double, settings):
    settings.CHAT_RATE_LIMITS_BY_TIER = {"free": {"rpm": 1, "tpm": 1_000_000}}
    job = BearerClient(await sync_to_async(service_api_key)())
    body = {"model": settings.CHAT_MODEL_NAME, "messages": [{"role": "user", "content": "summarise"}]}
    statuses = [(await post_json(job, "/v1/chat/completions", body)).status_code for _ in range(3)]
    assert statuses == [200, 200, 200]


async def test_org_limits_are_shared_by_its_members(make_user, engine_double, settings):
    settings.CHAT_RATE_LIMITS_BY_TIER = LIMITS
    settings.CHAT_ORG_RATE_LIMITS_BY_TIER = {"enterprise": {"rpm": 1, "tpm": 1_000_000}}
    org = await Organisation.objects.acreate(name="Acme", slug="acme")
    clients = []
    for name in ("ann", "bob"):
        client, user = await api_client(make_user, username=name)
        await Membership.objects.acreate(organisation=org, user=user)
        clients.append(client)
    body = {"model": "mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    assert (await post_json(clients[0], "/v1/chat/completions", body)).status_code == 200
    refused = await post_json(clients[1], "/v1/chat/completions", body)
    assert_error(refused, 429, "rate_limited")
    assert "organisation" in refused.json()["error"]["message"]


# --- load shedding ---------------------------------------------------------------------------


@pytest.fixture
def queue_depth(monkeypatch):
    """Pretend the admission queue holds ``depth[0]`` waiting requests."""
    depth = [0]

    async def waiting(pool):
        return depth[0]

    monkeypatch.setattr(serving, "pool_waiting", waiting)
    return depth


async def test_a_free_turn_is_shed_with_503_busy_and_retry_after(make_user, engine_double, settings, queue_depth):
    settings.CHAT_SHED_FREE_WAITING = 4
    settings.CHAT_SHED_RETRY_AFTER_S = 7
    queue_depth[0] = 5
    client, _ = await api_client(make_user, tier="free")
    conversation_id = await new_conversation(client)
    before = metrics.value("chat_shed_total", tier="free", action="shed")
    response = await ask(client, conversation_id)
    assert_error(response, 503, "busy")
    assert response["Retry-After"] == "7"
    assert await turns_of(conversation_id) == []
    assert engine_double.requests == []
    assert metrics.value("chat_shed_total", tier="free", action="shed") == before + 1


async def test_paid_turns_are_still_served_while_free_ones_are_shed_then_degraded_to_mini(
    make_user, engine_double, settings, queue_depth
):
    settings.CHAT_SHED_FREE_WAITING = 4
    settings.CHAT_DEGRADE_PAID_WAITING = 8
    client, _ = await api_client(make_user, tier="paid")
    conversation_id = await new_conversation(client)
    queue_depth[0] = 5  # free traffic is shed; paid stays on frontier
    await read_stream(await ask(client, conversation_id, "one"))
    queue_depth[0] = 9  # deeper: paid turns move to the smaller pool
    response = await ask(client, conversation_id, "two")
    await read_stream(response)
    assert response["X-Pool"].startswith("mini@")
    answers = [t for t in await turns_of(conversation_id) if t.role == "assistant"]
    assert [a.pool for a in answers] == ["frontier", "mini"]
    # Charged at the pool that answered.
    mini = pool_set().resolve("mini")
    assert answers[1].cost_usd == mini.cost(
        prompt_tokens=answers[1].prompt_tokens, cached_tokens=0, completion_tokens=answers[1].token_count
    ).quantize(Decimal("0.00000001"))


# --- usage and cost --------------------------------------------------------------------------


async def test_each_answer_is_charged_once_in_the_ledger_with_its_cost(make_user, engine_double):
    engine_double.cached_tokens = 4
    client, user = await api_client(make_user, tier="paid")
    conversation_id = await new_conversation(client)
    await read_stream(await ask(client, conversation_id))
    _, answer = await turns_of(conversation_id)
    records = await sync_to_async(list)(UsageRecord.objects.filter(turn_id=answer.turn_id))
    assert len(records) == 1
    record = records[0]
    assert (record.user_id, record.pool, record.tier) == (user.pk, "frontier", "paid")
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (
        answer.prompt_tokens, 4, answer.token_count,
    )  # fmt: skip
    frontier = pool_set().resolve("frontier")
    expected = (
        (answer.prompt_tokens - 4) * frontier.price_input_per_m
        + 4 * frontier.price_cached_input_per_m
        + answer.token_count * frontier.price_output_per_m
    ) / 1_000_000
    assert record.cost_usd == answer.cost_usd == expected.quantize(Decimal("0.00000001"))
    assert answer.cached_tokens == 4


async def test_pf_r5_a_cancelled_turn_is_charged_the_tokens_it_generated(make_user, engine_double):
    engine_double.scripts = [["one", " two", " three", 5.0, " never"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await ask(client, conversation_id)
    body = await read_stream(response, limit=4)  # the comment and three tokens
    assert body.count(b"event: token") == 3
    assert (await client.post(f"/v1/conversations/{conversation_id}/cancel")).status_code == 204
    for _ in range(50):
        if await UsageRecord.objects.filter(status="cancelled").aexists():
            break
        await asyncio.sleep(0.05)
    record = await UsageRecord.objects.aget()
    assert (record.status, record.completion_tokens) == ("cancelled", 3)
    _, answer = await turns_of(conversation_id)
    assert (answer.status, answer.token_count, answer.cost_usd) == ("cancelled", 3, record.cost_usd)


async def test_completions_are_charged_and_report_cached_tokens(make_user, engine_double):
    engine_double.cached_tokens = 2
    engine_double.scripts = [["x", "y"]]
    client, user = await api_client(make_user)
    body = {"model": "mini", "messages": [{"role": "user", "content": "a b c"}]}
    response = await post_json(client, "/v1/chat/completions", body)
    assert response.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    record = await UsageRecord.objects.aget(user_id=user.pk)
    assert (record.turn_id, record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (None, 6, 2, 2)


async def test_models_lists_the_pools_the_tier_may_use(make_user, settings):
    free, _ = await api_client(make_user, username="f", tier="free")
    paid, _ = await api_client(make_user, username="p", tier="paid")
    free_ids = [m["id"] for m in (await free.get("/v1/models")).json()["data"]]
    paid_ids = [m["id"] for m in (await paid.get("/v1/models")).json()["data"]]
    embedding = settings.CHAT_EMBEDDING_MODEL_NAME
    assert free_ids == ["mini", settings.CHAT_MODEL_NAME, embedding]
    assert paid_ids == ["mini", "frontier", "reasoning", settings.CHAT_MODEL_NAME, embedding]


# --- bad input -------------------------------------------------------------------------------


async def test_a_history_that_overflows_a_little_is_trimmed_not_refused(make_user, engine_double, settings):
    settings.CHAT_POOLS = [{**p, "max_context": 60, "max_tokens": 20} for p in settings.CHAT_POOLS]
    client, _ = await api_client(make_user)
    old = [{"role": "user", "content": "w " * 15}, {"role": "assistant", "content": "w " * 15}]
    body = {"model": "mini", "messages": [{"role": "system", "content": "be brief"}, *old, {"role": "user", "content": "now?"}], "max_tokens": 20}  # fmt: skip
    response = await post_json(client, "/v1/chat/completions", body)
    assert response.status_code == 200, response.content
    assert response["X-Context-Trimmed"] == "2"
    sent = engine_double.requests[0][0]
    assert len(sent) == 3 + 2 + 3 + 1  # the system message and the newest message


async def test_a_prompt_longer_than_the_context_is_a_400_naming_it(make_user, engine_double):
    client, _ = await api_client(make_user)
    body = {"model": "mini", "messages": [{"role": "user", "content": "w " * 3000}]}
    response = await post_json(client, "/v1/chat/completions", body)
    assert_error(response, 400, "context_length_exceeded")
    assert "2,048" in response.json()["error"]["message"]
    conversation_id = await new_conversation(client)
    turn = await ask(client, conversation_id, "w " * 3000)
    assert_error(turn, 400, "context_length_exceeded")
    assert await turns_of(conversation_id) == []


@pytest.mark.parametrize("max_tokens", [0, -5])
async def test_max_tokens_below_one_is_a_400(make_user, engine_double, max_tokens):
    client, _ = await api_client(make_user)
    body = {"model": "mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    assert_error(await post_json(client, "/v1/chat/completions", body), 400, "invalid_request")


async def test_cached_tokens_beyond_the_prompt_are_capped_at_the_prompt(make_user, engine_double):
    """An engine reporting more cached than prompt tokens is charged for the whole prompt at
    the cached price, not refused (the turn was answered) and not charged negative input; the
    turn and the ledger agree, and the conversation is free for the next message (issue 17:
    the clamp is done once, in inference/serving.py, before the cost is computed)."""
    engine_double.cached_tokens, engine_double.cached_unclamped = 10_000, True
    client, user = await api_client(make_user, tier="paid")
    conversation_id = await new_conversation(client)
    await read_stream(await ask(client, conversation_id, "one"))
    answer = [t for t in await turns_of(conversation_id) if t.role == "assistant"][-1]
    assert answer.cached_tokens == answer.prompt_tokens > 0
    row = await UsageRecord.objects.aget(turn_id=answer.turn_id)
    assert row.cached_tokens == row.prompt_tokens == answer.prompt_tokens
    expected = pool_set().resolve(answer.pool).charge(
        prompt_tokens=answer.prompt_tokens, cached_tokens=answer.prompt_tokens,
        completion_tokens=answer.token_count,
    )  # fmt: skip
    assert row.cost_usd == answer.cost_usd == expected
    second = await ask(client, conversation_id, "two")
    assert second.status_code == 200
    assert parse_sse(await read_stream(second))[-1][0] == "done"
