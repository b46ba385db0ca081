"""The /v1 API with the scripted engine double: auth, conversations (shapes, pagination, bad
input), JSON 404s and the turn tree (?path=). Turns: test_api_turns.py; completions:
test_api_completions.py."""

from __future__ import annotations

import uuid

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from accounts import services as account_services
from conversations import services
from conversations.models import Conversation, Turn
from tests.api_support import (
    BearerClient,
    api_client,
    assert_error,
    branched_conversation,
    new_conversation,
    post_json,
)
from tests.chat_support import read_stream

pytestmark = pytest.mark.django_db(transaction=True)


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


# --- JSON 404s --------------------------------------------------------------------------------


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


# --- the turn tree (issue 18, part 5) -----------------------------------------------------------


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
