"""Append-only edits and regeneration: versions of turns, in the page, in prompts and on /v1
(issue 4, "Append-only"), with the scripted engine double."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient, Client
from django.utils import timezone

from conversations import services, turnstream, versions
from conversations.models import Conversation, Turn
from tests.test_api import api_client, assert_error, new_conversation, post_json
from tests.test_views import HTMX, events_url_of, parse_sse, post_message, read_stream, signed_in

pytestmark = pytest.mark.django_db(transaction=True)


def spy_prompts(engine):
    """Record the chat messages of each prompt the engine double is asked to generate from:
    the assembler's last ``encode_chat`` call before each ``generate`` is the prompt sent."""
    encode, generate = engine.encode_chat, engine.generate
    last: list = []
    prompts: list[list[dict]] = []

    def encode_chat(messages):
        last[:] = [list(messages)]
        return encode(messages)

    def generate_recorded(ids, options, request_id):
        prompts.append(last[0])
        return generate(ids, options, request_id)

    engine.encode_chat = encode_chat
    engine.generate = generate_recorded
    return prompts


def contents(messages) -> list[str]:
    return [m["content"] for m in messages if m["role"] != "system"]


def snapshot(conversation_id) -> dict:
    """Every stored turn of a conversation, all columns: to prove nothing was updated."""
    return {
        t["turn_id"]: t
        for t in Turn.objects.filter(conversation_id=conversation_id).values()
    }


async def read_answer(client, response) -> list:
    """Read the answer a page fragment streams, to its end and until the conversation is free
    again (the cross-process lock goes after the event log is flushed, just after `done`)."""
    url = events_url_of(response)
    events = parse_sse(await read_stream(await client.get(url)))
    stream = turnstream.stream_for_question(uuid.UUID(url.split("/")[4]))
    if stream is not None:
        await stream.wait()
    return events


async def api_read(response) -> list:
    """Read a /v1 turn stream to its end and until the conversation is free again."""
    events = parse_sse(await read_stream(response))
    stream = turnstream.stream_for_answer(uuid.UUID(response["X-Turn-Id"]))
    if stream is not None:
        await stream.wait()
    return events


async def answered(client, content, conversation_id=None) -> tuple[str, str]:
    """Send a message through the page and read its answer to the end; (conversation id,
    question id)."""
    response = await post_message(client, content, conversation_id)
    assert response.status_code == 200, response.content
    await read_answer(client, response)
    url = events_url_of(response)
    return url.split("/")[2], url.split("/")[4]


# --- positions (pure) ---------------------------------------------------------------------------


def make_turn(role, content, at, **fields) -> Turn:
    return Turn(role=role, content=content, created_at=at, conversation_id=uuid.uuid4(), **fields)


def test_an_edit_starts_a_branch_and_the_later_turns_stay_on_the_old_one():
    """Given q1/a1, q2/a2 (q2 after q1) and later an edit of q1 (same parent: none) answered by
    a1', when the selected path is built, then by default it is the newest branch (the edit
    alone, shown as 2/2) and, with the first fork's choice set to q1, it is q1, a1, q2, a2."""
    t0 = timezone.now()
    q1 = make_turn("user", "q1", t0)
    a1 = make_turn("assistant", "a1", t0 + timedelta(seconds=1), reply_to_id=q1.turn_id)
    q2 = make_turn("user", "q2", t0 + timedelta(seconds=2), parent_id=q1.turn_id)
    a2 = make_turn("assistant", "a2", t0 + timedelta(seconds=3), reply_to_id=q2.turn_id)
    q1_edit = make_turn("user", "q1 edited", t0 + timedelta(seconds=4), replaces_id=q1.turn_id)
    a1_edit = make_turn("assistant", "a1'", t0 + timedelta(seconds=5), reply_to_id=q1_edit.turn_id)
    turns = [a2, q1_edit, q1, a1_edit, q2, a1]

    newest = versions.positions_build(turns)
    old_branch = versions.positions_build(turns, {versions.ROOT: str(q1.turn_id)})

    assert [(p.question.content, p.answer.content) for p in newest] == [("q1 edited", "a1'")]
    assert [q.content for q in newest[0].questions] == ["q1", "q1 edited"]
    assert newest[0].index == 1
    assert [(p.question.content, p.answer.content) for p in old_branch] == [("q1", "a1"), ("q2", "a2")]
    assert old_branch[0].index == 0
    assert versions.prompt_exchanges(old_branch) == [("q1", "a1"), ("q2", "a2")]


def test_a_choice_deep_in_the_tree_is_kept_and_an_unknown_one_falls_back_to_the_newest():
    """Given q1 -> q2 and q1 -> q2' (an edit of q2), when the fork below q1 chooses q2, then the
    path is q1, q2; a choice naming no child of the fork is ignored (newest branch: q2')."""
    t0 = timezone.now()
    q1 = make_turn("user", "q1", t0)
    q2 = make_turn("user", "q2", t0 + timedelta(seconds=1), parent_id=q1.turn_id)
    q2b = make_turn("user", "q2'", t0 + timedelta(seconds=2), parent_id=q1.turn_id, replaces_id=q2.turn_id)

    chosen = versions.positions_build([q1, q2, q2b], {str(q1.turn_id): str(q2.turn_id)})
    stale = versions.positions_build([q1, q2, q2b], {str(q1.turn_id): str(uuid.uuid4())})

    assert [p.question.content for p in chosen] == ["q1", "q2"]
    assert [p.question.content for p in stale] == ["q1", "q2'"]
    assert versions.tree_build([q1, q2, q2b]).ancestors(q2b.turn_id) == [q1]


def test_turns_written_before_the_tree_get_their_parent_from_the_old_reading():
    """Given old rows with no parent (q1, q2, an edit of q1, then q3), when the tree is built,
    then q2 follows q1, the edit is q1's sibling and q3 follows q2 (the then-last position):
    by default the path with the newest message, q1, q2, q3, with q1 shown as 1/2."""
    t0 = timezone.now()
    q1 = make_turn("user", "q1", t0)
    q2 = make_turn("user", "q2", t0 + timedelta(seconds=1))
    q1_edit = make_turn("user", "q1 edited", t0 + timedelta(seconds=2), replaces_id=q1.turn_id)
    q3 = make_turn("user", "q3", t0 + timedelta(seconds=3))

    tree = versions.tree_build([q3, q1_edit, q2, q1])
    positions = versions.positions_build([q3, q1_edit, q2, q1])

    assert tree.parent_of(q2) == q1.turn_id and tree.parent_of(q1_edit) is None
    assert tree.parent_of(q3) == q2.turn_id
    assert [p.question.content for p in positions] == ["q1", "q2", "q3"]
    assert (positions[0].index, len(positions[0].questions)) == (0, 2)


def test_the_newest_usable_answer_goes_into_prompts():
    """Given an answer regenerated twice whose newest version failed, when exchanges are built
    for a prompt, then the newest version that has text is used, and the page shows the
    newest (failed) one with all three as versions."""
    t0 = timezone.now()
    q = make_turn("user", "q", t0)
    first = make_turn("assistant", "first", t0 + timedelta(seconds=1), reply_to_id=q.turn_id)
    second = make_turn("assistant", "second", t0 + timedelta(seconds=2), reply_to_id=q.turn_id, replaces_id=first.turn_id)
    failed = make_turn("assistant", "", t0 + timedelta(seconds=3), reply_to_id=q.turn_id, replaces_id=second.turn_id, status="failed")

    [position] = versions.positions_build([q, first, second, failed])

    assert position.answer is failed
    assert [a.content for a in position.answers] == ["first", "second", ""]
    assert versions.prompt_exchanges([position]) == [("q", "second")]


def test_turns_outside_the_given_suffix_are_left_out():
    """Given only the turns after some moment (the part a summary does not cover), when an edit
    of an older message and an answer to it are among them, then they form no position."""
    t0 = timezone.now()
    outside = uuid.uuid4()
    edit = make_turn("user", "edit of an old one", t0, replaces_id=outside)
    answer = make_turn("assistant", "x", t0 + timedelta(seconds=1), reply_to_id=edit.turn_id)
    q = make_turn("user", "new", t0 + timedelta(seconds=2))

    positions = versions.positions_build([edit, answer, q])

    assert [p.question.content for p in positions] == ["new"]


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


def test_a_chosen_answer_that_failed_gives_way_to_the_newest_usable_one():
    """Given a chosen answer version that failed (no text), when exchanges are built for a
    prompt, then the newest version with text is used; a usable chosen one is used as is."""
    t0 = timezone.now()
    q = make_turn("user", "q", t0)
    failed = make_turn("assistant", "", t0 + timedelta(seconds=1), reply_to_id=q.turn_id, status="failed")
    first = make_turn("assistant", "first", t0 + timedelta(seconds=2), reply_to_id=q.turn_id, replaces_id=failed.turn_id)
    second = make_turn("assistant", "second", t0 + timedelta(seconds=3), reply_to_id=q.turn_id, replaces_id=first.turn_id)
    turns = [q, failed, first, second]

    [on_failed] = versions.positions_build(turns, answer_choices={str(q.turn_id): str(failed.turn_id)})
    [on_first] = versions.positions_build(turns, answer_choices={str(q.turn_id): str(first.turn_id)})

    assert on_failed.answer is failed
    assert versions.prompt_exchanges([on_failed]) == [("q", "second")]
    assert versions.prompt_exchanges([on_first]) == [("q", "first")]


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


# --- /v1 ----------------------------------------------------------------------------------------


async def test_api_edit_with_replaces_and_history_shows_it(make_user, engine_double):
    """Given an answered turn, when POST .../turns carries `replaces` = that user turn, then the
    edit streams an answer and the history lists the new user turn with `replaces`."""
    engine_double.scripts = [["one"], ["two"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    first = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "hi"})
    await api_read(first)
    question_id = first["X-User-Turn-Id"]

    edit = await post_json(
        client, f"/v1/conversations/{conversation_id}/turns",
        {"role": "user", "content": "hello", "replaces": question_id},
    )  # fmt: skip

    assert edit.status_code == 200
    events = await api_read(edit)
    assert events[-1][0] == "done"
    turns = (await client.get(f"/v1/conversations/{conversation_id}")).json()["turns"]
    edited = next(t for t in turns if t["content"] == "hello")
    assert edited["replaces"] == question_id and edited["role"] == "user"
    assert next(t for t in turns if t["content"] == "hi")["replaces"] is None


@pytest.mark.parametrize("target", ["answer", "unknown", "other_conversation"])
async def test_api_replaces_must_name_a_user_turn_of_the_conversation(make_user, engine_double, target):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    first = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "hi"})
    await api_read(first)
    other_id = await new_conversation(client)
    other = await post_json(client, f"/v1/conversations/{other_id}/turns", {"role": "user", "content": "x"})
    await api_read(other)
    replaces = {
        "answer": first["X-Turn-Id"], "unknown": str(uuid.uuid4()),
        "other_conversation": other["X-User-Turn-Id"],
    }[target]  # fmt: skip
    count = await Turn.objects.acount()

    response = await post_json(
        client, f"/v1/conversations/{conversation_id}/turns",
        {"role": "user", "content": "edit", "replaces": replaces},
    )  # fmt: skip

    assert_error(response, 400, "invalid_request")
    assert await Turn.objects.acount() == count


async def test_api_regenerate_streams_a_new_version(make_user, engine_double):
    """Given an answered turn, when POST .../turns/{answer}/regenerate, then the SSE stream
    carries the new answer (X-Turn-Id), and the history has both answers, the new one with
    `replaces` = the old and the same `reply_to`."""
    engine_double.scripts = [["one"], ["two"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    first = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "hi"})
    await api_read(first)
    old_id = first["X-Turn-Id"]

    response = await client.generic("POST", f"/v1/conversations/{conversation_id}/turns/{old_id}/regenerate")

    assert response.status_code == 200 and response["Content-Type"].startswith("text/event-stream")
    events = await api_read(response)
    assert events[-1][0] == "done" and events[-1][1]["turn_id"] == response["X-Turn-Id"] != old_id
    turns = (await client.get(f"/v1/conversations/{conversation_id}")).json()["turns"]
    new = next(t for t in turns if t["turn_id"] == response["X-Turn-Id"])
    old = next(t for t in turns if t["turn_id"] == old_id)
    assert (new["content"], new["replaces"], new["reply_to"]) == ("two", old_id, old["reply_to"])


async def test_api_regenerate_of_something_not_an_answer_is_404(make_user, engine_double):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    first = await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "hi"})
    await api_read(first)

    for turn_id in (first["X-User-Turn-Id"], str(uuid.uuid4())):
        response = await post_json(client, f"/v1/conversations/{conversation_id}/turns/{turn_id}/regenerate", {})
        assert_error(response, 404, "not_found")
    assert await Turn.objects.acount() == 2
    assert await Conversation.objects.acount() == 1
