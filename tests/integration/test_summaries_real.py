"""Summaries for real: a conversation outgrows its budget on the real uvicorn server with the real
vLLM engine; the summarisation task goes through the real broker to a real Celery worker
(tests/processes.py), which calls the server's own /v1/chat/completions with the service key;
the next turn's prompt carries the summary and fewer raw turns.

The context is shrunk through settings (the engine keeps its own 4,096 tokens; only the prompt
budget the assembler works with is smaller), the same values in the server and the worker."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
import yaml

from accounts.models import ApiKey
from accounts.services import api_key_create
from chatsite.celery import app
from conversations import services
from conversations.models import Conversation, Turn
from tests.processes import celery_worker_process

pytestmark = [pytest.mark.real_engine, pytest.mark.django_db(transaction=True)]

SMALL_CONTEXT = {
    "CHAT_MAX_MODEL_LEN": 640,
    "CHAT_MAX_TOKENS": 40,
    "CHAT_SUMMARY_MAX_TOKENS": 64,
    "CHAT_SUMMARY_KEEP_FRACTION": 0.5,
}
FACTS = [
    ("name", "Ada Lovelace"), ("city", "Lyon"), ("pet", "a grey cat called Pixel"),
    ("job", "bee keeping"), ("car", "a red bicycle"), ("food", "lentil soup"),
    ("sport", "rowing"), ("book", "Moby Dick"), ("music", "baroque organ music"),
    ("garden", "tomatoes and basil"), ("holiday", "Lisbon in May"), ("language", "Portuguese"),
]  # fmt: skip


@pytest.fixture
def queued_to_real_workers():
    """Tasks go through the real broker (Redis) to a real worker for this test."""
    app.conf.task_always_eager = False
    try:
        yield
    finally:
        app.conf.task_always_eager = True


@pytest.fixture
def engine_prompts(live, monkeypatch) -> list[tuple[str, list[int]]]:
    """(request id, prompt token ids) of every generation the real engine is asked for."""
    seen: list[tuple[str, list[int]]] = []
    original = live.engine.generate

    def generate(prompt_token_ids, options, request_id):
        seen.append((request_id, list(prompt_token_ids)))
        return original(prompt_token_ids, options, request_id)

    monkeypatch.setattr(live.engine, "generate", generate)
    return seen


def wait_until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)
    return value


def post_turn(live, key: str, conversation_id, content: str) -> str:
    """Send a turn over /v1 and read its stream to the end; the answer's turn id."""
    with httpx.Client(base_url=live.url, timeout=120) as client:
        with client.stream(
            "POST", f"/v1/conversations/{conversation_id}/turns",
            json={"role": "user", "content": content},
            headers={"Authorization": f"Bearer {key}"},
        ) as response:  # fmt: skip
            assert response.status_code == 200, response.read()
            body = "".join(response.iter_text())
            answer_id = response.headers["X-Turn-Id"]
    assert "event: done" in body, body[-500:]
    live.drain()
    return answer_id


def user_messages(live, ids: list[int]) -> int:
    return live.engine._require_tokenizer().decode(ids).count("<|im_start|>user")


def test_a_real_worker_summarises_through_the_server_and_the_next_prompt_uses_it(
    live, make_user, tmp_path, settings, engine_prompts, queued_to_real_workers
):
    """Given 12 exchanges that overflow a 600-token prompt budget, when a new turn is
    answered, then its prompt dropped the oldest exchanges and a real Celery worker, called
    through the broker, summarises them by the server's /v1/chat/completions (as the service
    user) into a non-empty stored summary; and when the next turn is answered, its prompt
    carries that summary and fewer raw turns than the conversation has, and the answer records
    the summarised exchanges in context_trimmed."""
    # The pools set the prompt budget: every pool shrinks to the small context, here and in the
    # worker (a pool file both read).
    pools_file = tmp_path / "pools.yaml"
    pools_file.write_text(yaml.safe_dump(
        [{**p, "max_context": SMALL_CONTEXT["CHAT_MAX_MODEL_LEN"], "max_tokens": 320} for p in settings.CHAT_POOLS]
    ))  # fmt: skip
    settings.CHAT_POOLS_FILE = str(pools_file)
    for name, value in SMALL_CONTEXT.items():
        setattr(settings, name, value)
    settings.CHAT_TEMPERATURE = 0.0
    user = make_user("sam")
    key = api_key_create(user=user, name="test").raw
    conversation = services.conversation_create(owner=user)
    for thing, value in FACTS:
        q = services.turn_append_user(
            conversation=conversation,
            content=f"Please remember this about me: my {thing} is {value}. It matters to me a lot.",
        )
        services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=q.turn_id,
            content=f"Noted. Your {thing} is {value}. I will keep that in mind for later.",
            status="complete", prompt_tokens=10, completion_tokens=20,
        )  # fmt: skip
    env = {name: str(value) for name, value in SMALL_CONTEXT.items()}
    env["CHAT_INTERNAL_API_URL"] = live.url
    env["CHAT_POOLS_FILE"] = str(pools_file)

    with celery_worker_process(tmp_path, env) as worker:
        first_id = post_turn(live, key, conversation.pk, "What is my city?")
        first_prompt = next(ids for rid, ids in engine_prompts if rid == first_id)
        first = wait_until(lambda: Turn.objects.filter(pk=first_id).first(), 60, "the first answer written back")
        assert first.context_trimmed > 0  # exchanges had to go
        assert user_messages(live, first_prompt) < len(FACTS) + 1

        summarised = wait_until(
            lambda: Conversation.objects.filter(pk=conversation.pk).exclude(summary="").first(),
            240, f"the worker's summary (worker log: {worker.log_path})",
        )  # fmt: skip
        assert "conversation_summarise" in worker.log()
        assert any(rid.startswith("chatcmpl-") for rid, _ in engine_prompts)  # via the endpoint
        service_key = ApiKey.objects.get(user__username=settings.CHAT_SERVICE_USERNAME)
        assert service_key.last_used_at is not None

        second_id = post_turn(live, key, conversation.pk, "And what is my pet?")
        second = wait_until(lambda: Turn.objects.filter(pk=second_id).first(), 60, "the second answer")

    second_prompt = next(ids for rid, ids in engine_prompts if rid == second_id)
    text = live.engine._require_tokenizer().decode(second_prompt)
    assert summarised.summary.strip() and summarised.summary in text
    raw = user_messages(live, second_prompt) - 1  # the question itself aside
    positions = len(FACTS) + 1  # the seeded exchanges and the first new turn
    assert raw < positions
    summarised_positions = Turn.objects.filter(
        conversation=conversation, role="user", created_at__lte=summarised.summary_through
    ).count()
    assert summarised_positions > 0
    assert second.context_trimmed >= summarised_positions
    assert raw + second.context_trimmed == positions
