"""The production run mode with the real model: ``python -m chatsite.prodstack run
--engine-url`` (gateways without an engine, using a remote engine server: here the session's
shared daphne with the real vLLM engine) behind nginx with TLS, production settings.

A turn goes browser-side -> nginx (HTTPS) -> a gateway -> the engine server's OpenAI-compatible
/v1/completions (service key) -> vLLM, and its tokens stream back the same way; the Celery worker
writes the answer to PostgreSQL. tests/integration/test_production.py checks the rest of the
mode with the scripted engine.
"""

from __future__ import annotations

import contextlib
import time

import pytest

from tests.integration.test_production import _create_user, _stream_turn, run_prodstack

pytestmark = pytest.mark.real_engine


@pytest.fixture
def real_stack(live, tmp_path):
    """Two engine-less gateways, Celery and nginx, with the session's real engine as their
    engine server (``live``: its test data is flushed after the test)."""
    _create_user("prod-real")
    with run_prodstack(
        tmp_path,
        gateways=2,
        extra_args=["--engine-url", live.url],
        extra_env={"CHAT_MAX_TOKENS": "48"},
    ) as running:
        yield running


def test_a_real_answer_streams_through_the_production_mode(real_stack, live):
    """Given the production mode in front of the real engine; when a user sends a message
    through nginx; then the model's tokens stream back as token events, the stream ends with
    done, and the stored answer (written back by the Celery worker) is exactly the streamed
    text, with the engine's token count."""
    from conversations.models import Turn  # noqa: PLC0415

    client, _ = real_stack.login("prod-real")
    with contextlib.closing(client):
        _, tokens, done = _stream_turn(client, "Write a short story about a lighthouse keeper.")
    assert done["event"] == "done" and done["status"] == "complete", done
    assert len(tokens) >= 10, tokens
    deadline = time.monotonic() + 60
    while not Turn.objects.filter(turn_id=done["turn_id"]).exists():
        assert time.monotonic() < deadline, real_stack.log("celery-worker")
        time.sleep(0.3)
    stored = Turn.objects.get(turn_id=done["turn_id"])
    assert stored.content == "".join(tokens)
    assert stored.token_count == done["usage"]["completion_tokens"] > 0
