"""Tool rounds where other features meet them (issue 31): Continue of an answer written after
tool results keeps the round in its prompt (conversations/submit.py ``answer_continue``,
conversations/toolrounds.py ``calls_before``); the running summary reads a round in a compact
form (conversations/summaries.py); an imported result whose calling answer the file lacks is
kept under a stand-in calling answer (imports/own_format.py). Scripted engine double, real
PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import AsyncClient, Client
from django.utils import timezone

from accounts.services import api_key_create
from conversations import services, summaries, toolrounds, versions
from conversations.models import Conversation, Turn
from imports.formats import ImportFormatError, chats_read
from inference.tool_format import hermes_messages
from tests.api_support import api_client, new_conversation, post_json
from tests.chat_support import HTMX
from tests.test_api_turn_tools import CALL, called
from tests.test_summaries import in_process_endpoint, small_context, words  # noqa: F401 - fixtures
from tests.test_versions import api_read
from tests.tool_rounds import conversation_with_round, tool_round_seed
from tests.versions_support import make_turn, read_answer, spy_prompts

pytestmark = pytest.mark.django_db(transaction=True)

RESULT = '{"temp_c": 21}'


# --- Continue of an answer written after tool results ------------------------------------------


async def test_continuing_an_answer_after_tool_results_prompts_with_the_round_then_its_text(
    make_user, engine_double
):
    """Given an answer written after a call and its result and cut off at its 3-token budget,
    when Continue is posted for it, then the engine gets the very prompt that answer was written
    from (question, the call as a <tool_call> block, the result as a <tool_response> block,
    rendered the same way) followed by the cut-off text, and the continuation is stored with the
    whole text, continuing the cut-off answer."""
    client, user = await api_client(make_user)
    conversation_id = await new_conversation(client)
    events, _ = await called(client, engine_double, conversation_id, script=[CALL])
    call_id = events[0][1]["id"]
    prompts = spy_prompts(engine_double)
    engine_double.scripts = [["It ", "is ", "21 ", "never"], ["degrees."]]
    body = {"role": "tool", "results": [{"tool_call_id": call_id, "content": RESULT}], "max_tokens": 3}
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", body)
    assert response.status_code == 200, response.content
    await api_read(response)
    cut = await Turn.objects.aget(turn_id=response["X-Turn-Id"])
    assert (cut.content, cut.finish_reason) == ("It is 21 ", "length")
    page = AsyncClient()
    await page.aforce_login(user)

    continued = await page.post(f"/c/{conversation_id}/turns/{cut.turn_id}/continue", headers=HTMX)

    assert continued.status_code == 200, continued.content
    await read_answer(page, continued)
    written_from, continued_from = prompts[-2], prompts[-1]
    assert continued_from == written_from
    assert continued_from[-3:] == [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": CALL},
        {"role": "user", "content": f"<tool_response>\n{RESULT}\n</tool_response>"},
    ]
    first_ids, second_ids = engine_double.requests[-2][0], engine_double.requests[-1][0]
    assert second_ids == first_ids + engine_double.encode_text(cut.content)
    more = await Turn.objects.filter(role="assistant").order_by("-created_at").afirst()
    assert (more.content, more.continues_id) == ("It is 21 degrees.", cut.turn_id)


def continued_round():
    """question, calling answer (one call), its result, the answer after it cut off, and a
    continuation of that answer (unsaved turns, one conversation)."""
    t0 = timezone.now()
    question = make_turn("user", "Weather in Paris?", t0)
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    calling = make_turn("assistant", "", t0 + timedelta(seconds=1), reply_to_id=question.turn_id,
                        tool_calls=[call], finish_reason="tool_calls", status="complete")  # fmt: skip
    result = make_turn("tool", RESULT, t0 + timedelta(seconds=2), reply_to_id=calling.turn_id, tool_call_id="call_1")
    cut = make_turn("assistant", "It is 21 ", t0 + timedelta(seconds=3), reply_to_id=question.turn_id,
                    continues_id=calling.turn_id, finish_reason="length", status="complete")  # fmt: skip
    more = make_turn("assistant", "It is 21 degrees.", t0 + timedelta(seconds=4), reply_to_id=question.turn_id,
                     continues_id=cut.turn_id, finish_reason="stop", status="complete")  # fmt: skip
    turns = [question, calling, result, cut, more]
    for turn in turns:
        turn.conversation_id = question.conversation_id
    return turns


def test_a_continuation_follows_the_round_of_the_answer_it_continues():
    """Given an answer after a tool round, cut off and continued, then the continuation follows
    the same round: in a later prompt's history (the call, the result, then the whole text), on
    the page ("Used 1 tool" with the result) and among the turns the page loads for it."""
    question, calling, result, cut, more = turns = continued_round()
    by_id = {t.turn_id: t for t in turns}
    results = toolrounds.results_by_call_turn(turns)

    [position] = versions.positions_build(turns)
    history = versions.prompt_exchanges([position], turns)
    uses = toolrounds.tool_uses(more, by_id, results)
    loaded = toolrounds.round_turn_ids(more, by_id, results)

    assert position.answer is more
    assert hermes_messages(history[0][1]) == [
        {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'},
        {"role": "user", "content": f"<tool_response>\n{RESULT}\n</tool_response>"},
        {"role": "assistant", "content": "It is 21 degrees."},
    ]
    assert [(u.name, u.result) for u in uses] == [("get_weather", RESULT)]
    assert loaded == [calling.turn_id, result.turn_id]


# --- the running summary reads a round ---------------------------------------------------------


def rounds_then_plain(conversation, count: int, **round_fields) -> list[Turn]:
    """A tool round (tests/tool_rounds.py), then ``count`` plain exchanges of 46 tokens each on
    the same branch; the questions, oldest first."""
    questions = [tool_round_seed(conversation, **round_fields).question]
    for i in range(count):
        plain = tool_round_seed(conversation, question=words(f"q{i}"), calls=(), answer=words(f"a{i}"))
        questions.append(plain.question)
    return questions


def test_the_summariser_reads_which_tools_were_called_with_what_and_what_came_back(
    make_user, engine_double, small_context, in_process_endpoint
):
    """Given a tool round (two calls) followed by 5 plain exchanges, when the summary task
    folds the older exchanges, then the summariser's prompt has, between the round's question
    and its answer, one line per call with the function, its arguments and its result."""
    prompts = spy_prompts(engine_double)
    conversation = services.conversation_create(owner=make_user())
    rounds_then_plain(conversation, 5)

    assert summaries.conversation_summarise(str(conversation.pk)) is True

    sent = prompts[0][-1]["content"]
    assert (
        "User: What is the weather in Paris?\n"
        'Assistant called get_weather({"city": "Paris"}) -> {"temp_c": 21, "sky": "clear"}\n'
        'Assistant called get_time({"tz": "Europe/Paris"}) -> 14:05\n'
        "Assistant: It is 21 degrees and clear."
    ) in sent


def called_line(prompts) -> str:
    """The first ``Assistant called`` line the summariser was sent."""
    return next(line for p in prompts for line in p[-1]["content"].splitlines() if line.startswith("Assistant called"))


def test_a_long_result_reaches_the_summariser_on_one_line_cut_at_round_result_chars(
    make_user, engine_double, small_context, in_process_endpoint
):
    """Given a round whose result is 100 lines (6,000 characters, few words), when the summary
    task runs, then the summariser sees the result's start on one line, cut to
    ROUND_RESULT_CHARS characters with an ellipsis."""
    prompts = spy_prompts(engine_double)
    huge = "\n".join(f"row{i}:" + "abcdefghij" * 5 for i in range(100))
    conversation = services.conversation_create(owner=make_user())
    rounds_then_plain(conversation, 5, calls=(("search", '{"q": "rows"}', huge),))

    assert summaries.conversation_summarise(str(conversation.pk)) is True

    line = called_line(prompts)
    result = line.split(" -> ", 1)[1]
    assert line.startswith('Assistant called search({"q": "rows"}) -> row0:abcdefghij')
    assert len(result) == summaries.ROUND_RESULT_CHARS and result.endswith("\u2026") and "row99" not in line


def test_a_round_too_long_for_the_summary_prompt_is_clipped_to_fit_its_context(
    make_user, engine_double, small_context, in_process_endpoint
):
    """Given a round whose result is 3,000 words (its digest alone over the summariser's
    160-token prompt room), when the summary task runs, then the round is still sent, clipped
    like any exchange too long for one summary prompt, and every request fits the model's
    context with room for the summary."""
    prompts = spy_prompts(engine_double)
    huge = "\n".join(f"row{i} " + "v " * 29 for i in range(100))
    conversation = services.conversation_create(owner=make_user())
    rounds_then_plain(conversation, 5, calls=(("search", '{"q": "rows"}', huge),))

    assert summaries.conversation_summarise(str(conversation.pk)) is True

    assert called_line(prompts).startswith('Assistant called search({"q": "rows"}) -> row0 v v')
    for ids, options, _ in engine_double.requests:
        assert len(ids) + options.max_tokens <= 200


def test_the_verbatim_window_counts_a_round_as_a_turns_prompt_holds_it(
    make_user, engine_double, small_context, in_process_endpoint
):
    """Given a plain exchange then a round whose text is short but whose result is 60 words,
    when the summary task runs, then the round counts in the verbatim window with its calls and
    results (as the next turn's prompt holds it: over the 75-token window), so both exchanges
    are folded into the summary rather than left for a prompt they no longer fit."""
    conversation = services.conversation_create(owner=make_user())
    plain = tool_round_seed(conversation, question=words("q0"), calls=(), answer=words("a0")).question
    big = tool_round_seed(conversation, calls=(("lookup", '{"q": "x"}', "word " * 60),)).question

    assert summaries.conversation_summarise(str(conversation.pk)) is True

    conversation.refresh_from_db()
    assert conversation.summary_through == big.created_at > plain.created_at


def test_a_round_digest_lists_at_most_so_many_calls_and_says_how_many_more():
    """Given 10 calls, one without a result and one with long arguments, then the digest has
    ROUND_CALLS_MAX call lines then one counting the rest; the long arguments are cut and a call
    without a result says so."""
    uses = [
        toolrounds.ToolUse(call_id=f"c{i}", name=f"f{i}", arguments="{}", result=f"r{i}", preview="")
        for i in range(10)
    ]
    uses[0] = toolrounds.ToolUse(call_id="c0", name="f0", arguments='{"a": "' + "x" * 500 + '"}', result=None, preview="")

    lines = summaries.round_digest(uses).splitlines()

    assert len(lines) == summaries.ROUND_CALLS_MAX + 1
    assert lines[-1] == f"(and {10 - summaries.ROUND_CALLS_MAX} more tool calls)"
    assert lines[0].endswith("\u2026) -> (no result)")
    assert len(lines[0]) == len("Assistant called f0() -> (no result)") + summaries.ROUND_ARGUMENTS_CHARS
    assert lines[1] == "Assistant called f1({}) -> r1"


# --- an imported result whose calling answer the file lacks ------------------------------------


def export_file(*turns: dict) -> dict:
    """This service's export of one conversation holding ``turns`` (each given ``turn_id``,
    ``role``, ``content`` and what else it needs; times one second apart, in order)."""
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [
        {"created_at": (t0 + dt.timedelta(seconds=i)).isoformat(), "status": "complete", **turn}
        for i, turn in enumerate(turns)
    ]
    return {"format": "chatsite-export", "kind": "conversation",
            "conversation": {"conversation_id": "c1", "title": "t", "turns": rows}}  # fmt: skip


def test_results_whose_calling_answer_is_missing_are_kept_under_a_stand_in():
    """Given an export whose calling answer is gone but whose two results and the answer after
    them (continuing it) are there, when it is read, then the results are kept, answering a
    stand-in calling answer under the missing answer's id: an answer to the same question, with
    one call per result (their ids, function "unknown", no arguments), just before the first
    result; the answer after them continues it."""
    data = export_file(
        {"turn_id": "q", "role": "user", "content": "Weather in Paris and the time?"},
        {"turn_id": "r1", "role": "tool", "content": RESULT, "tool_call_id": "x1", "reply_to": "gone"},
        {"turn_id": "r2", "role": "tool", "content": "14:05", "tool_call_id": "x2", "reply_to": "gone"},
        {"turn_id": "a", "role": "assistant", "content": "21 degrees at 14:05.", "reply_to": "q", "continues": "gone"},
    )

    [chat] = chats_read(data)

    by_key = {m.key: m for m in chat.messages}
    assert [m.key for m in chat.messages] == ["q", "gone", "r1", "r2", "a"]
    stand_in = by_key["gone"]
    assert (stand_in.role, stand_in.content, stand_in.reply_to, stand_in.finish_reason) == ("assistant", "", "q", "tool_calls")
    assert stand_in.tool_calls == [
        {"id": "x1", "type": "function", "function": {"name": "unknown", "arguments": ""}},
        {"id": "x2", "type": "function", "function": {"name": "unknown", "arguments": ""}},
    ]
    assert stand_in.created_at < by_key["r1"].created_at
    assert [(by_key[k].reply_to, by_key[k].tool_call_id) for k in ("r1", "r2")] == [("gone", "x1"), ("gone", "x2")]
    assert by_key["a"].continues == "gone" and chat.stand_ins == 1


def test_an_imported_round_without_its_calling_answer_shows_its_results(make_user):
    """Given this service's export of a tool round with the calling answer cut out of the file,
    when another account imports it, then the page shows the answer after the round with "Used
    2 tools" and both results, the import message says what was put in, and the next prompt's
    history holds the round (the stand-in's calls, the results, the answer)."""
    alice, bob = make_user("alice"), make_user("bob")
    conversation, rnd = conversation_with_round(alice)
    owner, client = Client(), Client()
    owner.force_login(alice)
    client.force_login(bob)
    exported = json.loads(owner.get(f"/c/{conversation.pk}/export.json").content)
    exported["conversation"]["turns"] = [
        t for t in exported["conversation"]["turns"] if t["turn_id"] != str(rnd.calling.turn_id)
    ]
    upload = SimpleUploadedFile("export.json", json.dumps(exported).encode(), "application/json")

    done = client.get(client.post("/settings/import", {"file": upload})["Location"]).content.decode()

    copy = Conversation.objects.get(owner=bob)
    page = client.get(f"/c/{copy.pk}/").content.decode()
    assert "Used 2 tools" in page and "unknown(" in page
    assert "{&quot;temp_c&quot;: 21, &quot;sky&quot;: &quot;clear&quot;}" in page and ">14:05</pre>" in page
    assert "1 answer that called tools was missing from the file" in done
    turns = list(Turn.objects.filter(conversation_id=copy.pk))
    [position] = versions.positions_build(turns, copy.branch_choices, copy.answer_choices)
    [(_, history)] = versions.prompt_exchanges([position], turns)
    assert [m["role"] for m in history] == ["assistant", "tool", "tool", "assistant"]
    assert [m["content"] for m in history[1:]] == ['{"temp_c": 21, "sky": "clear"}', "14:05", "It is 21 degrees and clear."]


def test_a_result_with_no_answer_after_it_hangs_off_the_question_before_it():
    """Given a result naming an answer the file lacks, with no answer continuing that one, when
    the file is read, then the result is kept under a stand-in answering the question before
    it, and the question's own answer stays as it was."""
    data = export_file(
        {"turn_id": "q", "role": "user", "content": "Hi"},
        {"turn_id": "r", "role": "tool", "content": "42", "tool_call_id": "x", "reply_to": "gone"},
        {"turn_id": "a", "role": "assistant", "content": "Hello", "reply_to": "q"},
    )

    [chat] = chats_read(data)

    by_key = {m.key: m for m in chat.messages}
    assert sorted(by_key) == ["a", "gone", "q", "r"]
    assert (by_key["gone"].reply_to, by_key["r"].reply_to, by_key["a"].reply_to) == ("q", "gone", "q")
    assert by_key["a"].continues is None


def test_a_result_before_any_message_is_refused_naming_it():
    """Given a result that names a missing answer and comes before every message, when the
    file is read, then it is refused with a message naming the result (nothing to attach it
    to, and leaving it out would lose it without a word)."""
    data = export_file(
        {"turn_id": "r", "role": "tool", "content": "42", "tool_call_id": "x", "reply_to": "gone"},
        {"turn_id": "q", "role": "user", "content": "Hi"},
    )

    with pytest.raises(ImportFormatError, match=r"tool result r answers a call whose answer is not in the file"):
        chats_read(data)


# --- an imported result whose calling answer does not list its call -------------------------


def test_a_result_whose_call_its_answer_does_not_list_gets_that_call_added():
    """Given an export whose calling answer lists call x1 while its results answer x1, x9 and
    (twice) x1, when it is read, then the answer lists x1, then x9 and a fresh id for the second
    x1 result, both under function "unknown" with no arguments, each result answering a call
    the answer lists; a result answering a plain answer makes it a calling answer."""
    data = export_file(
        {"turn_id": "q", "role": "user", "content": "Weather?"},
        {"turn_id": "c", "role": "assistant", "content": "", "reply_to": "q", "finish_reason": "tool_calls",
         "tool_calls": [{"id": "x1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
        {"turn_id": "r1", "role": "tool", "content": RESULT, "tool_call_id": "x1", "reply_to": "c"},
        {"turn_id": "r9", "role": "tool", "content": "14:05", "tool_call_id": "x9", "reply_to": "c"},
        {"turn_id": "r1b", "role": "tool", "content": "again", "tool_call_id": "x1", "reply_to": "c"},
        {"turn_id": "p", "role": "assistant", "content": "Plain.", "reply_to": "q"},
        {"turn_id": "rp", "role": "tool", "content": "7", "tool_call_id": "y", "reply_to": "p"},
    )  # fmt: skip

    [chat] = chats_read(data)

    by_key = {m.key: m for m in chat.messages}
    unknown = {"name": "unknown", "arguments": ""}
    assert [(c["id"], c["function"]) for c in by_key["c"].tool_calls] == [
        ("x1", {"name": "weather", "arguments": "{}"}), ("x9", unknown), ("x1_r1b", unknown),
    ]
    assert [by_key[k].tool_call_id for k in ("r1", "r9", "r1b")] == ["x1", "x9", "x1_r1b"]
    assert (by_key["p"].content, by_key["p"].finish_reason) == ("Plain.", "tool_calls")
    assert [(c["id"], c["function"]) for c in by_key["p"].tool_calls] == [("y", unknown)]
    assert chat.added_calls == 3 and chat.stand_ins == 0


def test_an_imported_round_whose_answer_lost_a_call_shows_every_result(make_user):
    """Given this service's export of a tool round whose calling answer had its second call cut
    out, when another account imports it through /v1/imports, then the reply counts the added
    call, the page shows "Used 2 tools" with both results, and the next prompt's history holds
    both results."""
    alice, bob = make_user("alice"), make_user("bob")
    conversation, rnd = conversation_with_round(alice)
    owner = Client()
    owner.force_login(alice)
    exported = json.loads(owner.get(f"/c/{conversation.pk}/export.json").content)
    [calling] = [t for t in exported["conversation"]["turns"] if t["turn_id"] == str(rnd.calling.turn_id)]
    calling["tool_calls"] = calling["tool_calls"][:1]
    upload = SimpleUploadedFile("export.json", json.dumps(exported).encode(), "application/json")

    key = api_key_create(user=bob, name="import").raw
    reply = Client(headers={"Authorization": f"Bearer {key}"}).post("/v1/imports", {"file": upload})

    assert reply.status_code == 201, reply.content
    assert (reply.json()["added_calls"], reply.json()["stand_ins"]) == (1, 0)
    copy = Conversation.objects.get(owner=bob)
    reader = Client()
    reader.force_login(bob)
    page = reader.get(f"/c/{copy.pk}/").content.decode()
    assert "Used 2 tools" in page and "unknown(" in page
    assert "{&quot;temp_c&quot;: 21, &quot;sky&quot;: &quot;clear&quot;}" in page and ">14:05</pre>" in page
    turns = list(Turn.objects.filter(conversation_id=copy.pk))
    [position] = versions.positions_build(turns, copy.branch_choices, copy.answer_choices)
    [(_, history)] = versions.prompt_exchanges([position], turns)
    assert [m["role"] for m in history] == ["assistant", "tool", "tool", "assistant"]
