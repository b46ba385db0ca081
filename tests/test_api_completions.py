"""The OpenAI-style completions endpoints with the scripted engine double: /v1/completions with
token-id or text prompts, streamed chunks then usage, refused models and prompts, and
/v1/chat/completions honouring a small max_tokens."""

from __future__ import annotations

import json

import pytest

from tests.api_support import api_client, assert_error, post_json
from tests.chat_support import read_stream

pytestmark = pytest.mark.django_db(transaction=True)


async def test_text_completion_accepts_token_id_prompts_as_is(make_user, engine_double):
    """/v1/completions (used by gateways without an engine): a token-id prompt reaches the
    engine unchanged, no chat template; usage is reported."""
    engine_double.scripts = [["Hi", " there"]]
    client, _ = await api_client(make_user)
    response = await post_json(
        client, "/v1/completions",
        {"model": "SmolLM2-135M-Instruct", "prompt": [5, 6, 7], "max_tokens": 20, "temperature": 0},
    )  # fmt: skip
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "Hi there"
    assert body["usage"] == {
        "prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }  # fmt: skip
    assert engine_double.requests[0][0] == [5, 6, 7]
    assert engine_double.requests[0][1].max_tokens == 20


async def test_text_completion_streams_chunks_then_usage_then_done(make_user, engine_double):
    engine_double.scripts = [["a", "b"]]
    client, _ = await api_client(make_user)
    response = await post_json(
        client, "/v1/completions",
        {"model": "SmolLM2-135M-Instruct", "prompt": "Once", "stream": True, "stream_options": {"include_usage": True}},
    )  # fmt: skip
    raw = (await read_stream(response)).decode()
    datas = [line[6:] for line in raw.split("\n") if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "ab"
    assert chunks[-1]["usage"]["completion_tokens"] == 2


async def test_text_completion_rejects_unknown_model_and_bad_prompts(make_user, engine_double):
    client, _ = await api_client(make_user)
    assert_error(await post_json(client, "/v1/completions", {"model": "x", "prompt": "hi"}), 404, "model_not_found")
    assert_error(await post_json(client, "/v1/completions", {"model": "SmolLM2-135M-Instruct", "prompt": [-1]}), 400, "invalid_request")
    assert_error(await post_json(client, "/v1/completions", {"model": "SmolLM2-135M-Instruct", "prompt": []}), 400, "invalid_request")
    assert engine_double.requests == []


@pytest.mark.parametrize("prompt", [[999_999_999], [5, 49152]])
async def test_out_of_vocabulary_token_ids_get_400_not_500(make_user, engine_double, prompt):
    """/v1/completions with token ids the model does not know: a 400 the caller can act on;
    the engine is never asked."""
    client, _ = await api_client(make_user)
    response = await post_json(
        client, "/v1/completions", {"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": 2}
    )
    assert_error(response, 400, "invalid_request")
    assert "vocabulary" in response.json()["error"]["message"]
    assert engine_double.requests == []


@pytest.mark.parametrize("max_tokens", [1, 5, 15])
async def test_chat_completions_honour_a_small_max_tokens(make_user, engine_double, max_tokens):
    """max_tokens below the prompt-shrinking floor (16) is the caller's choice, not a context
    overflow: 200, and the engine is asked for exactly that many."""
    client, _ = await api_client(make_user)
    body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    response = await post_json(client, "/v1/chat/completions", body)
    assert response.status_code == 200, response.content
    assert engine_double.requests[0][1].max_tokens == max_tokens
