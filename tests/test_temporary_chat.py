"""Temporary chats (issue 18 part 12): the zero-retention path at the user's choice. A switch on
the new-chat page flags the conversation (``Conversation.temporary``); its turns never reach
PostgreSQL and their copies in Redis expire within ``CHAT_ZDR_TTL_S``; it is in no list or
search, never mined for memory, never shared; its page deletes it with a ``pagehide`` beacon, and
otherwise it is deleted ``CHAT_ZDR_TTL_S`` after its last turn. Follows tests/test_zero_retention.py
for what "nothing at rest" means."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ValidationError
from django.test import Client

from conversations import retention, selectors, services
from conversations.models import Conversation, Turn
from memory import extraction, tasks
from sharing import services as sharing_services
from accounts import services as account_services
from tests.api_support import BearerClient
from tests.test_memory_extraction import extract, facts_of, idle_after, seed
from tests.chat_support import HTMX, events_url_of, parse_sse, read_stream, signed_in
from tests.test_zero_retention import redis_copies

def secret() -> str:
    """A message no other test sends (Redis is shared by the tests of a run)."""
    return f"my locker code is {uuid.uuid4().hex[:8]}"
BANNER = "Temporary chat – not saved, not in your history"


async def start_temporary(client, content: str):
    """Send the first message from the new-chat page with the switch on; read the answer to
    its end. Returns (the response to the post, the conversation, the answer's events)."""
    response = await client.post("/chat/turns", {"content": content, "temporary": "1"}, headers=HTMX)
    assert response.status_code == 200, response.content
    events = parse_sse(await read_stream(await client.get(events_url_of(response))))
    conversation = await Conversation.objects.aget(pk=response["HX-Push-Url"].split("/")[2])
    return response, conversation, events


# --- the flag -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_the_switch_makes_a_temporary_chat_that_is_answered_and_stores_no_turn(make_user, engine_double):
    """Given the new-chat page's switch on, when the first message is sent, then the
    conversation is temporary (zero-retention), the answer streams to its end, PostgreSQL holds
    no turn and no title of it, and the page gets the banner with the beacon's URL."""
    engine_double.scripts = [["Noted", "."]]
    client, _ = await signed_in(make_user)
    response, conversation, events = await start_temporary(client, secret())
    assert conversation.temporary
    assert await sync_to_async(selectors.conversation_zero_retention)(conversation)
    assert [d["text"] for n, d, _ in events if n == "token"] == ["Noted", "."]
    assert events[-1][0] == "done"
    assert not await Turn.objects.filter(conversation_id=conversation.pk).aexists()
    assert conversation.title == ""
    html = response.content.decode()
    assert BANNER in html and f'data-temporary-discard="/c/{conversation.pk}/discard"' in html


@pytest.mark.django_db(transaction=True)
async def test_without_the_switch_a_new_chat_is_kept(make_user, engine_double):
    client, _ = await signed_in(make_user)
    response = await client.post("/chat/turns", {"content": "hello"}, headers=HTMX)
    await read_stream(await client.get(events_url_of(response)))  # no answer left running
    conversation = await Conversation.objects.aget(pk=response["HX-Push-Url"].split("/")[2])
    assert not conversation.temporary
    assert "data-temporary-discard" not in response.content.decode()


@pytest.mark.django_db(transaction=True)
async def test_nothing_of_a_temporary_chat_outlives_the_ttl_in_redis(make_user, engine_double):
    """Every Redis key naming the temporary chat or holding its text expires within
    CHAT_ZDR_TTL_S (600 s), as for a zero-retention organisation; nothing is queued."""
    answer = f"answer {uuid.uuid4().hex}"
    engine_double.scripts = [answer.split(" ", 1)]
    client, _ = await signed_in(make_user)
    question = secret()
    _, conversation, _ = await start_temporary(client, question)
    copies = redis_copies(str(conversation.pk), question, answer.split(" ", 1)[1])
    assert copies, "the history for the next turn should be in Redis"
    assert {key: ttl for key, ttl in copies.items() if not 0 < ttl <= 600} == {}


@pytest.mark.django_db
def test_the_page_of_a_temporary_chat_is_marked_and_a_kept_one_is_not(client, make_user):
    user = make_user("sam")
    temporary = services.conversation_create(owner=user, temporary=True)
    kept = services.conversation_create(owner=user, title="Kept")
    client.force_login(user)
    page = client.get(f"/c/{temporary.pk}/").content.decode()
    assert BANNER in page and f'data-temporary-discard="/c/{temporary.pk}/discard"' in page
    assert "<title>Temporary chat" in page
    assert "data-temporary-discard" not in client.get(f"/c/{kept.pk}/").content.decode()


@pytest.mark.django_db
def test_the_new_chat_page_has_the_switch_in_the_composers_form(client, make_user):
    client.force_login(make_user("sam"))
    page = client.get("/").content.decode()
    assert re.search(r'<input type="checkbox" name="temporary" value="1" form="composer"', page)
    assert "data-temporary-preview hidden" in page  # the banner shows once the switch is on


# --- not listed, not mined, not shared ---------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_temporary_chat_is_in_no_list_and_no_search(make_user, engine_double):
    """Not in the sidebar, its search, the /v1 list or the /v1 search, while a kept
    conversation with the same words is."""
    client, user = await signed_in(make_user)
    _, temporary, _ = await start_temporary(client, "tangerine smoothie recipe")
    kept = await sync_to_async(services.conversation_create)(owner=user, title="tangerine smoothie")
    sidebar = (await client.get("/")).content.decode()
    assert f"/c/{kept.pk}/" in sidebar and f"/c/{temporary.pk}/" not in sidebar
    found = (await client.get("/search", {"q": "tangerine"}, headers=HTMX)).content.decode()
    assert f"/c/{kept.pk}/" in found and f"/c/{temporary.pk}/" not in found
    issued = await sync_to_async(account_services.api_key_create)(user=user, name="tests")
    api = BearerClient(issued.raw)
    listed = (await api.get("/v1/conversations")).json()["conversations"]
    searched = (await api.get("/v1/conversations", {"q": "tangerine"})).json()["conversations"]
    assert [c["conversation_id"] for c in listed] == [str(kept.pk)]
    assert [c["conversation_id"] for c in searched] == [str(kept.pk)]


@pytest.mark.django_db
def test_a_temporary_chat_is_never_mined_for_memory(make_user, engine_double, settings):
    """Its owner has memory on, and the chat is idle: extraction refuses it (zero-retention)
    and the sweep does not queue it; no model call, no fact."""
    user = make_user("ada")
    conversation = services.conversation_create(owner=user)
    seed(conversation, "I moved to Lyon last year.")
    Conversation.objects.filter(pk=conversation.pk).update(temporary=True)
    conversation.refresh_from_db()
    assert extract(conversation, idle_after(conversation, settings)).status == "zero_retention"
    assert extraction.memory_sweep(queue=tasks.memory_extract.delay, now=idle_after(conversation, settings)) == []
    assert engine_double.requests == [] and facts_of(user) == []


@pytest.mark.django_db
def test_a_temporary_chat_cannot_be_shared(make_user):
    conversation = services.conversation_create(owner=make_user("sam"), temporary=True)
    with pytest.raises(ValidationError):
        sharing_services.share_link_create(conversation=conversation, user=conversation.owner)


# --- the pagehide beacon ----------------------------------------------------------------------


def beacon_client(user) -> tuple[Client, str]:
    """A client that checks CSRF as a browser's beacon is checked, and the token its page had."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    page = client.get("/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    return client, token


@pytest.mark.django_db(transaction=True)
async def test_the_beacon_deletes_the_temporary_chat_and_its_copies(make_user, engine_double):
    """Given a temporary chat with an answered turn, when its page's beacon arrives (the CSRF
    token in the body), then 204, the conversation is gone and Redis holds none of its text."""
    client, user = await signed_in(make_user)
    question = secret()
    _, conversation, _ = await start_temporary(client, question)
    assert redis_copies(question)
    beacon, token = await sync_to_async(beacon_client)(user)
    response = await sync_to_async(beacon.post)(
        f"/c/{conversation.pk}/discard", {"csrfmiddlewaretoken": token}
    )
    assert response.status_code == 204
    assert not await Conversation.objects.filter(pk=conversation.pk).aexists()
    assert redis_copies(question) == {}


@pytest.mark.django_db
def test_a_beacon_without_the_csrf_token_is_refused(make_user):
    user = make_user("sam")
    conversation = services.conversation_create(owner=user, temporary=True)
    beacon, _ = beacon_client(user)
    assert beacon.post(f"/c/{conversation.pk}/discard").status_code == 403
    assert Conversation.objects.filter(pk=conversation.pk).exists()


@pytest.mark.django_db
def test_the_beacon_is_owner_only(make_user):
    """Another user's beacon gets 404 (the id reveals nothing) and the chat stays."""
    conversation = services.conversation_create(owner=make_user("ann"), temporary=True)
    beacon, token = beacon_client(make_user("bob"))
    response = beacon.post(f"/c/{conversation.pk}/discard", {"csrfmiddlewaretoken": token})
    assert response.status_code == 404
    assert Conversation.objects.filter(pk=conversation.pk).exists()


@pytest.mark.django_db
def test_the_beacon_never_deletes_a_kept_conversation(make_user):
    user = make_user("sam")
    conversation = services.conversation_create(owner=user)
    beacon, token = beacon_client(user)
    response = beacon.post(f"/c/{conversation.pk}/discard", {"csrfmiddlewaretoken": token})
    assert response.status_code == 400 and "temporary" in response.content.decode()
    assert Conversation.objects.filter(pk=conversation.pk).exists()


@pytest.mark.django_db
def test_the_beacon_route_takes_only_post(client, make_user):
    user = make_user("sam")
    conversation = services.conversation_create(owner=user, temporary=True)
    client.force_login(user)
    assert client.get(f"/c/{conversation.pk}/discard").status_code == 405
    assert Conversation.objects.filter(pk=conversation.pk).exists()


# --- expiry ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_temporary_chat_is_deleted_chat_zdr_ttl_s_after_its_last_turn(make_user, settings):
    """Given CHAT_ZDR_TTL_S = 600, a temporary chat stays until 600 s after its last turn and
    is deleted after; a kept conversation as old stays."""
    settings.CHAT_ZDR_TTL_S = 600
    user = make_user("sam")
    temporary = services.conversation_create(owner=user, temporary=True)
    kept = services.conversation_create(owner=user)
    last = Conversation.objects.get(pk=temporary.pk).last_turn_at
    assert retention.temporary_chats_purge_expired(now=last + timedelta(seconds=590)) == 0
    assert Conversation.objects.filter(pk=temporary.pk).exists()
    assert retention.temporary_chats_purge_expired(now=last + timedelta(seconds=610)) == 1
    assert not Conversation.objects.filter(pk=temporary.pk).exists()
    assert Conversation.objects.filter(pk=kept.pk).exists()


def test_the_temporary_chat_purge_runs_on_the_beat_at_least_every_minute(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["conversations.temporary_chats_purge_expired"]
    assert entry["task"] == "conversations.temporary_chats_purge_expired"
    assert float(entry["schedule"]) <= 60
