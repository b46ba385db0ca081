"""What careless or hostile OpenAI-client code sends to /v1, with the scripted engine double:
bodies the parser must survive (deep nesting, a byte order mark) and sampling values the engine
(vLLM) would refuse with an exception, which must be a 400 naming the field, before any engine
request, instead of a 500."""

from __future__ import annotations

import json

import pytest

from conversations.models import Conversation
from inference.tool_format import ToolCalling
from tests.api_support import api_client, assert_error, post_json

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "hi"}]
INT64_MAX = 2**63 - 1


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": ASK, **fields}


# --- bodies -----------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["/v1/chat/completions", "/v1/conversations", "/v1/projects"])
async def test_a_deeply_nested_body_gets_400_not_500(make_user, engine_double, url):
    """Given a JSON body nested 100,000 arrays deep (a parser-recursion attack), then a 400
    saying so, not a RecursionError's 500."""
    client, _ = await api_client(make_user)
    nested = '{"model": ' + "[" * 100_000 + "]" * 100_000 + "}"

    response = await client.post(url, nested, content_type="application/json")

    assert_error(response, 400, "invalid_request")
    assert "deep" in response.json()["error"]["message"]
    assert engine_double.requests == []


async def test_a_body_with_a_utf8_byte_order_mark_is_read_as_json(make_user):
    """Given a JSON body that starts with a UTF-8 BOM (what some Windows tools write), then it
    is read as the JSON after it (RFC 8259 section 8.1 lets a parser ignore the mark)."""
    client, _ = await api_client(make_user)
    body = b"\xef\xbb\xbf" + json.dumps({"system_prompt": "Answer in French."}).encode()

    response = await client.post("/v1/conversations", body, content_type="application/json")

    assert response.status_code == 201, response.content
    conversation = await Conversation.objects.aget(pk=response.json()["conversation_id"])
    assert conversation.system_prompt == "Answer in French."


# --- sampling values the engine refuses --------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "body"),
    [
        ("/v1/chat/completions", chat(stop="")),
        ("/v1/chat/completions", chat(stop=["END", ""])),
        ("/v1/completions", {"model": MODEL, "prompt": "Once", "stop": ""}),
    ],
)
async def test_an_empty_stop_sequence_gets_400_before_the_engine(make_user, engine_double, url, body):
    """Given ``stop`` with an empty string (vLLM's SamplingParams raises "stop cannot contain
    an empty string"), then a 400 naming ``stop``, and the engine is never asked."""
    client, _ = await api_client(make_user)

    response = await post_json(client, url, body)

    assert_error(response, 400, "invalid_request")
    assert "stop" in response.json()["error"]["message"]
    assert engine_double.requests == []


@pytest.mark.parametrize("seed", [INT64_MAX + 1, -INT64_MAX - 2, 10**30])
@pytest.mark.parametrize("url", ["/v1/chat/completions", "/v1/completions"])
async def test_a_seed_outside_64_bits_gets_400_before_the_engine(make_user, engine_double, url, seed):
    """Given a ``seed`` that does not fit a signed 64-bit integer (vLLM's own OpenAI server
    bounds it so; the engine's generator cannot take it), then a 400 naming ``seed``."""
    client, _ = await api_client(make_user)
    body = chat(seed=seed) if url.endswith("chat/completions") else {"model": MODEL, "prompt": "Once", "seed": seed}

    response = await post_json(client, url, body)

    assert_error(response, 400, "invalid_request")
    assert "seed" in response.json()["error"]["message"]
    assert engine_double.requests == []


async def test_the_largest_64_bit_seed_reaches_the_engine(make_user, engine_double):
    client, _ = await api_client(make_user)

    response = await post_json(client, "/v1/chat/completions", chat(seed=INT64_MAX))

    assert response.status_code == 200, response.content
    assert engine_double.requests[0][1].seed == INT64_MAX


@pytest.mark.parametrize("field", ["temperature", "top_p"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
async def test_a_non_finite_sampling_number_is_named_as_such(make_user, engine_double, field, value):
    """Given ``temperature`` or ``top_p`` as NaN or Infinity (Python's JSON spellings), then a
    400 saying the number must be finite (not "less than or equal to 2", which NaN is)."""
    client, _ = await api_client(make_user)
    raw = json.dumps(chat())[:-1] + f', "{field}": {value}}}'

    response = await client.post("/v1/chat/completions", raw, content_type="application/json")

    assert_error(response, 400, "invalid_request")
    message = response.json()["error"]["message"]
    assert field in message and "finite" in message
    assert engine_double.requests == []


@pytest.mark.parametrize(
    "schema", [{"type": "nope"}, {"type": "object", "properties": {"a": {"minLength": "three"}}}]
)
async def test_a_response_format_schema_that_is_not_json_schema_gets_400(make_user, engine_double, schema):
    """Given ``response_format`` ``json_schema`` whose schema is not a JSON Schema (vLLM's
    structured output raises on it), then a 400 naming the field, as for a tool's parameters."""
    client, _ = await api_client(make_user)
    body = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})

    response = await post_json(client, "/v1/chat/completions", body)

    assert_error(response, 400, "invalid_request")
    assert "response_format.json_schema.schema" in response.json()["error"]["message"]
    assert engine_double.requests == []


async def test_content_as_an_empty_list_of_parts_gets_400(make_user, engine_double):
    """Given a message whose ``content`` is ``[]`` (no parts), then a 400 naming the message,
    as OpenAI answers ("empty array"), not a completion of an empty message."""
    client, _ = await api_client(make_user)

    response = await post_json(client, "/v1/chat/completions", chat(messages=[{"role": "user", "content": []}]))

    assert_error(response, 400, "invalid_request")
    assert "messages.0.content" in response.json()["error"]["message"]
    assert engine_double.requests == []


async def test_a_past_calls_deeply_nested_arguments_are_read_as_text(make_user, engine_double):
    """Given an assistant message in the history whose call ``arguments`` nest 5,000 arrays
    deep, then the call is written into the prompt as its text (as arguments that are not JSON
    are), not a RecursionError's 500."""
    client, _ = await api_client(make_user)
    arguments = "[" * 5000 + "]" * 5000
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1", "content": "r"}]

    response = await post_json(client, "/v1/chat/completions", chat(messages=history))

    assert response.status_code == 200, response.content
    assert len(engine_double.requests) == 1


def _nested_arrays_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return {"type": "object", "properties": {"a": schema}}


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": _nested_arrays_schema(150)}}]},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": _nested_arrays_schema(150)}}},
    ],
    ids=["tool parameters", "response_format"],
)
async def test_a_schema_nested_too_deeply_to_check_gets_400(make_user, engine_double, fields):
    """Given a JSON Schema of 150 nested arrays (within the body parser's depth, beyond what the
    meta-schema check can recurse through), then a 400 saying it nests too deeply, not a
    RecursionError's 500."""
    client, _ = await api_client(make_user)

    response = await post_json(client, "/v1/chat/completions", chat(**fields))

    assert_error(response, 400, "invalid_request")
    assert "deep" in response.json()["error"]["message"]
    assert engine_double.requests == []


# --- nulls OpenAI's API takes ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "body"),
    [
        ("/v1/chat/completions", chat(stream=None, n=None)),
        ("/v1/completions", {"model": MODEL, "prompt": "Once", "stream": None, "n": None}),
    ],
)
async def test_stream_and_n_may_be_null_as_openai_takes_them(make_user, engine_double, url, body):
    """Given ``"stream": null`` and ``"n": null`` (nullable in OpenAI's API; clients that write
    every field send them), then the defaults: one answer, not streamed."""
    client, _ = await api_client(make_user)

    response = await post_json(client, url, body)

    assert response.status_code == 200, response.content
    assert len(response.json()["choices"]) == 1


# --- content parts ------------------------------------------------------------------------------


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}])
async def test_a_part_that_is_not_text_gets_one_clear_400(make_user, engine_double, part):
    """Given OpenAI's image or audio content part, then a 400 that names the part and says the
    model reads text only (one message, not the per-branch errors of the content union)."""
    client, _ = await api_client(make_user)
    content = [{"type": "text", "text": "What is this?"}, part]

    response = await post_json(client, "/v1/chat/completions", chat(messages=[{"role": "user", "content": content}]))

    assert_error(response, 400, "invalid_request")
    message = response.json()["error"]["message"]
    assert f"content[1] is a '{part['type']}' part" in message and "text only" in message
    assert "Input should be a valid string" not in message
    assert engine_double.requests == []


# --- what the model writes --------------------------------------------------------------------

WEATHER = {"weather": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(
    "text",
    ['{"name": "weather", "arguments": {}}', '[{"arguments": {}}]', '[{"name": "weather", "arguments": "x"}]',
     "[]", '["weather"]', "[" * 100_000 + "]" * 100_000],
    ids=["an object", "no name", "arguments not an object", "no calls", "a name only", "nested too deeply"],
)  # fmt: skip
def test_a_required_answer_that_is_not_a_list_of_calls_is_content_not_a_500(text):
    """Given tool_choice required and an answer that is JSON but not ``[{"name", "arguments":
    {...}}, ...]`` (guided decoding prevents it on the real engine; a cut-off or unconstrained
    answer does not), then the answer is the content with no calls (was: TypeError or KeyError,
    a 500)."""
    assert ToolCalling("required", WEATHER).parse(text) == (text, [])


def test_an_auto_answer_nested_too_deeply_holds_no_call():
    """Given tool_choice auto and a ``<tool_call>`` block (or its arguments) nested deeper than
    Python's parser recurses, then it is no call (was: RecursionError, a 500)."""
    deep = "[" * 100_000 + "]" * 100_000
    for block in (deep, json.dumps({"name": "weather", "arguments": deep})):
        text = f"<tool_call>\n{block}\n</tool_call>"
        assert ToolCalling("auto", WEATHER).parse(text) == (text, [])
