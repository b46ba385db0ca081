"""Full-text search over one's own conversations (titles and turn text): the selector, its GIN
index, ``GET /v1/conversations?q=`` and the sidebar's search box."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import ValidationError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from conversations import search_selectors, services
from conversations.models import Conversation
from tests.api_support import api_client, assert_error

HTMX = {"HX-Request": "true"}


def conversation_with(user, title: str, *messages: str) -> Conversation:
    conversation = services.conversation_create(owner=user, title=title)
    for message in messages:
        services.turn_append_user(conversation=conversation, content=message)
    return conversation


def found(user, q: str, limit: int = 20) -> list[str]:
    return [c.title for c in search_selectors.conversation_search(user=user, q=q, limit=limit)]


# --- the selector ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_conversation_is_found_by_the_text_of_its_turns(make_user):
    alice = make_user()
    conversation_with(alice, "Kitchen", "How long should sourdough proof overnight?")
    conversation_with(alice, "Garden", "When do I plant tulip bulbs?")

    assert found(alice, "sourdough") == ["Kitchen"]


@pytest.mark.django_db
def test_words_match_in_any_form_and_quoted_phrases_match_in_order(make_user):
    """English stemming ("baking breads" finds "bake bread"); web-search syntax: a "quoted
    phrase" needs its words adjacent, ``-word`` excludes."""
    alice = make_user()
    conversation_with(alice, "One", "I bake bread on Sundays")
    conversation_with(alice, "Two", "bread that I bake with rye")

    assert sorted(found(alice, "baking breads")) == ["One", "Two"]
    assert found(alice, '"bake bread"') == ["One"]
    assert found(alice, "bread -rye") == ["One"]


@pytest.mark.django_db
def test_titles_match_by_words_and_as_partly_typed(make_user):
    alice = make_user()
    conversation_with(alice, "Kubernetes ingress notes", "unrelated text")

    assert found(alice, "ingress") == ["Kubernetes ingress notes"]
    assert found(alice, "kuber") == ["Kubernetes ingress notes"]
    assert found(alice, "helm") == []


@pytest.mark.django_db
def test_another_users_matching_conversation_is_never_found(make_user):
    """Only the caller's conversations are searched, titles and turns alike."""
    alice, mallory = make_user(), make_user()
    conversation_with(mallory, "secret plans", "the launch codes are zebra")
    conversation_with(alice, "zebra facts", "stripes")

    assert found(alice, "zebra") == ["zebra facts"]
    assert found(alice, "launch codes") == []
    assert found(alice, "secret") == []


@pytest.mark.django_db
def test_matches_come_most_recently_active_first_up_to_the_limit(make_user):
    alice = make_user()
    for name in ("first", "second", "third"):
        conversation_with(alice, name, "about llamas")

    assert found(alice, "llama", limit=2) == ["third", "second"]


@pytest.mark.django_db
def test_a_blank_query_matches_nothing_and_an_over_long_one_is_refused(make_user):
    alice = make_user()
    conversation_with(alice, "anything", "text")

    assert found(alice, "   ") == []
    assert found(alice, "x" * 200) == []  # at the limit: a query, no match
    with pytest.raises(ValidationError) as refused:
        search_selectors.conversation_search(user=alice, q="x" * 201, limit=5)
    assert refused.value.code == "too_long"


@pytest.mark.django_db
def test_the_turn_text_match_can_use_the_gin_index_on_every_partition(make_user):
    """The search's SQL uses the expression the GIN index turn_content_fts is built on (else
    every search would compute to_tsvector over all of the user's turns): with scans that
    cannot use it made prohibitively expensive, the plan scans partitions of that index."""
    alice = make_user()
    conversation_with(alice, "t", "sourdough")
    with CaptureQueriesContext(connection) as queries:
        search_selectors.conversation_search(user=alice, q="sourdough", limit=5)
    (sql,) = [q["sql"] for q in queries.captured_queries if "websearch_to_tsquery" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'turn_content_fts'::regclass"
        )
        fts_indexes = {name for (name,) in cursor.fetchall()}
        # Only a bitmap scan with an index condition remains affordable for the turns; a
        # btree has none for the text match, so only the GIN index can serve it.
        for scan in ("seqscan", "indexscan", "indexonlyscan", "nestloop"):
            cursor.execute(f"SET LOCAL enable_{scan} = off")
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
        (plan,) = cursor.fetchone()[0]

    def index_names(node: dict) -> set[str]:
        names = {node["Index Name"]} if "Index Name" in node else set()
        for child in node.get("Plans", []):
            names |= index_names(child)
        return names

    assert fts_indexes  # one per partition
    assert index_names(plan["Plan"]) & fts_indexes


# --- GET /v1/conversations?q= ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_v1_search_lists_only_the_callers_matching_conversations(make_user):
    client, alice = await api_client(make_user, "alice-search")
    bob = await sync_to_async(make_user)("bob-search")
    mine = await sync_to_async(conversation_with)(alice, "Trip", "Train times to Lisbon")
    await sync_to_async(conversation_with)(alice, "Other", "nothing relevant")
    await sync_to_async(conversation_with)(bob, "Bob's trip", "Lisbon hotels")

    response = await client.get("/v1/conversations", {"q": "lisbon"})

    assert response.status_code == 200, response.content
    body = response.json()
    assert [c["conversation_id"] for c in body["conversations"]] == [str(mine.pk)]
    assert body["next_cursor"] is None


@pytest.mark.django_db(transaction=True)
async def test_v1_search_refuses_an_over_long_query_with_400_json(make_user):
    client, _ = await api_client(make_user, "alice-long")

    assert_error(await client.get("/v1/conversations", {"q": "a" * 201}), 400, "invalid_request")
    assert_error(await client.get("/v1/conversations", {"q": "a\x00b"}), 400, "invalid_request")


@pytest.mark.django_db(transaction=True)
async def test_v1_search_refuses_a_cursor_with_400_json(make_user):
    """Search results come in one page; a ``before`` cursor with ``q`` is a client error."""
    client, alice = await api_client(make_user, "alice-cursor")
    await sync_to_async(conversation_with)(alice, "a", "words")
    listing = (await client.get("/v1/conversations", {"limit": 1})).json()
    await sync_to_async(conversation_with)(alice, "b", "words")
    cursor = (await client.get("/v1/conversations", {"limit": 1})).json()["next_cursor"]
    assert cursor and listing

    response = await client.get("/v1/conversations", {"q": "words", "before": cursor})

    assert_error(response, 400, "invalid_request")


# --- the sidebar -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_chat_page_has_a_search_box_that_swaps_the_conversation_list(make_user):
    client = Client()
    client.force_login(make_user())

    html = client.get("/").content.decode()

    assert 'type="search" name="q"' in html
    assert 'hx-get="/search"' in html
    assert 'hx-target="#conversation-results"' in html
    assert '<div id="conversation-results"' in html


@pytest.mark.django_db
def test_sidebar_search_returns_the_matching_list_with_titles_escaped(make_user):
    """PF-X1: a hostile title in a search result is text. Another user's match is absent."""
    alice, mallory = make_user(), make_user()
    hostile = conversation_with(alice, '<img src=x onerror="alert(1)"> pancakes', "batter")
    conversation_with(alice, "waffles", "irons")
    conversation_with(mallory, "mallory pancakes", "batter")
    client = Client()
    client.force_login(alice)

    response = client.get("/search", {"q": "pancakes"}, headers=HTMX)

    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<ul class="conversation-list">')
    assert f"/c/{hostile.pk}/" in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt; pancakes" in html
    assert "<img" not in html
    assert "waffles" not in html
    assert "mallory" not in html


@pytest.mark.django_db
def test_sidebar_search_with_no_match_says_so_and_blank_lists_everything(make_user):
    alice = make_user()
    conversation_with(alice, "waffles", "irons")
    client = Client()
    client.force_login(alice)

    assert "No conversation matches." in client.get("/search", {"q": "zzz"}, headers=HTMX).content.decode()
    assert "waffles" in client.get("/search", {"q": " "}, headers=HTMX).content.decode()


@pytest.mark.django_db
def test_sidebar_search_without_htmx_renders_the_page_with_the_filtered_sidebar(make_user):
    alice = make_user()
    conversation_with(alice, "waffles", "irons")
    conversation_with(alice, "pancakes", "batter")
    client = Client()
    client.force_login(alice)

    html = client.get("/search", {"q": "batter"}).content.decode()

    assert "<!doctype html>" in html
    assert "pancakes" in html and "waffles" not in html
    assert 'value="batter"' in html


@pytest.mark.django_db
def test_sidebar_search_refuses_an_over_long_query_with_400_and_a_message(make_user):
    client = Client()
    client.force_login(make_user())

    response = client.get("/search", {"q": "a" * 201}, headers=HTMX)

    assert response.status_code == 400
    assert "at most 200 characters" in response.content.decode()


@pytest.mark.django_db
def test_search_is_for_signed_in_users_only():
    response = Client().get("/search", {"q": "anything"})
    assert response.status_code == 302
    assert "/accounts/login/" in response["Location"]


def test_search_limits_are_the_documented_ones():
    from api.openapi import build_document

    (q,) = [
        p for p in build_document()["paths"]["/v1/conversations"]["get"]["parameters"]
        if p["name"] == "q"
    ]  # fmt: skip
    assert q["schema"]["maxLength"] == search_selectors.SEARCH_MAX_CHARS == 200
