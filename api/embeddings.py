"""``POST /v1/embeddings`` in OpenAI's wire format, from the embedding model the project ships
for memory (inference/embeddings.py: all-MiniLM-L6-v2, 384 dimensions, L2-normalised).

Shapes follow OpenAI's API reference ("Create embeddings"): the request's ``input`` is a string
or a list of strings; the response is ``{"object": "list", "data": [{"object": "embedding",
"index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}``, each embedding
a list of floats or, for ``encoding_format: "base64"``, the base64 of its little-endian float32
bytes (the official Python SDK asks for base64 unless told otherwise and decodes it).

Refused with a 400 naming the problem: token-id input (OpenAI's token ids are another
vocabulary), an empty text, a text longer than the model reads (256 word pieces: OpenAI refuses
an input over the context rather than cut it, and so do we), more than
``CHAT_EMBEDDING_MAX_INPUTS`` inputs, a ``dimensions`` other than the model's (it is not trained
to be shortened). An unknown model is a 404 ``model_not_found``, as for chat.

Counted against the caller's TPM (and one request against RPM), the prompt tokens being the
word pieces read; no completion. The texts are embedded off the event loop, 32 at a time, so a
large request shares the model with the chat turns' memory queries instead of holding it.
"""

from __future__ import annotations

import asyncio
import base64

import numpy as np
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from accounts.callers import acaller_for
from api import schemas
from core.errors import ApiError
from core.http import api_view, parse_json
from gateway import gate
from inference import embeddings

BATCH = 32  # texts per call into the model (inference/embeddings.py embeds 32 at a time too)


def _texts(body: schemas.EmbeddingCreate) -> list[str]:
    """The request's texts, in order. Raises ApiError 400 for token ids, an empty list or
    text, or too many inputs."""
    raw = body.input
    texts = [raw] if isinstance(raw, str) else list(raw)
    if not texts:
        raise ApiError(400, "invalid_request", "input: give a text or a non-empty list of texts.")
    if not all(isinstance(t, str) for t in texts):
        raise ApiError(
            400, "invalid_request",
            "input: token ids are not accepted; send the text itself (this model's vocabulary is "
            "not OpenAI's).",
        )  # fmt: skip
    limit = settings.CHAT_EMBEDDING_MAX_INPUTS
    if len(texts) > limit:
        raise ApiError(400, "invalid_request", f"input: at most {limit} texts per request; this one has {len(texts)}.")
    for index, text in enumerate(texts):
        if not text.strip():
            raise ApiError(400, "invalid_request", f"input[{index}]: the text is empty.")
    return texts


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    """``vector`` as the response carries it: the floats, or base64 of little-endian float32."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


@api_view("POST")
async def create_embeddings(request: HttpRequest) -> HttpResponse:
    """``POST /v1/embeddings`` (module docstring). Raises (rendered by ``api_view``) ApiError
    400 / 404 as the module docstring lists, 415/413 for a body that is not JSON or too large,
    gate.Refused 429 when the caller's RPM or TPM bucket is short."""
    body = parse_json(request, schemas.EmbeddingCreate)
    name = settings.CHAT_EMBEDDING_MODEL_NAME
    if body.model != name:
        raise ApiError(404, "model_not_found", f"The embedding model '{body.model}' does not exist; use '{name}'.")
    dimension = embeddings.embedding_dimension()
    if body.dimensions is not None and body.dimensions != dimension:
        raise ApiError(
            400, "invalid_request",
            f"dimensions: {name} gives {dimension}-dimension vectors and cannot shorten them; "
            f"leave dimensions out or send {dimension}.",
        )  # fmt: skip
    texts = _texts(body)
    counts, most = await asyncio.to_thread(embeddings.token_counts, texts)
    for index, count in enumerate(counts):
        if count > most:
            raise ApiError(
                400, "context_length_exceeded",
                f"input[{index}]: {count} tokens; {name} reads at most {most}. Split the text.",
            )  # fmt: skip
    prompt_tokens = sum(counts)
    caller = await acaller_for(request.api_user)
    decision = await gate.rate_limit(caller, prompt_tokens=prompt_tokens, max_tokens=0)
    vectors: list[list[float]] = []
    for start in range(0, len(texts), BATCH):
        vectors += await asyncio.to_thread(embeddings.embed, texts[start : start + BATCH])
    response = JsonResponse(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
                for i, v in enumerate(vectors)
            ],
            "model": name,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
    )
    if decision is not None:
        for header, value in decision.headers().items():
            response[header] = value
    return response
