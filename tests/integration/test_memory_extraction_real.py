"""Memory extraction for real: the extraction asks the real uvicorn server's /v1/chat/completions
(the service credential) for facts, the real vLLM engine answers under the JSON schema (structured
output), and the facts are embedded and stored. The pipeline is what is judged here, not the
135M model's judgement of what a fact is."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest

from conversations import services
from memory import extraction
from memory.extraction_models import ExtractionMarker
from memory.models import UserMemory

pytestmark = [pytest.mark.real_engine, pytest.mark.django_db(transaction=True)]

STATEMENTS = [
    ("My name is Ada and I live in Lyon, in France.", "Nice to meet you, Ada from Lyon."),
    ("I have a grey cat called Pixel.", "Pixel sounds lovely."),
    ("I work as a bee keeper and I love lentil soup.", "Bee keeping and lentil soup, noted."),
]


@pytest.fixture
def engine_requests(live, monkeypatch) -> list:
    """(request id, options) of every generation the real engine is asked for."""
    seen = []
    original = live.engine.generate

    def generate(prompt_token_ids, options, request_id):
        seen.append((request_id, options))
        return original(prompt_token_ids, options, request_id)

    monkeypatch.setattr(live.engine, "generate", generate)
    return seen


def test_an_idle_conversation_yields_stored_facts_through_the_real_engine(
    live, make_user, settings, engine_requests, monkeypatch
):
    """Given a conversation in which the user states facts about themselves, idle for
    CHAT_MEMORY_IDLE_S, when it is extracted, then the server's endpoint was asked once, as the
    service user at the background priority with the facts schema; the engine's answer is the
    schema's JSON; at least one fact is stored, extracted from that conversation; and a second
    run does nothing."""
    settings.CHAT_INTERNAL_API_URL = live.url
    answers = []
    original = extraction.chat_complete_json
    monkeypatch.setattr(
        extraction, "chat_complete_json", lambda *a, **k: answers.append(original(*a, **k)) or answers[-1]
    )
    user = make_user("ada")
    conversation = services.conversation_create(owner=user)
    for question, reply in STATEMENTS:
        q = services.turn_append_user(conversation=conversation, content=question)
        services.turn_append_assistant(
            conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=q.turn_id,
            content=reply, status="complete", prompt_tokens=10, completion_tokens=8,
        )  # fmt: skip
    conversation.refresh_from_db()
    now = conversation.last_turn_at + timedelta(seconds=settings.CHAT_MEMORY_IDLE_S + 1)

    result = extraction.conversation_memory_extract(conversation_id=conversation.pk, now=now)
    again = extraction.conversation_memory_extract(conversation_id=conversation.pk, now=now)
    live.drain()

    [answer] = answers
    data = json.loads(answer)  # structured output: the schema's JSON, whatever the facts
    assert set(data) == {"facts"} and all(isinstance(f, str) for f in data["facts"])
    [(request_id, options)] = engine_requests
    assert request_id.startswith("chatcmpl-")  # through the OpenAI-compatible endpoint
    assert options.json_schema == extraction.facts_schema()
    assert options.priority == settings.CHAT_BACKGROUND_PRIORITY
    assert result.status == "stored" and result.stored >= 1, answer
    facts = list(UserMemory.objects.filter(user=user))
    assert len(facts) == result.stored
    assert all(f.source == "extracted" and f.source_conversation_id == conversation.pk for f in facts)
    assert all(0 < len(f.text) <= settings.CHAT_MEMORY_FACT_CHARS for f in facts)
    assert again.status == "done"
    assert ExtractionMarker.objects.get(pk=conversation.pk).extracted_through == conversation.last_turn_at
