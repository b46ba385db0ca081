"""Append-only edits and regeneration (issue 4, "Append-only"), with the scripted engine double:
the positions of turn versions and which version goes into prompts (pure), and edits and
regeneration on /v1. On the chat page: test_versions_page.py."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from conversations import turnstream, versions
from conversations.models import Conversation, Turn
from tests.api_support import api_client, assert_error, new_conversation, post_json
from tests.chat_support import parse_sse, read_stream
from tests.versions_support import make_turn

pytestmark = pytest.mark.django_db(transaction=True)


# --- positions (pure) ---------------------------------------------------------------------------


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


# --- /v1 ----------------------------------------------------------------------------------------


async def api_read(response) -> list:
    """Read a /v1 turn stream to its end and until the conversation is free again."""
    events = parse_sse(await read_stream(response))
    stream = turnstream.stream_for_answer(uuid.UUID(response["X-Turn-Id"]))
    if stream is not None:
        await stream.wait()
    return events


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
