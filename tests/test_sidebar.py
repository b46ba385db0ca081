"""The sidebar (issue 29 item 8): date groups (conversations/sidebar.py, a pure function),
pinned chats (``POST /c/<id>/pin``) and search snippets with the match in <mark>."""

from __future__ import annotations

import re
from types import SimpleNamespace
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.test import Client

from conversations import chat_context, sidebar
from conversations.models import Conversation
from tests.test_search import conversation_with

HTMX = {"HX-Request": "true"}
NOW = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def chat(title: str, last_turn_at: datetime, pinned_at: datetime | None = None) -> Conversation:
    """An unsaved conversation: the grouping reads only its dates."""
    return Conversation(title=title, last_turn_at=last_turn_at, pinned_at=pinned_at)


def grouped(conversations, now=NOW, tz=UTC) -> list[tuple[str, list[str]]]:
    return [(g.label, [c.title for c in g.conversations]) for g in sidebar.sidebar_groups(conversations, now=now, tz=tz)]


def at(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


# --- date groups (pure) ----------------------------------------------------------------------


def test_groups_follow_the_calendar_day_boundaries():
    """Given chats last active at each side of every boundary (midnight today, yesterday, 7 and
    8 days ago, 30 and 31 days ago, earlier months and a year ago), when grouped at 10:00 on
    20 November 2026 (UTC), then each is in its group, the groups in order, newest month first."""
    chats = [
        chat("now", NOW),
        chat("today midnight", at(2026, 11, 20, 0, 0)),
        chat("yesterday late", at(2026, 11, 19, 23, 59, 59)),
        chat("yesterday midnight", at(2026, 11, 19, 0, 0)),
        chat("2 days", at(2026, 11, 18, 23, 0)),
        chat("7 days", at(2026, 11, 13, 0, 0)),
        chat("8 days", at(2026, 11, 12, 23, 59)),
        chat("30 days", at(2026, 10, 21, 0, 0)),
        chat("31 days", at(2026, 10, 20, 23, 0)),
        chat("september", at(2026, 9, 2, 12, 0)),
        chat("last november", at(2025, 11, 30, 12, 0)),
    ]

    assert grouped(chats) == [
        ("Today", ["now", "today midnight"]),
        ("Yesterday", ["yesterday late", "yesterday midnight"]),
        ("Previous 7 days", ["2 days", "7 days"]),
        ("Previous 30 days", ["8 days", "30 days"]),
        ("October 2026", ["31 days"]),
        ("September 2026", ["september"]),
        ("November 2025", ["last november"]),
    ]


def test_the_day_is_the_users_day_in_their_time_zone():
    """Given a chat last active at 23:30 UTC on 19 November, at 00:30 UTC on the 20th it is
    "Yesterday" in UTC, but "Today" in Auckland (UTC+13: both are the 20th there) and in Los
    Angeles (UTC-8: both are the 19th there)."""
    now = at(2026, 11, 20, 0, 30)
    chats = [chat("late", at(2026, 11, 19, 23, 30))]

    assert grouped(chats, now, UTC) == [("Yesterday", ["late"])]
    assert grouped(chats, now, ZoneInfo("Pacific/Auckland")) == [("Today", ["late"])]
    assert grouped(chats, now, ZoneInfo("America/Los_Angeles")) == [("Today", ["late"])]


def test_a_chat_dated_after_now_counts_as_today():
    assert grouped([chat("ahead", NOW + timedelta(hours=3))]) == [("Today", ["ahead"])]


def test_pinned_chats_come_first_latest_pinned_first_whatever_their_date():
    """Given two pinned chats (one old, one from today) and an unpinned one, the Pinned group
    comes first with the one pinned last on top, and a pinned chat is in no date group."""
    chats = [
        chat("today", NOW),
        chat("pinned today, first", NOW, pinned_at=at(2026, 11, 1)),
        chat("pinned old, last", at(2024, 1, 5), pinned_at=at(2026, 11, 19)),
    ]

    assert grouped(chats) == [
        ("Pinned", ["pinned old, last", "pinned today, first"]),
        ("Today", ["today"]),
    ]


def test_grouping_refuses_a_naive_now():
    with pytest.raises(ValueError):
        sidebar.sidebar_groups([], now=datetime(2026, 11, 20), tz=UTC)


@pytest.mark.parametrize("name", [None, "", "Not/A_Zone", "../../etc/passwd", "Europe/Berlin;x=1", "a" * 70])
def test_an_unknown_or_malformed_time_zone_falls_back_to_the_sites(name):
    assert sidebar.time_zone_from(name, "UTC") == ZoneInfo("UTC")


def test_a_known_time_zone_is_used():
    assert sidebar.time_zone_from("Pacific/Auckland", "UTC") == ZoneInfo("Pacific/Auckland")


# --- snippets (pure) ---------------------------------------------------------------------------


def test_a_snippet_is_escaped_and_only_the_matches_are_marked():
    marked = f'<img src=x onerror="alert(1)"> {sidebar.MATCH_START}pancakes{sidebar.MATCH_STOP} & <b>'

    html = sidebar.snippet_html(marked)

    assert html == '&lt;img src=x onerror=&quot;alert(1)&quot;&gt; <mark>pancakes</mark> &amp; &lt;b&gt;'


def test_stray_markers_never_leave_an_unclosed_mark():
    s, e = sidebar.MATCH_START, sidebar.MATCH_STOP
    assert sidebar.snippet_html(f"a{e}b{s}c") == "abc"
    assert sidebar.snippet_html(f"{s}x{e}{s}{e}y") == "<mark>x</mark>y"


def test_a_substring_snippet_centres_the_match_and_escapes_it():
    text = "x" * 100 + " <Pancakes> " + "y" * 100

    html = sidebar.substring_snippet(text, "pancakes", width=30)

    assert "&lt;<mark>Pancakes</mark>&gt;" in html
    assert html.startswith("…") and html.endswith("…")
    assert len(html) < 80


# --- pinning over HTTP -------------------------------------------------------------------------


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def sidebar_titles(html: str) -> list[str]:
    return re.findall(r'<span class="row-title">([^<]*)</span>', html)


def group_labels(html: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", h).strip() for h in re.findall(r'<h2 class="group-heading"[^>]*>(.*?)</h2>', html)]


@pytest.mark.django_db
def test_pin_toggles_and_the_pinned_chat_is_listed_first_after_a_reload(make_user):
    """Given two chats (the older one below), when the older one is pinned over htmx, then the
    answer is the sidebar fragment with a Pinned group holding it first and its menu saying
    Unpin; a reload of the page lists it first too; pinned again, it is unpinned and back in
    its date group below the newer one."""
    alice = make_user()
    older = conversation_with(alice, "Older", "hello")
    conversation_with(alice, "Newer", "hello")
    Conversation.objects.filter(pk=older.pk).update(last_turn_at=NOW - timedelta(days=400))
    client = signed_in(alice)
    assert sidebar_titles(client.get("/").content.decode()) == ["Newer", "Older"]

    response = client.post(f"/c/{older.pk}/pin", headers=HTMX)

    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<form class="search"')  # the sidebar fragment
    assert group_labels(html)[0] == "Pinned"
    assert sidebar_titles(html) == ["Older", "Newer"]
    assert ">Unpin</button>" in html
    older.refresh_from_db()
    assert older.pinned_at is not None
    page = client.get("/").content.decode()
    assert group_labels(page)[0] == "Pinned" and sidebar_titles(page) == ["Older", "Newer"]

    html = client.post(f"/c/{older.pk}/pin", headers=HTMX).content.decode()

    assert "Pinned" not in group_labels(html)
    assert sidebar_titles(html) == ["Newer", "Older"]
    older.refresh_from_db()
    assert older.pinned_at is None


@pytest.mark.django_db
def test_pin_without_htmx_redirects_to_the_conversation(make_user):
    alice = make_user()
    conversation = conversation_with(alice, "Mine")

    response = signed_in(alice).post(f"/c/{conversation.pk}/pin")

    assert response.status_code == 302 and response["Location"] == f"/c/{conversation.pk}/"


@pytest.mark.django_db
def test_pin_is_404_for_another_users_conversation_and_changes_nothing(make_user):
    alice, mallory = make_user(), make_user()
    conversation = conversation_with(alice, "Alice's")

    response = signed_in(mallory).post(f"/c/{conversation.pk}/pin", headers=HTMX)

    assert response.status_code == 404
    conversation.refresh_from_db()
    assert conversation.pinned_at is None


@pytest.mark.django_db
def test_pin_is_405_for_get(make_user):
    alice = make_user()
    conversation = conversation_with(alice, "Mine")

    response = signed_in(alice).get(f"/c/{conversation.pk}/pin")

    assert response.status_code == 405
    conversation.refresh_from_db()
    assert conversation.pinned_at is None


@pytest.mark.django_db
def test_pin_needs_the_csrf_token(make_user):
    alice = make_user()
    conversation = conversation_with(alice, "Mine")
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)

    assert client.post(f"/c/{conversation.pk}/pin").status_code == 403
    conversation.refresh_from_db()
    assert conversation.pinned_at is None


@pytest.mark.django_db
def test_the_page_groups_by_the_browsers_time_zone_cookie(make_user, monkeypatch):
    """Given a chat last active at 23:30 UTC on 19 November, the page rendered at 00:30 UTC
    on the 20th lists it under Yesterday without a ``tz`` cookie (the site's UTC) and under
    Today with the cookie of Auckland (UTC+13), where both are the 20th."""
    alice = make_user()
    conversation = conversation_with(alice, "Late", "hello")
    Conversation.objects.filter(pk=conversation.pk).update(last_turn_at=at(2026, 11, 19, 23, 30))
    monkeypatch.setattr(chat_context, "timezone", SimpleNamespace(now=lambda: at(2026, 11, 20, 0, 30)))
    client = signed_in(alice)

    assert group_labels(client.get("/").content.decode()) == ["Yesterday"]
    client.cookies["tz"] = "Pacific/Auckland"
    assert group_labels(client.get("/").content.decode()) == ["Today"]


# --- search snippets over HTTP -----------------------------------------------------------------


@pytest.mark.django_db
def test_search_results_show_an_escaped_snippet_with_the_match_marked(make_user):
    """Given a chat whose message holds HTML and the word searched for, when the sidebar
    search finds it, then its row has a snippet with the match in <mark> and the HTML as text:
    no tag of the user's reaches the page."""
    alice = make_user()
    conversation_with(alice, "Breakfast", 'Try <script>alert("x")</script> my pancakes recipe <img src=x onerror=alert(1)>')

    html = signed_in(alice).get("/search", {"q": "pancakes"}, headers=HTMX).content.decode()

    snippet = re.search(r'<span class="row-snippet">(.*?)</span>', html).group(1)
    assert "<mark>pancakes</mark>" in snippet
    assert "&lt;img src=x" in snippet  # ts_headline quotes it raw; the page escapes it
    assert "<script" not in html and "<img" not in html


@pytest.mark.django_db
def test_a_title_match_is_marked_in_the_title(make_user):
    alice = make_user()
    conversation_with(alice, "Trip <to> Oslo", "hello")

    html = signed_in(alice).get("/search", {"q": "osl"}, headers=HTMX).content.decode()

    assert sidebar_titles(html) == []  # the title holds a <mark>
    assert 'Trip &lt;to&gt; <mark>Osl</mark>o' in html


@pytest.mark.django_db(transaction=True)
def test_deleting_another_chat_from_its_row_keeps_the_open_chat(make_user):
    """Given chat A open, when chat B is deleted from its sidebar row, then the answer is the
    refreshed sidebar for #sidebar (A still marked current, B gone), not a redirect to a new
    chat; deleting the open chat itself still goes to a new chat."""
    alice = make_user()
    open_chat = conversation_with(alice, "Open one", "hello")
    other = conversation_with(alice, "Other one", "hello")
    client = signed_in(alice)
    here = {**HTMX, "HX-Current-URL": f"http://testserver/c/{open_chat.pk}/"}

    response = client.post(f"/c/{other.pk}/delete", headers=here)

    assert response.status_code == 200 and "HX-Redirect" not in response
    assert response["HX-Retarget"] == "#sidebar" and response["HX-Reswap"] == "innerHTML"
    assert sidebar_titles(response.content.decode()) == ["Open one"]
    assert 'class="conversation-row current' in response.content.decode()
    assert not Conversation.objects.filter(pk=other.pk).exists()

    itself = client.post(f"/c/{open_chat.pk}/delete", headers=here)

    assert itself.status_code == 204 and itself["HX-Redirect"] == "/"


@pytest.mark.django_db
def test_renaming_the_open_chat_from_its_row_updates_the_header_title_box(make_user):
    """Renamed from its own sidebar row, the open chat's header title box comes back out of band
    with the new title (and the tab's title); renaming another chat's row sends neither."""
    alice = make_user()
    open_chat = conversation_with(alice, "Old name", "hello")
    other = conversation_with(alice, "Other", "hello")
    client = signed_in(alice)
    here = {**HTMX, "HX-Current-URL": f"http://testserver/c/{open_chat.pk}/"}

    own = client.post(f"/c/{open_chat.pk}/rename", {"title": "New name"}, headers=here).content.decode()
    elsewhere = client.post(f"/c/{other.pk}/rename", {"title": "Renamed other"}, headers=here).content.decode()

    assert re.search(r'<input id="conversation-title"[^>]*value="New name"[^>]*hx-swap-oob="outerHTML"', own)
    assert "<title>New name</title>" in own
    assert 'id="conversation-title"' not in elsewhere and "<title>" not in elsewhere
