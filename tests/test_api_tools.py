"""Function calling on /v1/chat/completions (issue 30, part 1; api/tools.py) with the scripted
engine double: the prompt the tools make, the constraint each tool_choice puts on the answer,
the answer's tool_calls plain and streamed, and the 400s for what is malformed. The real model
and the official openai SDK drive the same in tests/integration/test_openai_compat.py."""

from __future__ import annotations

import json

import pytest

from api import schemas, tools
from tests.api_support import api_client, assert_error, post_json

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def body(**fields) -> dict:
    return {"model": MODEL, "messages": ASK, "tools": [WEATHER, TIME], **fields}


async def streamed(response) -> list[dict]:
    chunks = [c async for c in response.streaming_content]
    events = []
    for line in b"".join(chunks).decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            events.append(json.loads(line[6:]))
    return events


async def test_a_named_function_constrains_the_answer_to_its_arguments(make_user, engine_double):
    """Given tool_choice naming get_weather, then the engine is asked for output matching that
    function's parameters schema, the tools are in the system prompt, and the answer is one
    tool call with those arguments, no content, finish_reason tool_calls."""
    engine_double.scripts = [['{"city": ', '"Paris"}']]
    client, _ = await api_client(make_user)

    response = await post_json(
        client, "/v1/chat/completions",
        body(tool_choice={"type": "function", "function": {"name": "get_weather"}}),
    )  # fmt: skip

    assert response.status_code == 200, response.content
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    options = engine_double.requests[-1][1]
    assert options.json_schema == WEATHER["function"]["parameters"]


async def test_required_constrains_to_an_array_of_known_calls_and_parses_them(make_user, engine_double):
    """Given tool_choice required and parallel calls off, then the answer is constrained to an
    array of at most one {name, arguments} object per function's schema, and the calls come
    back with their arguments as JSON text."""
    engine_double.scripts = [['[{"name": "get_weather", "arguments": {"city": "Oslo"}}]']]
    client, _ = await api_client(make_user)

    response = await post_json(client, "/v1/chat/completions", body(tool_choice="required", parallel_tool_calls=False))

    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert [c["function"] for c in choice["message"]["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    ]
    schema = engine_double.requests[-1][1].json_schema
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    names = [item["properties"]["name"]["const"] for item in schema["items"]["anyOf"]]
    assert names == ["get_weather", "get_time"]


async def test_auto_reads_hermes_tool_call_blocks_and_leaves_plain_answers_alone(make_user, engine_double):
    """Given tool_choice auto (the default with tools), then a <tool_call> block of a known
    function is a call, text beside it is the content, nothing constrains the answer; a block
    naming an unknown function, or no block, stays an ordinary answer."""
    engine_double.scripts = [
        ['Let me check.\n<tool_call>\n{"name": "get_weather", ', '"arguments": {"city": "Rome"}}\n</tool_call>'],
        ['<tool_call>{"name": "launch_rocket", "arguments": {}}</tool_call>'],
        ["It is sunny."],
    ]
    client, _ = await api_client(make_user)

    called = (await post_json(client, "/v1/chat/completions", body())).json()["choices"][0]
    unknown = (await post_json(client, "/v1/chat/completions", body())).json()["choices"][0]
    plain = (await post_json(client, "/v1/chat/completions", body())).json()["choices"][0]

    assert called["finish_reason"] == "tool_calls" and called["message"]["content"] == "Let me check."
    assert called["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    assert engine_double.requests[0][1].json_schema is None
    assert unknown["finish_reason"] == "stop" and "tool_calls" not in unknown["message"]
    assert plain == {**plain, "finish_reason": "stop", "message": {"role": "assistant", "content": "It is sunny."}}


async def test_tools_sit_in_the_system_message_and_none_leaves_them_out(make_user, engine_double):
    """The tools section (Hermes format) ends the system message, the same for the same tools
    whatever the conversation after it (the cached prefix); tool_choice none sends no tools."""
    client, _ = await api_client(make_user)
    seen: list[list[dict]] = []
    encode = engine_double.encode_chat
    engine_double.encode_chat = lambda messages: (seen.append(list(messages)), encode(messages))[1]

    await post_json(client, "/v1/chat/completions", body())
    await post_json(client, "/v1/chat/completions", body(messages=[{"role": "user", "content": "Another question"}]))
    await post_json(client, "/v1/chat/completions", body(tool_choice="none"))

    first, second, none = seen[-3][0], seen[-2][0], seen[-1]
    assert first["role"] == "system" and first == second
    assert tools.TOOLS_HEADER in first["content"] and '"name": "get_weather"' in first["content"]
    assert first["content"].rstrip().endswith("</tool_call>")
    assert all(tools.TOOLS_HEADER not in m["content"] for m in none)


async def test_a_round_trip_writes_the_call_and_its_result_into_the_prompt(make_user, engine_double):
    """Given the history an OpenAI client sends after running a tool (the assistant's call,
    content null, then a tool message with its id), then the prompt holds the call as a
    <tool_call> block and the result as a <tool_response> block, and the answer is text."""
    engine_double.scripts = [["It is 21 degrees in Paris."]]
    client, _ = await api_client(make_user)
    seen: list[list[dict]] = []
    encode = engine_double.encode_chat
    engine_double.encode_chat = lambda messages: (seen.append(list(messages)), encode(messages))[1]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
    ]  # fmt: skip

    response = await post_json(client, "/v1/chat/completions", body(messages=history))

    assert response.status_code == 200, response.content
    assert response.json()["choices"][0]["message"]["content"] == "It is 21 degrees in Paris."
    messages = seen[-1]
    assert messages[-2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    }
    assert messages[-1] == {"role": "user", "content": '<tool_response>\n{"temp_c": 21}\n</tool_response>'}


async def test_streamed_named_arguments_come_as_fragments_then_tool_calls(make_user, engine_double):
    """Streamed with a named function: the first delta carries the call's id, type and name,
    the next ones the arguments as they are generated; the last chunk says tool_calls."""
    engine_double.scripts = [['{"city"', ': "Lima"', "}"]]
    client, _ = await api_client(make_user)

    response = await post_json(
        client, "/v1/chat/completions",
        body(stream=True, tool_choice={"type": "function", "function": {"name": "get_weather"}}),
    )  # fmt: skip
    events = await streamed(response)

    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"].startswith("call_") and calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert [c["function"]["arguments"] for c in calls[1:]] == ['{"city"', ': "Lima"', "}"]
    assert all(c["index"] == 0 for c in calls)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_streamed_auto_sends_text_then_the_call_and_never_a_half_tag(make_user, engine_double):
    """Streamed auto: the text before a call goes out as it comes, the characters that could
    start <tool_call> are held, and the call goes out whole once written."""
    engine_double.scripts = [["Checking", " now <tool", '_call>{"name": "get_time", "arguments": {}}</tool_call>']]
    client, _ = await api_client(make_user)

    events = await streamed(await post_json(client, "/v1/chat/completions", body(stream=True)))

    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    text = "".join(d.get("content") or "" for d in deltas)
    assert text == "Checking now "
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "get_time"
    assert "".join(c["function"].get("arguments", "") for c in calls) == "{}"
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
         "tools[0].function.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
         "must be an object"),
        ({"tools": [WEATHER, WEATHER]}, "given twice"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope' is not in tools"),
        ({"tools": None, "tool_choice": "required"}, "needs at least one function"),
        ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "42"}]},
         "'call_x' matches no tool call"),
        ({"messages": [*ASK, {"role": "tool", "content": "42"}]}, "needs the tool_call_id"),
        ({"messages": [{"role": "assistant", "content": None}]}, "needs content or tool_calls"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot be combined"),
    ],
)
async def test_malformed_tools_and_tool_messages_are_a_400_naming_the_field(make_user, engine_double, fields, says):
    client, _ = await api_client(make_user)

    response = await post_json(client, "/v1/chat/completions", body(**fields))

    assert_error(response, 400, "invalid_request")
    assert says in response.json()["error"]["message"]
    assert engine_double.requests == []


def test_content_given_as_text_parts_is_joined():
    message = schemas.ChatMessage.model_validate(
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    )
    assert tools.prompt_messages([message]) == [{"role": "user", "content": "a\nb"}]
