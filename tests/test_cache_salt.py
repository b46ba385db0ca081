"""Tenants isolated in the engine's prefix cache (issue 27 part 1; DESIGN.md, "Tenants and the
engine's caches"; vLLM CVE-2025-46570 and its ``cache_salt``): every engine request carries a
salt derived on the server from its tenant, on every engine path and from every entrypoint; a
client may not choose it; a user's own requests (turns, jobs, the memory warm-up) share theirs;
an organisation that chose to share one cache gives its members one salt.

The scripted engine double records the options of each request (``cache_salt`` among them);
tests/integration/test_cache_salt_real.py checks the isolation itself with the real engine.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from asgiref.sync import sync_to_async
from django.test import Client

from accounts.callers import user_cache_salt
from accounts.models import Membership, Organisation
from accounts.services import service_api_key, service_user
from conversations import services as conversation_services
from conversations import summaries
from gateway.gate import Caller
from gateway.tenancy import cache_salt_for
from inference.engine import GenerationOptions, VllmEngine
from tests.api_support import BearerClient, assert_error, post_json
from tests.test_admission_entrypoints import ENTRYPOINTS, person, send
from tests.test_memory_block import FACTS, add_pinned, endpoint, words  # noqa: F401 - fixtures
from tests.test_remote import engine as remote_engine
from tests.test_remote import server, sse  # noqa: F401 - the fixture
from tests.test_summaries import in_process_endpoint, seed, small_context  # noqa: F401 - fixtures

# --- the salt ----------------------------------------------------------------------------------


def test_a_users_salt_is_the_same_every_time_and_differs_from_another_users():
    ann, ann_again, bob = (cache_salt_for(Caller(user_id=u, tier="free")) for u in (1, 1, 2))
    assert ann == ann_again != bob
    assert re.fullmatch(r"[0-9a-f]{64}", ann)  # within vLLM's 128 characters, none it refuses


def test_the_salt_is_keyed_by_the_secret_key(settings):
    """Nobody without the deployment's secret can compute a tenant's salt (a plain hash of the
    user id could be)."""
    before = cache_salt_for(Caller(user_id=1, tier="free"))
    settings.SECRET_KEY = "another-secret-key-" + "x" * 40
    assert cache_salt_for(Caller(user_id=1, tier="free")) != before


def test_an_organisation_sharing_its_cache_gives_its_members_one_salt_and_otherwise_none():
    sharing = [Caller(user_id=u, tier="paid", org_id=7, org_shares_cache=True) for u in (1, 2)]
    private = [Caller(user_id=u, tier="paid", org_id=7) for u in (1, 2)]
    assert cache_salt_for(sharing[0]) == cache_salt_for(sharing[1])
    assert cache_salt_for(private[0]) != cache_salt_for(private[1])
    assert cache_salt_for(private[0]) == cache_salt_for(Caller(user_id=1, tier="paid"))  # the user's own
    assert cache_salt_for(sharing[0]) != cache_salt_for(private[0])


# --- every engine path -------------------------------------------------------------------------


class FakeAsyncLLM:
    """vLLM's AsyncLLM as VllmEngine.generate uses it: records each prompt, answers one token."""

    errored = False

    def __init__(self):
        self.prompts: list[dict] = []

    async def generate(self, prompt, params, request_id, priority=0):
        self.prompts.append(prompt)
        yield SimpleNamespace(
            outputs=[SimpleNamespace(text="hi", token_ids=[7], finish_reason="stop")],
            finished=True, num_cached_tokens=0,
        )  # fmt: skip

    async def abort(self, request_id):
        pass


@pytest.mark.parametrize(("salt", "prompt"), [("s4lt", {"prompt_token_ids": [1, 2, 3], "cache_salt": "s4lt"}),
                                              ("", {"prompt_token_ids": [1, 2, 3]})])  # fmt: skip
async def test_the_in_process_engine_puts_the_salt_in_vllms_prompt(salt, prompt):
    engine = VllmEngine(model_path="", max_model_len=64, kv_cache_bytes=0, max_num_seqs=1)
    engine._llm = FakeAsyncLLM()
    options = GenerationOptions(max_tokens=1, cache_salt=salt)
    assert [d.text async for d in engine.generate([1, 2, 3], options, "r1")] == ["hi"]
    assert engine._llm.prompts == [prompt]


@pytest.mark.parametrize("chatsite", [False, True])
async def test_a_remote_engine_sends_the_salt_to_vllm_serve_and_to_an_engine_process(server, chatsite):  # noqa: F811
    server.reply = sse({"choices": [{"text": "hi", "finish_reason": "stop"}]})
    remote = remote_engine()
    remote.chatsite = chatsite
    options = GenerationOptions(max_tokens=2, cache_salt="s4lt", tier="paid")
    [_ async for _ in remote.generate([1, 2], options, "r1")]
    (body,) = server.bodies
    assert body["cache_salt"] == "s4lt"
    assert ("admission" in body) is chatsite  # vllm serve gets no field of ours


# --- every entrypoint --------------------------------------------------------------------------


def salts(engine) -> list[str]:
    return [options.cache_salt for _, options, _ in engine.requests]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("entrypoint", [*ENTRYPOINTS, "completions"])
async def test_every_entrypoint_salts_with_the_users_own_tenant(make_user, engine_double, entrypoint):
    """Two requests of one user (two conversations on the turn paths) share a salt; another
    user's differs; both are the server's derivation, nothing the client sent."""
    ann, bob = await person(make_user), await person(make_user)
    for who in (ann, bob, ann):
        if entrypoint == "completions":
            response = await post_json(who.api, "/v1/completions", {"model": "mini", "prompt": "Say hi"})
            assert response.status_code == 200, response.content
        else:
            assert (await send(entrypoint, who, "hello there")).status == 200
    ann_salt, bob_salt = [await sync_to_async(user_cache_salt)(p.user) for p in (ann, bob)]
    assert salts(engine_double) == [ann_salt, bob_salt, ann_salt]
    assert ann_salt != bob_salt


@pytest.mark.django_db(transaction=True)
async def test_an_organisation_that_opts_in_shares_one_salt_among_its_members_until_it_opts_out(
    make_user, engine_double
):
    org = await Organisation.objects.acreate(name="Acme", slug="acme")
    members = [await person(make_user, tier="paid") for _ in range(2)]
    for member in members:
        await Membership.objects.acreate(organisation=org, user=member.user)

    async def ask_all() -> list[str]:
        before = len(engine_double.requests)
        for member in members:
            assert (await send("turns", member, "hello there")).status == 200
        return salts(engine_double)[before:]

    private = await ask_all()
    await Organisation.objects.filter(pk=org.pk).aupdate(share_prefix_cache=True)
    shared = await ask_all()
    await Organisation.objects.filter(pk=org.pk).aupdate(share_prefix_cache=False)
    assert private[0] != private[1]
    assert shared[0] == shared[1] and shared[0] not in private
    assert await ask_all() == private


@pytest.mark.django_db(transaction=True)
async def test_the_owner_toggles_sharing_on_the_policies_page(make_user):
    owner = await person(make_user)
    org = await Organisation.objects.acreate(name="Acme", slug="acme", region="eu-west")
    await Membership.objects.acreate(organisation=org, user=owner.user, role="owner")
    page = await owner.page.get("/orgs/acme/policies/")
    assert 'name="share_prefix_cache"' in page.content.decode()
    form = {"region": "eu-west", "pinned_pool": "", "share_prefix_cache": "on"}
    assert (await owner.page.post("/orgs/acme/policies/", form)).status_code == 303
    assert (await Organisation.objects.aget(pk=org.pk)).share_prefix_cache is True
    del form["share_prefix_cache"]
    assert (await owner.page.post("/orgs/acme/policies/", form)).status_code == 303
    assert (await Organisation.objects.aget(pk=org.pk)).share_prefix_cache is False


# --- a client may not choose its salt ----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("url", "body"),
    [
        ("/v1/chat/completions", {"model": "mini", "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"model": "mini", "prompt": "hi"}),
    ],
)
async def test_a_client_sending_a_cache_salt_is_refused_403(make_user, engine_double, url, body):
    victim, mallory = await person(make_user), await person(make_user)
    stolen = await sync_to_async(user_cache_salt)(victim.user)
    response = await post_json(mallory.api, url, {**body, "cache_salt": stolen})
    assert_error(response, 403, "permission_denied")
    assert "cache_salt" in response.json()["error"]["message"]
    assert engine_double.requests == []


@pytest.mark.django_db(transaction=True)
async def test_the_service_credential_brings_the_salt_of_the_user_it_acts_for(make_user, engine_double):
    """A forwarded turn or a job on a user's data: the engine gets exactly the salt sent."""
    job = BearerClient(await sync_to_async(service_api_key)())
    body = {"model": "mini", "prompt": [1, 2, 3], "max_tokens": 1, "cache_salt": "a" * 64}
    assert (await post_json(job, "/v1/completions", body)).status_code == 200
    del body["cache_salt"]
    assert (await post_json(job, "/v1/completions", body)).status_code == 200
    service_salt = await sync_to_async(lambda: user_cache_salt(service_user()))()
    assert salts(engine_double) == ["a" * 64, service_salt]


# --- background jobs use the salt of the user whose data it is ----------------------------------


@pytest.mark.django_db(transaction=True)
async def test_the_memory_warm_up_fills_the_cache_under_the_salt_the_users_turns_carry(
    make_user, words, endpoint  # noqa: F811
):
    who = await person(make_user)
    await sync_to_async(add_pinned)(who.user, FACTS)  # the block carries pinned facts (issue 28)
    assert (await send("turns", who, "Name a prime number.")).status == 200
    (warm_up, warm_options), (turn, turn_options) = [
        (ids, options) for ids, options, _ in words.requests
    ]  # fmt: skip
    assert warm_options.max_tokens == 1 and turn[: len(warm_up)] == warm_up
    assert warm_options.cache_salt == turn_options.cache_salt == await sync_to_async(user_cache_salt)(who.user)


@pytest.mark.django_db(transaction=True)
def test_a_summary_is_written_under_the_conversations_owner_salt(
    make_user, engine_double, small_context, in_process_endpoint  # noqa: F811
):
    owner = make_user("sum-owner")
    conversation = conversation_services.conversation_create(owner=owner)
    seed(conversation, 6)
    engine_double.scripts = [["Summary one."], ["Summary two."], ["Summary three."]]
    assert summaries.summary_update(conversation_id=conversation.pk)
    assert engine_double.requests
    assert set(salts(engine_double)) == {user_cache_salt(owner)}


@pytest.mark.django_db
def test_staff_toggle_sharing_in_the_admin(make_user):
    org = Organisation.objects.create(name="Acme", slug="acme")
    staff = Client()
    staff.force_login(make_user("root", is_staff=True, is_superuser=True))
    change = staff.get(f"/admin/accounts/organisation/{org.pk}/change/").content.decode()
    assert 'name="share_prefix_cache"' in change
    listed = staff.get("/admin/accounts/organisation/?share_prefix_cache__exact=1").content.decode()
    assert "Acme" not in listed  # off by default: the filter for "on" lists nobody
