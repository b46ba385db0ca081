"""conversations.services: validation, titles, append-only writes."""

from __future__ import annotations

import uuid

import pytest
from django.core.exceptions import ValidationError

from conversations import deletion, services
from conversations.models import Turn

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("content", ["", "   ", "\n\t \n"])
def test_message_clean_rejects_empty_or_whitespace(content):
    with pytest.raises(ValidationError) as err:
        services.message_clean(content)
    assert err.value.code == "empty"


def test_message_clean_rejects_over_the_limit(settings):
    settings.CHAT_MAX_MESSAGE_CHARS = 10
    with pytest.raises(ValidationError) as err:
        services.message_clean("x" * 11)
    assert err.value.code == "too_long"
    assert "limit is 10" in err.value.messages[0]


def test_message_clean_strips_and_keeps_inner_newlines():
    assert services.message_clean("  line one\nline two \n") == "line one\nline two"


def test_title_from_message_cuts_at_a_word_boundary(settings):
    settings.CHAT_TITLE_CHARS = 20
    title = services.title_from_message("How do I reverse a linked list in Rust?\nThanks")
    assert title == "How do I reverse a\u2026"
    assert len(title) <= 20


def test_first_user_turn_names_the_conversation(make_user):
    conversation = services.conversation_create(owner=make_user())
    services.turn_append_user(conversation=conversation, content="Plan a trip to Lisbon")
    services.turn_append_user(conversation=conversation, content="Second question")
    conversation.refresh_from_db()
    assert conversation.title == "Plan a trip to Lisbon"
    assert conversation.region == conversation.owner.region


def test_invalid_message_stores_nothing(make_user):
    conversation = services.conversation_create(owner=make_user())
    with pytest.raises(ValidationError):
        services.turn_append_user(conversation=conversation, content="   ")
    assert not Turn.objects.exists()


def test_assistant_turn_is_stored_once_per_turn_id(make_user):
    """A retried write (same turn id) never stores an answer twice."""
    conversation = services.conversation_create(owner=make_user())
    question = services.turn_append_user(conversation=conversation, content="hi")
    answer_id = uuid.uuid4()
    kwargs = dict(
        conversation_id=conversation.pk,
        turn_id=answer_id,
        reply_to_id=question.turn_id,
        status=Turn.Status.COMPLETE,
        prompt_tokens=7,
        completion_tokens=2,
    )
    first = services.turn_append_assistant(content="Hello!", **kwargs)
    again = services.turn_append_assistant(content="Something else", **kwargs)
    assert again.content == first.content == "Hello!"
    assert Turn.objects.filter(role=Turn.Role.ASSISTANT).count() == 1


def test_rename_rejects_blank_title(make_user):
    conversation = services.conversation_create(owner=make_user())
    with pytest.raises(ValidationError):
        services.conversation_rename(conversation=conversation, title="   ")


def test_delete_removes_the_turns(make_user):
    conversation = services.conversation_create(owner=make_user())
    services.turn_append_user(conversation=conversation, content="hi")
    deletion.conversation_delete(conversation=conversation)
    assert not Turn.objects.exists()


def test_message_with_nul_character_is_refused():
    """PostgreSQL text cannot store U+0000: refused with a message, never a 500 (found by
    schemathesis)."""
    with pytest.raises(ValidationError) as err:
        services.message_clean("hello\x00world")
    assert err.value.code == "nul"
