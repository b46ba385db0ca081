"""``POST /v1/embeddings`` (issue 30, part 1; api/embeddings.py) with the real embedding model
(all-MiniLM-L6-v2 from its wheel) through Django's async client: OpenAI's request and response
shapes, base64 encoding, TPM counting, and a clear 400 for what the model cannot do. The
official ``openai`` SDK drives the same endpoint in tests/integration/test_openai_compat.py."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from inference import embeddings
from tests.api_support import api_client, assert_error, post_json

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "all-MiniLM-L6-v2"


def error_message(response, status: int, type_: str) -> str:
    """The error's message, after checking its status and type (tests/api_support.py)."""
    assert_error(response, status, type_)
    return response.json()["error"]["message"]


async def test_a_list_of_texts_gives_one_normalised_vector_each_in_order_with_usage(make_user):
    """Given two texts, then the answer lists two 384-float embeddings with their indexes, each
    L2-normalised and equal to what memory's own embedding gives that text; usage counts the
    word pieces read (prompt = total)."""
    client, _ = await api_client(make_user)
    texts = ["The cat sat on the mat.", "Quarterly revenue grew by four percent."]

    response = await post_json(client, "/v1/embeddings", {"model": MODEL, "input": texts})

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0), ("embedding", 1)]
    vectors = np.array([d["embedding"] for d in body["data"]])
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert np.allclose(vectors, np.array(embeddings.embed(texts)), atol=1e-5)
    counts, _ = embeddings.token_counts(texts)
    assert body["usage"] == {"prompt_tokens": sum(counts), "total_tokens": sum(counts)}
    assert float(vectors[0] @ vectors[1]) < 0.5  # two unrelated texts are not the same vector


async def test_base64_is_little_endian_float32_of_the_same_vector(make_user):
    """Given one string and encoding_format base64 (the official SDK's default), then the
    embedding is a base64 string whose float32 little-endian bytes are the float answer's."""
    client, _ = await api_client(make_user)
    plain = (await post_json(client, "/v1/embeddings", {"model": MODEL, "input": "hello"})).json()
    packed = (
        await post_json(client, "/v1/embeddings", {"model": MODEL, "input": "hello", "encoding_format": "base64"})
    ).json()

    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    assert decoded.shape == (384,)
    assert np.allclose(decoded, plain["data"][0]["embedding"], atol=1e-6)


async def test_what_the_model_cannot_do_is_a_clear_400_or_404(make_user):
    """Token ids, an empty text, a text past 256 word pieces, a dimensions other than 384 and
    too many inputs are 400s naming the problem; an unknown model is a 404; dimensions=384 is
    fine."""
    client, _ = await api_client(make_user)

    async def post(**body):
        return await post_json(client, "/v1/embeddings", {"model": MODEL, "input": "hi", **body})

    assert "token ids" in error_message(await post(input=[1, 2, 3]), 400, "invalid_request")
    assert "token ids" in error_message(await post(input=[[1, 2], [3]]), 400, "invalid_request")
    assert "input[1]: the text is empty" in error_message(await post(input=["ok", "  "]), 400, "invalid_request")
    assert "non-empty list" in error_message(await post(input=[]), 400, "invalid_request")
    long = error_message(await post(input=["short", "word " * 400]), 400, "context_length_exceeded")
    assert "input[1]" in long and "at most 256" in long
    assert "384" in error_message(await post(dimensions=256), 400, "invalid_request")
    assert "use 'all-MiniLM-L6-v2'" in error_message(await post(model="text-embedding-3-small"), 404, "model_not_found")
    assert "at most 256 texts" in error_message(await post(input=["x"] * 257), 400, "invalid_request")
    assert (await post(dimensions=384)).status_code == 200


async def test_embeddings_count_against_the_callers_tpm(make_user, settings):
    """Given a TPM of 40 tokens, when texts of ~30 tokens are embedded twice, then the second
    request is a 429 rate_limited with Retry-After, and the first carried the remaining-quota
    headers."""
    settings.CHAT_RATE_LIMITS_BY_TIER = {"free": {"rpm": 100, "tpm": 40}}
    client, _ = await api_client(make_user)
    text = "one two three four five six seven eight nine ten " * 2
    counts, _ = embeddings.token_counts([text])
    assert 20 < counts[0] <= 40

    first = await post_json(client, "/v1/embeddings", {"model": MODEL, "input": text})
    second = await post_json(client, "/v1/embeddings", {"model": MODEL, "input": text})

    assert first.status_code == 200, first.content
    assert int(first["X-RateLimit-Remaining-Tokens"]) == 40 - counts[0]
    assert_error(second, 429, "rate_limited")
    assert int(second["Retry-After"]) >= 1


async def test_without_a_key_it_is_401(make_user):
    from django.test import AsyncClient

    response = await AsyncClient().post(
        "/v1/embeddings", '{"model": "all-MiniLM-L6-v2", "input": "hi"}', content_type="application/json"
    )
    assert response.status_code == 401
