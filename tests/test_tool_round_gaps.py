"""Tool rounds where other features meet them (issue 31): Continue of an answer written after
tool results keeps the round in its prompt (conversations/submit.py ``answer_continue``,
conversations/toolrounds.py ``calls_before``); the running summary reads a round in a compact
form (conversations/summaries.py); an imported result whose calling answer the file lacks is
kept under a stand-in calling answer (imports/formats.py). Scripted engine double, real
PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import AsyncClient
from django.utils import timezone

from conversations import toolrounds, versions
from conversations.models import Turn
from inference.tool_format import hermes_messages
from tests.test_api import api_client, new_conversation, post_json
from tests.test_api_turn_tools import CALL, called
from tests.test_versions import api_read, make_turn, read_answer, spy_prompts
from tests.test_views import HTMX

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
