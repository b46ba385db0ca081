"""Append-only edits and regeneration on the chat page (issue 4, "Append-only"), with the scripted
engine double: Regenerate and Edit append versions, the version buttons, switching branches,
the versions each next prompt uses, and what is refused."""

from __future__ import annotations

import re
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient, Client

from conversations import services, versions
from conversations.models import Conversation, Turn
from tests.chat_support import HTMX, events_url_of, post_message, signed_in
from tests.versions_support import answered, contents, read_answer, snapshot, spy_prompts

pytestmark = pytest.mark.django_db(transaction=True)


# --- the page -----------------------------------------------------------------------------------


async def test_regenerate_appends_a_new_answer_that_replaces_the_old_one(make_user, engine_double):
    """Given an answered message, when Regenerate is posted for the answer, then a new
    assistant turn is streamed and stored with replaces = the old answer and the same reply_to,
    the old answer's row is exactly as it was (nothing UPDATEd), and the page shows the new
    answer as version 2/2 with a link back to version 1."""
    engine_double.scripts = [["First", " answer"], ["Second", " answer"]]
    client, _ = await signed_in(make_user)
    conversation_id, question_id = await answered(client, "Tell me something")
    old = await Turn.objects.aget(role="assistant")
    before = await sync_to_async(snapshot)(conversation_id)

    response = await client.post(
        f"/c/{conversation_id}/turns/{old.turn_id}/regenerate", headers=HTMX
    )

    assert response.status_code == 200
    fragment = response.content.decode()
    assert 'data-stream-actions hidden' in fragment and "2/2" in fragment
    events = await read_answer(client, response)
    assert "".join(d["text"] for n, d, _ in events if n == "token") == "Second answer"
    new = await Turn.objects.exclude(turn_id=old.turn_id).aget(role="assistant")
    assert events[-1][1]["turn_id"] == str(new.turn_id)
    assert new.replaces_id == old.turn_id
    assert new.reply_to_id == old.reply_to_id == uuid.UUID(question_id)
    after = await sync_to_async(snapshot)(conversation_id)
    assert {k: after[k] for k in before} == before

    page = (await client.get(f"/c/{conversation_id}/")).content.decode()
    assert "Second answer" in page and "First answer" not in page
    assert re.search(r'class="version-index">2/2<', page)
    assert f"/c/{conversation_id}/turns/{old.turn_id}/version" in page


async def test_the_version_buttons_fetch_each_version_with_its_position(make_user, engine_double):
    """Given an answer with two versions, when version 1 is fetched (what `<` does), then it is
    rendered as 1/2 with `>` pointing at version 2 and `<` disabled."""
    engine_double.scripts = [["Version", " one"], ["Version", " two"]]
    client, _ = await signed_in(make_user)
    conversation_id, _ = await answered(client, "hi")
    first = await Turn.objects.aget(role="assistant")
    response = await client.post(f"/c/{conversation_id}/turns/{first.turn_id}/regenerate", headers=HTMX)
    await read_answer(client, response)
    second = await Turn.objects.aget(role="assistant", replaces_id=first.turn_id)

    html = (await client.get(f"/c/{conversation_id}/turns/{first.turn_id}/version", headers=HTMX)).content.decode()

    assert "Version one" in html and "Version two" not in html
    assert re.search(r'class="version-index">1/2<', html)
    assert f"/c/{conversation_id}/turns/{second.turn_id}/version" in html
    assert re.search(r'class="version-prev" disabled', html)


async def test_edit_starts_a_branch_answered_with_the_history_before_it(make_user, engine_double):
    """Given q1/a1 and q2/a2, when q1 is edited, then a new user turn beside q1 (no parent,
    replaces q1) is stored and answered from a prompt with no history, q1, a1, q2, a2 stay as
    they were, and the response and the page show the edit as 2/2 without q2 (it stays on the
    old branch); the branch is stored on the conversation."""
    engine_double.scripts = [["a1"], ["a2"], ["a1 again"]]
    prompts = spy_prompts(engine_double)
    client, _ = await signed_in(make_user)
    conversation_id, q1_id = await answered(client, "first question")
    await answered(client, "second question", conversation_id)
    before = await sync_to_async(snapshot)(conversation_id)

    response = await client.post(
        f"/c/{conversation_id}/turns/{q1_id}/edit", {"content": "first question, edited"}, headers=HTMX
    )

    assert response.status_code == 200
    fragment = response.content.decode()
    assert re.search(r'class="version-index">2/2<', fragment) and "second question" not in fragment
    await read_answer(client, response)
    edit = await Turn.objects.aget(role="user", replaces_id=uuid.UUID(q1_id))
    assert (edit.content, edit.parent_id) == ("first question, edited", None)
    assert contents(prompts[-1]) == ["first question, edited"]
    after = await sync_to_async(snapshot)(conversation_id)
    assert {k: after[k] for k in before} == before
    assert (await Conversation.objects.aget()).branch_choices[versions.ROOT] == str(edit.turn_id)
    page = (await client.get(f"/c/{conversation_id}/")).content.decode()
    assert "first question, edited" in page and "a1 again" in page
    assert "second question" not in page and ">a2<" not in page
    assert re.search(r'class="version-index">2/2<', page)
    assert f"/c/{conversation_id}/turns/{q1_id}/select" in page


async def test_switching_back_shows_the_old_later_turns_and_is_stored(make_user, engine_double):
    """Given q1 -> q2 and an edit of q1, when version 1/2 is selected, then the response shows
    q1, a1, q2, a2 with q1 as 1/2, a fresh page load (another device) shows the same, and the
    next message follows q2 with the old branch as its prompt."""
    engine_double.scripts = [["a1"], ["a2"], ["a1 again"], ["a3"]]
    prompts = spy_prompts(engine_double)
    client, user = await signed_in(make_user)
    conversation_id, q1_id = await answered(client, "first question")
    await answered(client, "second question", conversation_id)
    response = await client.post(
        f"/c/{conversation_id}/turns/{q1_id}/edit", {"content": "first question, edited"}, headers=HTMX
    )
    await read_answer(client, response)

    switched = await client.post(f"/c/{conversation_id}/turns/{q1_id}/select", headers=HTMX)

    assert switched.status_code == 200
    html = switched.content.decode()
    assert "second question" in html and "a2" in html and "first question, edited" not in html
    assert re.search(r'class="version-index">1/2<', html)
    elsewhere = AsyncClient()
    await elsewhere.aforce_login(user)
    page = (await elsewhere.get(f"/c/{conversation_id}/")).content.decode()
    assert "second question" in page and "first question, edited" not in page
    _, q3_id = await answered(client, "third question", conversation_id)
    q3 = await Turn.objects.aget(pk=q3_id)
    assert q3.parent_id == (await Turn.objects.aget(content="second question")).turn_id
    assert contents(prompts[-1]) == ["first question", "a1", "second question", "a2", "third question"]


async def test_selecting_a_version_is_owner_only_and_needs_a_message(make_user, engine_double):
    """Another user's select is 404 and changes nothing; an answer's id is no message (404)."""
    owner, _ = await signed_in(make_user, "owner")
    conversation_id, question_id = await answered(owner, "mine")
    answer = await Turn.objects.aget(role="assistant")
    choices = (await Conversation.objects.aget()).branch_choices
    other, _ = await signed_in(make_user, "other")

    assert (await other.post(f"/c/{conversation_id}/turns/{question_id}/select", headers=HTMX)).status_code == 404
    assert (await owner.post(f"/c/{conversation_id}/turns/{answer.turn_id}/select", headers=HTMX)).status_code == 404
    assert (await owner.get(f"/c/{conversation_id}/turns/{question_id}/select")).status_code == 405
    assert (await Conversation.objects.aget()).branch_choices == choices


async def test_the_next_prompt_uses_the_newest_version_of_each_position(make_user, engine_double):
    """Given a regenerated answer and an edited message, when a new message is sent, then its
    prompt holds the newest versions only, in position order."""
    engine_double.scripts = [["old answer"], ["new answer"], ["b"], ["b2"], ["c"]]
    prompts = spy_prompts(engine_double)
    client, _ = await signed_in(make_user)
    conversation_id, _ = await answered(client, "q1")
    old = await Turn.objects.aget(role="assistant")
    response = await client.post(f"/c/{conversation_id}/turns/{old.turn_id}/regenerate", headers=HTMX)
    await read_answer(client, response)
    _, q2_id = await answered(client, "q2", conversation_id)
    response = await client.post(f"/c/{conversation_id}/turns/{q2_id}/edit", {"content": "q2 edited"}, headers=HTMX)
    await read_answer(client, response)

    await answered(client, "q3", conversation_id)

    assert contents(prompts[-1]) == ["q1", "new answer", "q2 edited", "b2", "q3"]


async def test_the_next_prompt_uses_the_answer_version_chosen(make_user, engine_double):
    """Given a regenerated answer whose first version is chosen again with `<` (stored in
    Conversation.answer_choices), when a new message is sent, then its prompt holds the version
    the page shows, not the newest: the model follows on from what the user read."""
    engine_double.scripts = [["old answer"], ["new answer"], ["c"]]
    prompts = spy_prompts(engine_double)
    client, _ = await signed_in(make_user)
    conversation_id, _ = await answered(client, "q1")
    old = await Turn.objects.aget(role="assistant")
    response = await client.post(f"/c/{conversation_id}/turns/{old.turn_id}/regenerate", headers=HTMX)
    await read_answer(client, response)
    chosen = await client.post(f"/c/{conversation_id}/turns/{old.turn_id}/version", headers=HTMX)
    assert chosen.status_code == 200 and "old answer" in chosen.content.decode()

    await answered(client, "q2", conversation_id)

    assert contents(prompts[-1]) == ["q1", "old answer", "q2"]


async def test_regenerate_while_an_answer_is_written_gets_409(make_user, engine_double):
    """PF-P1: a regenerate while the conversation is generating is refused; nothing stored."""
    engine_double.scripts = [["done"], ["slow", 30.0, " end"]]
    client, _ = await signed_in(make_user)
    conversation_id, _ = await answered(client, "q1")
    answer = await Turn.objects.aget(role="assistant")
    busy = await post_message(client, "q2", conversation_id)
    assert busy.status_code == 200

    response = await client.post(f"/c/{conversation_id}/turns/{answer.turn_id}/regenerate", headers=HTMX)

    assert response.status_code == 409
    assert "still being written" in response.content.decode()
    assert await Turn.objects.filter(role="assistant").acount() == 1
    await client.post(events_url_of(busy).replace("/events", "/stop"))


async def test_someone_elses_answer_cannot_be_regenerated_or_viewed(make_user, engine_double):
    owner, _ = await signed_in(make_user, "owner")
    conversation_id, question_id = await answered(owner, "mine")
    answer = await Turn.objects.aget(role="assistant")
    other, _ = await signed_in(make_user, "other")

    assert (await other.post(f"/c/{conversation_id}/turns/{answer.turn_id}/regenerate", headers=HTMX)).status_code == 404
    assert (await other.get(f"/c/{conversation_id}/turns/{answer.turn_id}/version")).status_code == 404
    assert (await other.post(f"/c/{conversation_id}/turns/{question_id}/edit", {"content": "x"}, headers=HTMX)).status_code == 404
    # A user turn is not an answer, and an answer is not a message to edit.
    assert (await owner.post(f"/c/{conversation_id}/turns/{question_id}/regenerate", headers=HTMX)).status_code == 404
    assert (await owner.post(f"/c/{conversation_id}/turns/{answer.turn_id}/edit", {"content": "x"}, headers=HTMX)).status_code == 404
    assert await Turn.objects.acount() == 2


async def test_an_empty_edit_is_refused_and_nothing_stored(make_user, engine_double):
    client, _ = await signed_in(make_user)
    conversation_id, question_id = await answered(client, "q")

    response = await client.post(f"/c/{conversation_id}/turns/{question_id}/edit", {"content": "  "}, headers=HTMX)

    assert response.status_code == 400
    assert await Turn.objects.acount() == 2


def test_only_stored_answers_show_regenerate_and_the_page_marks_every_exchange(make_user):
    """Given two answered exchanges, when the page is rendered, then each exchange is wrapped
    (the stylesheet shows Regenerate on the last one only) and every user message has an Edit
    form posting to its own turn."""
    user = make_user()
    conversation = services.conversation_create(owner=user)
    for text in ("one", "two"):
        q = services.turn_append_user(conversation=conversation, content=text)
        services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=q.turn_id,
            content=f"answer {text}", status="complete", prompt_tokens=3, completion_tokens=2,
        )  # fmt: skip
    client = Client()
    client.force_login(user)

    html = client.get(f"/c/{conversation.pk}/").content.decode()

    assert html.count('<div class="exchange">') == 2
    assert html.count('class="regenerate"') == 2
    for q in Turn.objects.filter(role="user"):
        assert f"/c/{conversation.pk}/turns/{q.turn_id}/edit" in html
    assert "version-index" not in html  # one version each: no `< 1/1 >`
