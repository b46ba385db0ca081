"""Organisation policies take effect on the next turn (issue 8), set by the owner on the
workspace's pages and observed through the request path with the scripted engine double
(tests/fakes.py): the pinned pool, training eligibility, the organisation's own rate limits
(a 429), moderation thresholds, zero retention and the region. Nothing caches a policy beyond
one turn: each turn reads its organisation afresh (accounts/callers.py ``caller_for``).

Also: the policies form refuses what an owner may not set.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from accounts.models import Membership, Organisation
from conversations.models import Conversation, Turn
from tests.api_support import api_client, assert_error, new_conversation, post_json
from tests.chat_support import parse_sse, read_stream
from workspaces import services

pytestmark = pytest.mark.django_db(transaction=True)

ROOMY = {"free": {"rpm": 1000, "tpm": 1_000_000}, "paid": {"rpm": 1000, "tpm": 1_000_000}}
POLICY_DEFAULTS = {"region": "eu-west", "pinned_pool": ""}


@pytest.fixture
def roomy_user_limits(settings):
    settings.CHAT_RATE_LIMITS_BY_TIER = ROOMY
    settings.CHAT_ORG_RATE_LIMITS_BY_TIER = {"enterprise": {"rpm": 100, "tpm": 1_000_000}}


async def workspace(make_user, *, member_tier: str = "paid") -> dict:
    """Acme (enterprise) owned by olga, with mia (``member_tier``) as a member who talks over
    /v1 in a conversation of Acme's workspace; olga's signed-in page client."""
    olga = await sync_to_async(make_user)("olga")

    def create():
        org = services.organisation_create(creator=olga, name="Acme", slug="acme")
        org.tier = "enterprise"
        org.save(update_fields=["tier"])
        return org

    org = await sync_to_async(create)()
    api, mia = await api_client(make_user, username="mia", tier=member_tier)
    await Membership.objects.acreate(organisation=org, user=mia, role="member")
    conversation_id = await new_conversation(api)
    owner = AsyncClient()
    await owner.aforce_login(olga)
    return {"org": org, "api": api, "mia": mia, "conversation_id": conversation_id, "owner": owner}


async def set_policies(ws: dict, **fields) -> None:
    """The owner saves the policies page with ``fields`` (booleans: on when truthy)."""
    data = dict(POLICY_DEFAULTS)
    for name, value in fields.items():
        if isinstance(value, bool):
            if value:
                data[name] = "on"
        else:
            data[name] = value
    response = await ws["owner"].post("/orgs/acme/policies/", data)
    assert response.status_code == 303, response.content.decode()[:800]


async def say(ws: dict, content: str = "hello"):
    """Mia sends a message on /v1 and reads the whole answer; returns the response."""
    response = await post_json(
        ws["api"],
        f"/v1/conversations/{ws['conversation_id']}/turns",
        {"role": "user", "content": content},
    )
    if response.status_code == 200:
        parse_sse(await read_stream(response))
    return response


async def turns_of(conversation_id) -> list[Turn]:
    return await sync_to_async(list)(
        Turn.objects.filter(conversation_id=conversation_id).order_by("created_at", "turn_id")
    )


async def test_a_pinned_version_answers_from_the_next_turn(
    make_user, engine_double, settings, roomy_user_limits
):
    frontier = next(p for p in settings.CHAT_POOLS if p["name"] == "frontier")
    settings.CHAT_POOLS = [*settings.CHAT_POOLS, {**frontier, "version": "frontier-2"}]
    ws = await workspace(make_user)
    before = await say(ws)
    assert before["X-Pool"] == f"frontier@{frontier['version']}"

    await set_policies(ws, pinned_pool="frontier@frontier-2")

    after = await say(ws, "again")
    assert after["X-Pool"] == "frontier@frontier-2"
    answers = [t for t in await turns_of(ws["conversation_id"]) if t.role == "assistant"]
    assert [a.model_version for a in answers] == [frontier["version"], "frontier-2"]


async def test_not_for_training_marks_every_turn_from_the_next_one(
    make_user, engine_double, roomy_user_limits
):
    ws = await workspace(make_user)
    await say(ws, "first")

    await set_policies(ws, not_for_training=True)
    await say(ws, "second")

    turns = await turns_of(ws["conversation_id"])
    assert [(t.role, t.content[:6], t.training_eligible) for t in turns] == [
        ("user", "first", True), ("assistant", "Hello,", True),
        ("user", "second", False), ("assistant", "Hello,", False),
    ]  # fmt: skip

    await set_policies(ws, not_for_training=False)  # and back, again from the next turn
    await say(ws, "third")
    assert [t.training_eligible for t in await turns_of(ws["conversation_id"])][-2:] == [True, True]


async def test_turns_outside_any_organisation_are_training_eligible(
    make_user, engine_double, roomy_user_limits
):
    api, _ = await api_client(make_user, username="loner")
    conversation_id = await new_conversation(api)
    response = await post_json(
        api, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "hi"}
    )
    await read_stream(response)
    turns = await turns_of(conversation_id)
    assert len(turns) == 2 and all(t.training_eligible for t in turns)


async def test_the_organisations_own_rpm_gives_a_429_from_the_next_turn(
    make_user, engine_double, roomy_user_limits
):
    """Tier limit 100 RPM; the owner lowers it to 1: the turn after next is refused with a real
    429 naming the organisation's limit (PF-R3: Retry-After an integer >= 1), nothing stored,
    the engine never asked."""
    ws = await workspace(make_user)
    assert (await say(ws, "one")).status_code == 200

    await set_policies(ws, rate_limit_rpm="1")

    assert (await say(ws, "two")).status_code == 200
    refused = await say(ws, "three")
    assert_error(refused, 429, "rate_limited")
    assert "your organisation's limit of requests per minute" in refused.json()["error"]["message"]
    assert int(refused["Retry-After"]) >= 1
    assert len(engine_double.requests) == 2
    assert [t.content for t in await turns_of(ws["conversation_id"]) if t.role == "user"] == [
        "one",
        "two",
    ]


async def test_an_organisations_own_limit_replaces_its_tiers_also_upwards(
    make_user, engine_double, settings
):
    """Staff may give an organisation more than its tier (the admin): RPM 1 by tier, 3 by its
    own setting: three turns pass, the fourth is refused."""
    settings.CHAT_RATE_LIMITS_BY_TIER = ROOMY
    settings.CHAT_ORG_RATE_LIMITS_BY_TIER = {"enterprise": {"rpm": 1, "tpm": 1_000_000}}
    ws = await workspace(make_user)
    await Organisation.objects.filter(pk=ws["org"].pk).aupdate(rate_limit_rpm=3)
    statuses = [(await say(ws, f"m{i}")).status_code for i in range(4)]
    assert statuses == [200, 200, 200, 429]


async def test_an_organisations_own_tpm_is_what_a_request_is_measured_against(
    make_user, engine_double, roomy_user_limits
):
    """A TPM below one request's prompt + max_tokens: every request is a 400 naming the limit."""
    ws = await workspace(make_user)
    await set_policies(ws, rate_limit_tpm="5")
    response = await say(ws, "a message")
    assert_error(response, 400, "request_too_large")
    assert (
        "your organisation's tier allows 5 tokens per minute" in response.json()["error"]["message"]
    )


async def test_a_moderation_threshold_applies_from_the_next_message(
    make_user, engine_double, roomy_user_limits
):
    """'that movie sucked' scores about 0.37 offensive: under the default threshold (0.85) it
    passes; after the owner sets 0.3 on the moderation page, the same message is blocked."""
    ws = await workspace(make_user)
    assert (await say(ws, "that movie sucked")).status_code == 200
    saved = await ws["owner"].post(
        "/orgs/acme/moderation/", {"threshold_offensive": "0.3", "blocked_terms": ""}
    )
    assert saved.status_code == 303
    blocked = await say(ws, "that movie sucked")
    assert_error(blocked, 400, "content_blocked")
    assert "offensive" in blocked.json()["error"]["categories"]
    assert len(engine_double.requests) == 1


async def test_zero_retention_stops_storing_from_the_next_turn(
    make_user, engine_double, roomy_user_limits
):
    ws = await workspace(make_user)
    await say(ws, "kept")
    await set_policies(ws, zero_retention=True)
    await say(ws, "not kept")
    assert [t.content for t in await turns_of(ws["conversation_id"]) if t.role == "user"] == [
        "kept"
    ]


async def test_a_new_region_applies_to_the_next_conversation(
    make_user, engine_double, roomy_user_limits
):
    ws = await workspace(make_user)
    await set_policies(ws, region="us-east")
    conversation_id = await new_conversation(ws["api"])
    moved = await Conversation.objects.aget(pk=conversation_id)
    earlier = await Conversation.objects.aget(pk=ws["conversation_id"])
    assert (moved.region, earlier.region) == ("us-east", "eu-west")


# --- what the form refuses ----------------------------------------------------------------------


async def test_an_owner_cannot_raise_a_limit_above_the_tiers(make_user, roomy_user_limits):
    ws = await workspace(make_user)
    response = await ws["owner"].post(
        "/orgs/acme/policies/", {**POLICY_DEFAULTS, "rate_limit_rpm": "101"}
    )
    assert response.status_code == 400
    assert "allows at most 100 requests per minute" in response.content.decode()
    assert (await Organisation.objects.aget(pk=ws["org"].pk)).rate_limit_rpm is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("pinned_pool", "frontier@no-such-version", "Select a valid choice"),
        ("region", "mars-north", "Select a valid choice"),
        ("retention_days", "0", "greater than or equal to 1"),
        ("rate_limit_tpm", "-5", "greater than or equal to 1"),
    ],
)
async def test_invalid_policies_are_refused_and_nothing_changes(
    make_user, roomy_user_limits, field, value, message
):
    ws = await workspace(make_user)
    response = await ws["owner"].post(
        "/orgs/acme/policies/", {**POLICY_DEFAULTS, "not_for_training": "on", field: value}
    )
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not (await Organisation.objects.aget(pk=ws["org"].pk)).not_for_training


async def test_a_pool_the_tier_may_not_use_is_not_offered_for_pinning(
    make_user, settings, roomy_user_limits
):
    frontier = next(p for p in settings.CHAT_POOLS if p["name"] == "frontier")
    settings.CHAT_POOLS = [
        *settings.CHAT_POOLS,
        {**frontier, "version": "paid-only", "tiers": ["paid"]},
    ]
    ws = await workspace(make_user)
    page = (await ws["owner"].get("/orgs/acme/policies/")).content.decode()
    assert "frontier@paid-only" not in page and f"frontier@{frontier['version']}" in page
    response = await ws["owner"].post(
        "/orgs/acme/policies/", {**POLICY_DEFAULTS, "pinned_pool": "frontier@paid-only"}
    )
    assert response.status_code == 400


async def test_saving_policies_leaves_the_moderation_policy_alone(make_user, roomy_user_limits):
    ws = await workspace(make_user)
    await Organisation.objects.filter(pk=ws["org"].pk).aupdate(
        blocked_terms=["secret"], moderation_thresholds={"offensive": 0.5}
    )
    await set_policies(ws, retention_days="30")
    org = await Organisation.objects.aget(pk=ws["org"].pk)
    assert (org.retention_days, org.blocked_terms, org.moderation_thresholds) == (
        30,
        ["secret"],
        {"offensive": 0.5},
    )


async def test_the_settings_page_shows_the_organisations_own_limits(make_user, roomy_user_limits):
    ws = await workspace(make_user)
    await set_policies(ws, rate_limit_rpm="7")
    client = AsyncClient()
    await client.aforce_login(ws["mia"])
    page = (await client.get("/settings/")).content.decode()
    acme_row = page.split('data-scope="Acme"')[1].split("</tr>")[0]
    assert '<td class="num">7</td>' in acme_row  # its own RPM, not the tier's 100
