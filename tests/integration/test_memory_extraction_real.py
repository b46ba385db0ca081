"""Memory end to end (issue 28): the real uvicorn server with the real vLLM engine answers every
turn over /v1, explicit requests change memory as each message is sent, and a real Celery worker,
reached through the broker, extracts the facts of the idle conversation from the user's own
messages into PostgreSQL, each grounded in a user turn."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F

from accounts.services import api_key_create
from conversations import services
from conversations.models import Conversation, Turn
from memory import extraction, tasks
from memory.extraction_models import ExtractionMarker
from memory.models import MemoryUpdate, UserMemory
from chatsite.celery import app
from tests.integration.test_summaries_real import post_turn, wait_until
from tests.processes import celery_worker_process

pytestmark = [pytest.mark.real_engine, pytest.mark.django_db(transaction=True)]


def test_requests_apply_at_once_and_a_real_worker_extracts_only_what_the_user_said(
    live, make_user, tmp_path, settings
):
    """Given a user chatting with the real engine, when they send "remember that I'm
    vegetarian", it is stored at once with a Memory update; "forget that I'm vegetarian"
    removes it at once. When the conversation is idle and the sweep queues its extraction
    through the broker, a real worker stores "lives in Lyon" and the grey cat, grounded in
    the user's turn, and nothing from the translation or the engine's answers."""
    user = make_user("ada")
    key = api_key_create(user=user, name="test").raw
    conversation = services.conversation_create(owner=user)

    post_turn(live, key, conversation.pk, "Remember that I'm vegetarian.")
    assert list(UserMemory.objects.filter(user=user).values_list("text", flat=True)) == ["The user is vegetarian."]
    post_turn(live, key, conversation.pk, "I live in Lyon and I have a grey cat called Pixel.")
    post_turn(live, key, conversation.pk, "Translate into French: My name is John and I work at a hospital.")
    post_turn(live, key, conversation.pk, "Please forget that I'm vegetarian.")
    assert not UserMemory.objects.filter(user=user).exists()
    assert MemoryUpdate.objects.filter(user=user).count() == 2
    answers = list(Turn.objects.filter(conversation_id=conversation.pk, role=Turn.Role.ASSISTANT).values_list("content", flat=True))
    assert len(answers) == 4 and all(answers)  # the real engine answered every turn
    shift = timedelta(seconds=settings.CHAT_MEMORY_IDLE_S + 5)
    Turn.objects.filter(conversation_id=conversation.pk).update(created_at=F("created_at") - shift)
    Conversation.objects.filter(pk=conversation.pk).update(last_turn_at=F("last_turn_at") - shift)

    live.drain()
    app.conf.task_always_eager = False  # from here tasks go through the broker to the worker
    try:
        with celery_worker_process(tmp_path, {"CHAT_INTERNAL_API_URL": live.url}) as worker:
            assert extraction.memory_sweep(queue=tasks.memory_extract.delay) == [conversation.pk]
            wait_until(
                lambda: ExtractionMarker.objects.filter(pk=conversation.pk, extracted_through__isnull=False).exists(),
                120, f"the worker's extraction (log: {worker.log_path})",
            )  # fmt: skip
            assert "memory.memory_extract" in worker.log()
    finally:
        app.conf.task_always_eager = True

    facts = list(UserMemory.objects.filter(user=user))
    assert sorted(f.text for f in facts) == ["The user has a grey cat called Pixel.", "The user lives in Lyon."]
    for fact in facts:
        turn = Turn.objects.get(pk=fact.source_turn_id)
        assert turn.role == Turn.Role.USER and turn.content[fact.span_start : fact.span_end] == fact.span_text
