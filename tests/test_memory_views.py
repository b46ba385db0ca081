"""Long-term user memory (issue 7) through its endpoints: the /v1/users/{id}/memory API, the
/settings/memory/ page and the admin.

Real PostgreSQL with pgvector and the real all-MiniLM-L6-v2 embedding model (no doubles).
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client
from django.urls import include, path

from accounts import services as account_services
from conversations.models import Conversation
from memory import selectors, services
from memory.models import UserMemory
from tests.memory_support import FIVE_FACTS, PEANUT_QUESTION, texts_of

pytestmark = pytest.mark.django_db


# The site's routes plus memory's (chatsite/urls.py includes memory.urls too once wired; the
# first match wins, so including it twice changes nothing).
urlpatterns = [path("", include("memory.urls")), path("", include("chatsite.urls"))]


# --- /v1/users/{id}/memory -----------------------------------------------------------------


def bearer(make_user, **fields):
    user = make_user(**fields)
    issued = account_services.api_key_create(user=user, name="tests")
    return Client(headers={"Authorization": f"Bearer {issued.raw}"}), user


def patch(client, user_id, body, content_type="application/json"):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.patch(f"/v1/users/{user_id}/memory", data, content_type=content_type)


@pytest.mark.urls(__name__)
def test_api_patch_adds_and_removes_and_get_lists(make_user):
    client, user = bearer(make_user)
    [old] = services.memory_add(user=user, texts=["I drive a 2012 Volvo estate."])

    response = patch(client, user.pk, {"add": ["I am allergic to peanuts.", "I live in Lisbon."], "remove": [str(old.fact_id)]})

    assert response.status_code == 200
    body = response.json()
    assert body["memory_enabled"] is True
    assert sorted(f["text"] for f in body["facts"]) == ["I am allergic to peanuts.", "I live in Lisbon."]
    assert set(body["facts"][0]) == {"fact_id", "text", "source", "source_conversation_id", "created_at"}
    assert {f["source"] for f in body["facts"]} == {"manual"}
    listed = client.get(f"/v1/users/{user.pk}/memory")
    assert listed.status_code == 200 and listed.json() == body


@pytest.mark.urls(__name__)
def test_api_patch_can_switch_memory_off(make_user):
    client, user = bearer(make_user)

    response = patch(client, user.pk, {"memory_enabled": False})

    assert response.status_code == 200 and response.json()["memory_enabled"] is False
    user.refresh_from_db()
    assert user.memory_enabled is False


@pytest.mark.urls(__name__)
def test_api_another_users_memory_is_404_not_403(make_user):
    client, _user = bearer(make_user)
    victim = make_user()
    services.memory_add(user=victim, texts=["I am allergic to peanuts."])

    for response in (
        client.get(f"/v1/users/{victim.pk}/memory"),
        patch(client, victim.pk, {"add": ["I am evil."]}),
        client.get("/v1/users/999999/memory"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "not_found"
    assert [f.text for f in selectors.memory_list(user=victim)] == ["I am allergic to peanuts."]


@pytest.mark.urls(__name__)
def test_api_removing_another_users_fact_id_leaves_it(make_user):
    client, user = bearer(make_user)
    [theirs] = services.memory_add(user=make_user(), texts=["I am allergic to peanuts."])

    response = patch(client, user.pk, {"remove": [str(theirs.fact_id)]})

    assert response.status_code == 200
    assert UserMemory.objects.filter(pk=theirs.pk).exists()


@pytest.mark.urls(__name__)
@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"add": ["ok"], "colour": "red"}, "colour"),
        ({"add": "I like tea."}, "add"),
        ({"add": [42]}, "add.0"),
        ({"add": [""]}, "empty"),
        ({"add": ["   "]}, "empty"),
        ({"add": ["x" * 301]}, "300 characters"),
        ({"add": [f"fact number {i}" for i in range(51)]}, "add"),
        ({"remove": ["not-a-uuid"]}, "remove.0"),
        ({"remove": [12]}, "remove.0"),
        ({"memory_enabled": "no"}, "memory_enabled"),
        ({}, "Nothing to change"),
        ([], "JSON object"),
        ("{not json", "not valid JSON"),
    ],
)
def test_api_patch_refuses_bad_bodies_with_400(make_user, body, names):
    client, user = bearer(make_user)

    response = patch(client, user.pk, body)

    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request"
    assert names in response.json()["error"]["message"]
    assert UserMemory.objects.filter(user=user).count() == 0


@pytest.mark.urls(__name__)
def test_api_patch_needs_json_and_a_key(make_user):
    client, user = bearer(make_user)

    assert patch(client, user.pk, "add=x", content_type="application/x-www-form-urlencoded").status_code == 415
    assert Client().get(f"/v1/users/{user.pk}/memory").status_code == 401
    assert client.post(f"/v1/users/{user.pk}/memory", "{}", content_type="application/json").status_code == 405


@pytest.mark.urls(__name__)
def test_api_a_bad_addition_does_not_apply_the_removal(make_user):
    client, user = bearer(make_user)
    [fact] = services.memory_add(user=user, texts=["I am allergic to peanuts."])

    response = patch(client, user.pk, {"remove": [str(fact.fact_id)], "add": ["x" * 301]})

    assert response.status_code == 400
    assert UserMemory.objects.filter(pk=fact.pk).exists()


# --- the /settings/memory/ page -------------------------------------------------------------


def signed_in(make_user, **fields):
    user = make_user(**fields)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client, user


def csrf_post(client, url, data):
    token = client.get("/settings/memory/").cookies["csrftoken"].value
    return client.post(url, {**data, "csrfmiddlewaretoken": token})


@pytest.mark.urls(__name__)
def test_page_needs_login():
    response = Client().get("/settings/memory/")

    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


@pytest.mark.urls(__name__)
def test_page_lists_facts_with_their_source(make_user):
    client, user = signed_in(make_user)
    conversation = Conversation.objects.create(owner=user, model="m", region=user.region, title="Trip planning")
    services.memory_add(user=user, texts=["I live in Lisbon."], source="extracted", source_conversation_id=conversation.pk)
    services.memory_add(user=user, texts=["I have a cat."], source="extracted", source_conversation_id=uuid.uuid4())
    services.memory_add(user=user, texts=["I prefer metric units."])

    html = client.get("/settings/memory/").content.decode()

    assert f'href="/c/{conversation.pk}/">Trip planning</a>' in html
    assert "a conversation since deleted" in html
    assert "added by you" in html
    assert html.index("I prefer metric units.") < html.index("I live in Lisbon.")  # newest first


@pytest.mark.urls(__name__)
def test_page_adds_a_fact_by_hand(make_user):
    client, user = signed_in(make_user)

    response = csrf_post(client, "/settings/memory/", {"text": "I prefer metric units."})

    assert response.status_code == 302
    assert [f.text for f in selectors.memory_list(user=user)] == ["I prefer metric units."]
    assert "I prefer metric units." in client.get("/settings/memory/").content.decode()


@pytest.mark.urls(__name__)
def test_page_refuses_an_empty_fact_and_says_a_duplicate_is_known(make_user):
    client, user = signed_in(make_user)
    services.memory_add(user=user, texts=["I prefer metric units."])

    empty = csrf_post(client, "/settings/memory/", {"text": "   "})
    duplicate = csrf_post(client, "/settings/memory/", {"text": "I prefer metric units!"})

    assert empty.status_code == 400 and "must not be empty" in empty.content.decode()
    assert duplicate.status_code == 302
    assert "already remembered" in client.get(duplicate["Location"]).content.decode()
    assert len(selectors.memory_list(user=user)) == 1


@pytest.mark.urls(__name__)
def test_page_without_a_csrf_token_changes_nothing(make_user):
    client, user = signed_in(make_user)

    response = client.post("/settings/memory/", {"text": "I prefer metric units."})

    assert response.status_code == 403
    assert selectors.memory_list(user=user) == []


@pytest.mark.urls(__name__)
def test_page_deletes_one_fact_and_it_is_not_retrieved(make_user):
    client, user = signed_in(make_user)
    facts = services.memory_add(user=user, texts=FIVE_FACTS)
    peanuts = next(f for f in facts if "peanuts" in f.text)

    response = csrf_post(client, f"/settings/memory/{peanuts.fact_id}/delete", {})

    assert response.status_code == 302
    assert len(selectors.memory_list(user=user)) == 4
    assert "peanuts" not in selectors.memory_block(user=user, query=PEANUT_QUESTION)


@pytest.mark.urls(__name__)
def test_page_cannot_delete_another_users_fact(make_user):
    client, _user = signed_in(make_user)
    [theirs] = services.memory_add(user=make_user(), texts=["I am allergic to peanuts."])

    response = csrf_post(client, f"/settings/memory/{theirs.fact_id}/delete", {})

    assert response.status_code == 404
    assert UserMemory.objects.filter(pk=theirs.pk).exists()


@pytest.mark.urls(__name__)
def test_page_deletes_all_only_when_confirmed(make_user):
    client, user = signed_in(make_user)
    services.memory_add(user=user, texts=FIVE_FACTS)

    unconfirmed = csrf_post(client, "/settings/memory/clear", {})
    assert unconfirmed.status_code == 400 and len(selectors.memory_list(user=user)) == 5

    confirmed = csrf_post(client, "/settings/memory/clear", {"confirm": "yes"})
    assert confirmed.status_code == 302 and selectors.memory_list(user=user) == []


@pytest.mark.urls(__name__)
def test_page_switches_memory_off_and_on(make_user):
    client, user = signed_in(make_user)
    services.memory_add(user=user, texts=FIVE_FACTS)

    csrf_post(client, "/settings/memory/toggle", {"enabled": "off"})
    user.refresh_from_db()
    assert user.memory_enabled is False
    assert selectors.memory_search(user=user, query=PEANUT_QUESTION) == []
    assert "Memory is <strong>off</strong>" in client.get("/settings/memory/").content.decode()

    csrf_post(client, "/settings/memory/toggle", {"enabled": "on"})
    user.refresh_from_db()
    assert user.memory_enabled is True
    assert texts_of(selectors.memory_search(user=user, query=PEANUT_QUESTION))[0] == "I am allergic to peanuts."


# --- admin ---------------------------------------------------------------------------------


@pytest.mark.urls(__name__)
def test_admin_finds_facts_by_username_and_hides_the_embedding(make_user, admin_client):
    user = make_user("peanut-person")
    [fact] = services.memory_add(user=user, texts=["I am allergic to peanuts."])

    listing = admin_client.get("/admin/memory/usermemory/", {"q": "peanut-person"})
    change = admin_client.get(f"/admin/memory/usermemory/{fact.pk}/change/")

    assert listing.status_code == 200 and "I am allergic to peanuts." in listing.content.decode()
    assert change.status_code == 200 and "embedding" not in change.content.decode().lower()
