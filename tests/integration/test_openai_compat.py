"""/v1/chat/completions with the official openai client against the real engine."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import openai
import pytest

from accounts.services import api_key_create

pytestmark = pytest.mark.real_engine


@pytest.fixture
def oai(live, make_user):
    issued = api_key_create(user=make_user("oai"), name="openai client")
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key=issued.raw, max_retries=0, timeout=120)
    return live, client, issued.raw


def test_non_streaming_completion_with_usage(oai):
    live, client, _ = oai
    result = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Say hello in one short sentence."}],
        max_tokens=30,
        temperature=0,
    )
    choice = result.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content.strip()
    assert choice.finish_reason in {"stop", "length"}
    assert result.usage.completion_tokens > 0
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens
    assert live.unfinished() == 0


def test_streaming_completion_matches_non_streaming_and_reports_usage_once(oai):
    _, client, _ = oai
    kwargs = dict(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Name two colors."}],
        max_tokens=40,
        temperature=0,
    )
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    usages = [c.usage for c in chunks if c.usage is not None]
    assert len(usages) == 1
    assert usages[0].completion_tokens == whole.usage.completion_tokens


def test_response_format_json_schema_always_parses(oai):
    _, client, _ = oai
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    result = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Give a city and its country as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}},
    )
    data = json.loads(result.choices[0].message.content)
    assert set(data) == {"city", "country"}


def test_stop_sequence_ends_the_answer(oai):
    _, client, _ = oai
    kwargs = dict(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Count from one to ten."}],
        max_tokens=60,
        temperature=0,
    )
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    words = full.split()
    assert len(words) >= 4, full
    stop = words[len(words) // 2]
    cut = client.chat.completions.create(stop=[stop], **kwargs).choices[0].message.content
    assert stop not in cut
    assert cut == full[: full.index(stop)]


def test_unknown_model_and_bad_key_are_clear_errors(oai, live):
    _, client, _ = oai
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    bad = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-nope.nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "hi"}])


def test_models_list(oai):
    """A free user's pools, then the served model's name (their tier's default pool), then
    the embedding model; each chat name works as `model`."""
    _, client, _ = oai
    assert [m.id for m in client.models.list()] == ["mini", "SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"]
    answer = client.chat.completions.create(
        model="mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0
    )
    assert answer.model == "mini" and answer.usage.completion_tokens >= 1


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_at_once(oai, stream):
    """PF-C1 (non-resumable): kill the client 1 s into a long generation, streaming and not;
    the engine's unfinished count is back to its baseline within 1 s."""
    live, _, key = oai
    baseline = live.unfinished()
    body = json.dumps({
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": "Write a very long story about a lighthouse."}],
        "max_tokens": 500,
        "stream": stream,
    })
    parts = urlsplit(live.url)
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.sendall(
        (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {key}\r\n"
         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode()
    )
    time.sleep(1.0)
    assert live.unfinished() == baseline + 1
    sock.close()
    closed = time.monotonic()
    while live.unfinished() > baseline and time.monotonic() - closed < 1.0:
        time.sleep(0.02)
    assert live.unfinished() == baseline


def test_out_of_vocabulary_token_ids_are_a_400_from_the_real_model(oai):
    """A token-id prompt the real model does not know gets a 400 the client can read (vLLM
    itself would raise mid-request: a 500 before this check existed); a small max_tokens
    below the prompt-shrinking floor is honoured."""
    live, client, _ = oai
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        client.completions.create(model="SmolLM2-135M-Instruct", prompt=[999_999_999], max_tokens=2)
    answer = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Count to ten."}], max_tokens=3
    )
    assert answer.usage.completion_tokens <= 3
    assert live.unfinished() == 0


def test_embeddings_with_the_official_client(oai):
    """The SDK's embeddings.create (base64 by default, decoded by the SDK) and with
    encoding_format="float": 384 floats per text, in order, the same vectors both ways, usage
    counted; a dimensions the model cannot give is a BadRequestError."""
    _, client, _ = oai
    texts = ["A red apple.", "The stock market fell today."]

    packed = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    plain = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="float")

    assert [d.index for d in packed.data] == [0, 1]
    assert all(len(d.embedding) == 384 for d in packed.data)
    for a, b in zip(packed.data, plain.data, strict=True):
        assert max(abs(x - y) for x, y in zip(a.embedding, b.embedding, strict=True)) < 1e-6
    assert packed.usage.prompt_tokens == packed.usage.total_tokens > len(texts)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="all-MiniLM-L6-v2", input="hi", dimensions=128)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                               "parameters": {"type": "object", "properties": {}}}}
WEATHER_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _valid_weather_call(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
    return arguments


def test_tools_named_and_required_give_calls_valid_against_the_schema(oai):
    """The real model with tool_choice naming get_weather, and with required (one of two
    tools, parallel calls off): finish_reason tool_calls, no content, and arguments that are
    JSON valid against the function's schema (structured output: by construction)."""
    _, client, _ = oai
    named = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=WEATHER_ASK, tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=40, temperature=0,
    )  # fmt: skip
    required = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=WEATHER_ASK, tools=[WEATHER_TOOL],
        tool_choice="required", parallel_tool_calls=False, max_tokens=60, temperature=0,
    )  # fmt: skip

    for result in (named, required):
        choice = result.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        assert len(choice.message.tool_calls) == 1
        _valid_weather_call(choice.message.tool_calls[0])
        assert result.usage.prompt_tokens > 100  # the tools section is in the prompt


def test_tools_round_trip_call_then_result_then_answer(oai):
    """A full round trip as OpenAI clients run it: the model calls get_weather (required), the
    client sends the call back with a tool message carrying its id and the result, and the
    model answers in text (auto) with finish_reason stop or length."""
    _, client, _ = oai
    first = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=WEATHER_ASK, tools=[WEATHER_TOOL],
        tool_choice="required", max_tokens=60, temperature=0,
    )  # fmt: skip
    call = first.choices[0].message.tool_calls[0]
    _valid_weather_call(call)
    history = [
        *WEATHER_ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21, "sky": "sunny"})},
    ]

    second = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=history, tools=[WEATHER_TOOL], tool_choice="none",
        max_tokens=30, temperature=0,
    )  # fmt: skip

    choice = second.choices[0]
    assert choice.finish_reason in {"stop", "length"}
    assert choice.message.content.strip() and not choice.message.tool_calls


def test_tools_streamed_and_auto(oai):
    """Streamed with a named function: deltas by index 0, the id and name first, the arguments
    as string fragments that join into valid JSON, finish_reason tool_calls, usage in the last
    chunk. With auto, the real model either calls a known function with JSON arguments or
    answers in text: never a half-parsed call."""
    _, client, _ = oai
    chunks = list(client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=WEATHER_ASK, tools=[WEATHER_TOOL], stream=True,
        stream_options={"include_usage": True},
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=40, temperature=0,
    ))  # fmt: skip
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].id.startswith("call_") and calls[0].function.name == "get_weather"
    assert {tc.index for tc in calls} == {0} and len(calls) > 2
    arguments = json.loads("".join(tc.function.arguments or "" for tc in calls))
    assert isinstance(arguments["city"], str)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    auto = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=WEATHER_ASK, tools=[WEATHER_TOOL, TIME_TOOL],
        max_tokens=60, temperature=0,
    ).choices[0]  # fmt: skip
    if auto.message.tool_calls:
        assert auto.finish_reason == "tool_calls"
        for call in auto.message.tool_calls:
            assert call.function.name in {"get_weather", "get_time"}
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert auto.message.content and "<tool_call>" not in auto.message.content.split("</tool_call>")[-1]
