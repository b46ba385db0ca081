"""Function calling on /v1/conversations/{id}/turns (issue 30, part 1): an answer that calls
functions is stored with its calls, the client's results as tool turns, and the answer after them
sees both in its prompt (conversations/toolrounds.py, conversations/submit.py
``tool_results_submit``), with the scripted engine double."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from asgiref.sync import sync_to_async

from api import tools
from inference import tool_format
from conversations import turnstream
from conversations.models import Conversation, Turn
from privacy.conversation_export import conversation_export_json
from tests.api_support import api_client, assert_error, new_conversation, post_json
from tests.test_api_tools import WEATHER
from tests.chat_support import parse_sse, read_stream, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def ask(**fields) -> dict:
    return {"role": "user", "content": "What is the weather in Paris?", "tools": [WEATHER], **fields}


def recording(engine_double) -> list[list[dict]]:
    """The messages each encode_chat call was given, in order."""
    seen: list[list[dict]] = []
    encode = engine_double.encode_chat
    engine_double.encode_chat = lambda messages, **kw: (seen.append(list(messages)), encode(messages))[1]
    return seen


async def called(client, engine_double, conversation_id: str, script=None):
    """Send the question with tools; return (events, answer id)."""
    engine_double.scripts = [script or ["Let me check. ", CALL]]
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", ask())
    assert response.status_code == 200, response.content
    return parse_sse(await read_stream(response)), response["X-Turn-Id"]


def results(*pairs) -> dict:
    return {"role": "tool", "tools": [WEATHER], "results": [{"tool_call_id": i, "content": c} for i, c in pairs]}


async def test_a_call_is_stored_on_the_answer_and_sent_as_events(make_user, engine_double):
    """Given tools and an answer that writes a <tool_call> block, then the stream sends its text
    without the block, one tool_call event, and done with finish_reason tool_calls and the calls;
    the stored answer holds the calls and only its text."""
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)

    events, answer_id = await called(client, engine_double, conversation_id)

    names = [n for n, _, _ in events]
    assert names == ["token", "tool_call", "done"]
    assert events[0][1] == {"text": "Let me check. "}
    call = events[1][1]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    done = events[-1][1]
    assert done["finish_reason"] == "tool_calls" and done["tool_calls"][0]["id"] == call["id"]
    answer = await Turn.objects.aget(turn_id=answer_id)
    assert answer.tool_calls[0]["id"] == call["id"] and answer.content == "Let me check."
    assert answer.finish_reason == "tool_calls" and answer.status == "complete"


async def test_a_resumed_stream_sees_the_calls(make_user, engine_double, settings):
    """Given a reader that drops after the first event, then resuming with Last-Event-ID
    replays the tool_call event and done."""
    settings.CHAT_STREAM_DISCONNECT_GRACE_S = 5
    engine_double.scripts = [["Let me check. ", 0.3, CALL]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", ask())
    turn_id = response["X-Turn-Id"]
    reader = asyncio.ensure_future(read_stream(response))
    stream = turnstream.stream_for_answer(uuid.UUID(turn_id))
    await wait_for(lambda: len(stream.events) >= 1)
    reader.cancel()

    resumed = await client.get(
        f"/v1/conversations/{conversation_id}/turns/{turn_id}/events", headers={"Last-Event-ID": "1"}
    )

    events = parse_sse(await read_stream(resumed))
    assert [n for n, _, _ in events] == ["tool_call", "done"]
    assert events[0][1]["function"]["name"] == "get_weather"


async def test_results_are_stored_and_the_next_answer_sees_calls_and_results_in_order(make_user, engine_double):
    """Given an answer with a call, when the client sends its result, then it is stored as a
    tool turn, the next answer streams, and its prompt ends with the question, the call as a
    <tool_call> block and the result as a <tool_response> block."""
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    events, answer_id = await called(client, engine_double, conversation_id, script=[CALL])
    call_id = events[0][1]["id"]
    seen = recording(engine_double)
    engine_double.scripts = [["It is 21 degrees."]]

    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", results((call_id, '{"temp_c": 21}')))

    assert response.status_code == 200, response.content
    assert parse_sse(await read_stream(response))[-1][1]["finish_reason"] == "stop"
    prompt = seen[-1]
    assert prompt[-3] == {"role": "user", "content": "What is the weather in Paris?"}
    assert prompt[-2] == {"role": "assistant", "content": CALL}
    assert prompt[-1] == {"role": "user", "content": '<tool_response>\n{"temp_c": 21}\n</tool_response>'}
    tool = await Turn.objects.aget(role="tool")
    assert (tool.tool_call_id, str(tool.reply_to_id), tool.content) == (call_id, answer_id, '{"temp_c": 21}')
    final = await Turn.objects.aget(turn_id=response["X-Turn-Id"])
    assert (final.content, str(final.continues_id)) == ("It is 21 degrees.", answer_id)


async def test_a_later_question_has_the_whole_tool_round_in_its_history(make_user, engine_double):
    """Given a finished round (call, result, answer), when the user asks again, then the history
    holds the question, the call, the result and the answer, in that order."""
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    events, _ = await called(client, engine_double, conversation_id, script=[CALL])
    engine_double.scripts = [["Sunny."]]
    await read_stream(await post_json(client, f"/v1/conversations/{conversation_id}/turns", results((events[0][1]["id"], "sun"))))
    seen = recording(engine_double)
    engine_double.scripts = [["Yes."]]

    await read_stream(await post_json(client, f"/v1/conversations/{conversation_id}/turns", {"role": "user", "content": "Sure?"}))

    rendered = seen[-1]
    assert [m["content"] for m in rendered[-5:]] == [
        "What is the weather in Paris?", CALL, "<tool_response>\nsun\n</tool_response>", "Sunny.", "Sure?"
    ]
    assert all(tools.TOOLS_HEADER not in m["content"] for m in rendered)  # no tools this time


async def test_two_calls_wait_for_both_results(make_user, engine_double):
    """Given an answer with two calls, when one result comes, then 202 names the call still
    awaited and nothing is generated; the second result starts the answer."""
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    events, _ = await called(client, engine_double, conversation_id, script=[CALL, CALL.replace("Paris", "Oslo")])
    first, second = [d["id"] for n, d, _ in events if n == "tool_call"]
    requests = len(engine_double.requests)

    partial = await post_json(client, f"/v1/conversations/{conversation_id}/turns", results((first, "a")))

    assert partial.status_code == 202, partial.content
    assert partial.json()["awaiting"] == [second]
    assert len(engine_double.requests) == requests
    engine_double.scripts = [["Both."]]
    rest = await post_json(client, f"/v1/conversations/{conversation_id}/turns", results((second, "b")))
    assert rest.status_code == 200 and parse_sse(await read_stream(rest))[-1][0] == "done"


@pytest.mark.parametrize(
    ("which", "says"),
    [("unknown", "matches no tool call"), ("twice", "has a result already"), ("no_calls", "made no tool calls")],
)
async def test_bad_results_are_a_400_and_store_nothing(make_user, engine_double, which, says):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    if which == "no_calls":
        engine_double.scripts = [["Just text."]]
        await read_stream(await post_json(client, f"/v1/conversations/{conversation_id}/turns", ask()))
        body = results(("call_x", "r"))
    else:
        events, _ = await called(client, engine_double, conversation_id, script=[CALL])
        call_id = events[0][1]["id"]
        body = results(("call_nope", "r")) if which == "unknown" else results((call_id, "r"), (call_id, "r"))

    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", body)

    assert_error(response, 400, "invalid_request")
    assert says in response.json()["error"]["message"]
    assert not await Turn.objects.filter(role="tool").aexists()


async def test_a_named_function_not_in_tools_is_a_400(make_user, engine_double):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await post_json(
        client, f"/v1/conversations/{conversation_id}/turns",
        ask(tool_choice={"type": "function", "function": {"name": "nope"}}),
    )  # fmt: skip
    assert_error(response, 400, "invalid_request")
    assert "not in tools" in response.json()["error"]["message"]
    assert engine_double.requests == [] and not await Turn.objects.aexists()


async def test_required_constrains_the_answer_and_the_definitions_count_as_prompt_tokens(make_user, engine_double):
    """Given tool_choice required, then the engine is asked for the calls' schema, and the
    answer's prompt tokens exceed those of the same question without tools by the tools
    section's tokens (billing and TPM count them)."""
    client, _ = await api_client(make_user)
    plain_id = await new_conversation(client)
    await read_stream(await post_json(client, f"/v1/conversations/{plain_id}/turns", {"role": "user", "content": ask()["content"]}))
    tools_id = await new_conversation(client)
    engine_double.scripts = [['[{"name": "get_weather", "arguments": {"city": "Rome"}}]']]

    events = parse_sse(await read_stream(await post_json(client, f"/v1/conversations/{tools_id}/turns", ask(tool_choice="required"))))

    assert engine_double.requests[-1][1].json_schema["type"] == "array"
    assert events[-1][1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Rome"}'
    plain = await Turn.objects.aget(conversation_id=plain_id, role="assistant")
    with_tools = await Turn.objects.aget(conversation_id=tools_id, role="assistant")
    section = tools.calling_from(
        [tools.schemas.ToolDefinition.model_validate(WEATHER)], "required"
    ).system_section()
    assert with_tools.prompt_tokens - plain.prompt_tokens == len(section.split())
    assert events[-1][1]["usage"]["prompt_tokens"] == with_tools.prompt_tokens


async def test_history_and_export_carry_calls_and_results(make_user, engine_double):
    """GET of the conversation lists the answer's tool_calls and the tool turn's tool_call_id;
    the personal-data export carries them too."""
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    events, _ = await called(client, engine_double, conversation_id, script=[CALL])
    call_id = events[0][1]["id"]
    engine_double.scripts = [["Sunny."]]
    await read_stream(await post_json(client, f"/v1/conversations/{conversation_id}/turns", results((call_id, "sun"))))

    turns = (await client.get(f"/v1/conversations/{conversation_id}")).json()["turns"]

    assert [(t["role"], t["tool_call_id"]) for t in turns] == [
        ("user", None), ("assistant", None), ("tool", call_id), ("assistant", None)
    ]
    assert turns[1]["tool_calls"][0]["id"] == call_id and turns[1]["finish_reason"] == "tool_calls"
    conversation = await Conversation.objects.aget(pk=conversation_id)
    exported = await sync_to_async(conversation_export_json)(conversation=conversation)
    assert call_id in exported and '"tool_call_id"' in exported


async def test_regenerating_the_answer_after_results_keeps_the_calls_and_results(make_user, engine_double):
    """Given an answer written after a call and its result, when it is regenerated, then the new
    version's prompt still ends with the question, the call and the result (the model writes the
    final answer again instead of calling the tool again), and it is stored as a version that
    continues the calling answer and replaces the old final answer."""
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    events, calling_id = await called(client, engine_double, conversation_id, script=[CALL])
    call_id = events[0][1]["id"]
    engine_double.scripts = [["It is 21 degrees."]]
    response = await post_json(client, f"/v1/conversations/{conversation_id}/turns", results((call_id, '{"temp_c": 21}')))
    await read_stream(response)
    first = response["X-Turn-Id"]
    seen = recording(engine_double)
    engine_double.scripts = [["Twenty-one degrees in Paris."]]

    again = await post_json(client, f"/v1/conversations/{conversation_id}/turns/{first}/regenerate", {})

    assert again.status_code == 200, again.content
    assert parse_sse(await read_stream(again))[-1][1]["finish_reason"] == "stop"
    prompt = seen[-1]
    assert prompt[-3] == {"role": "user", "content": "What is the weather in Paris?"}
    assert prompt[-2] == {"role": "assistant", "content": CALL}
    assert prompt[-1] == {"role": "user", "content": '<tool_response>\n{"temp_c": 21}\n</tool_response>'}
    new = await Turn.objects.aget(turn_id=again["X-Turn-Id"])
    assert new.content == "Twenty-one degrees in Paris."
    assert (str(new.continues_id), str(new.replaces_id)) == (calling_id, first)
    assert await Turn.objects.filter(role="tool").acount() == 1  # no new round


def test_the_chat_page_shows_an_answers_calls_escaped(make_user):
    """Given a stored answer that called a function with arguments holding markup, then the
    chat page shows "Called get_weather(...)" with the arguments escaped."""
    from tests.test_answer_render import answered  # noqa: PLC0415

    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "<b>Paris</b>"}'}}]
    client, conversation = answered(make_user, "", tool_calls=calls, finish_reason="tool_calls")

    page = client.get(f"/c/{conversation.pk}/").content.decode()

    assert "Called <code>get_weather({&quot;city&quot;: &quot;&lt;b&gt;Paris&lt;/b&gt;&quot;})</code>" in page
    assert "empty answer" not in page


# --- a chat template with a tool format (inference/tool_format.py) -----------------------------

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WITH_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}"
    "{{- tool | tojson }}{%- endfor %}{{- '</tools><|im_end|>\\n' }}{%- endif %}" + CHATML
)


class TemplateEngine:
    """An engine stand-in with a real Jinja chat template (transformers' renderer)."""

    def __init__(self, template: str):
        self.template = template
        self.rendered: list[str] = []

    def chat_template(self) -> str:
        return self.template

    def encode_chat(self, messages, tools=None):
        from transformers.utils.chat_template_utils import render_jinja_template  # noqa: PLC0415

        conversations, _ = render_jinja_template(
            conversations=[list(messages)], tools=tools, chat_template=self.template, add_generation_prompt=True
        )
        self.rendered.append(conversations[0])
        return list(range(len(conversations[0].split())))


def test_smollm2s_chatml_template_has_no_tool_format_so_the_hermes_section_is_used():
    calling = tools.calling_from([tools.schemas.ToolDefinition.model_validate(WEATHER)], None)
    engine = TemplateEngine(CHATML)

    encode, section = tool_format.chat_encoder(engine, calling)
    encode([{"role": "system", "content": section}, {"role": "user", "content": "hi"}])

    assert not tool_format.template_has_tools(CHATML)
    assert section.startswith(tools.TOOLS_HEADER) and '"get_weather"' in engine.rendered[-1]


def test_a_template_that_reads_tools_gets_them_natively_and_no_section():
    calling = tools.calling_from([tools.schemas.ToolDefinition.model_validate(WEATHER)], None)
    engine = TemplateEngine(WITH_TOOLS)

    encode, section = tool_format.chat_encoder(engine, calling)
    encode([{"role": "user", "content": "hi"}])

    assert tool_format.template_has_tools(WITH_TOOLS) and section == ""
    assert '<tools>{"type": "function", "function": {"name": "get_weather"' in engine.rendered[-1]
    assert tools.TOOLS_HEADER not in engine.rendered[-1]


def test_a_template_that_only_mentions_tools_in_text_is_not_native():
    assert not tool_format.template_has_tools("You have no tools. " + CHATML)
