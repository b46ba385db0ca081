"""The stored answer as the chat page renders it (issue 18): the Copy button carries the answer's
Markdown, a cut-off answer says at how many tokens, and the Markdown renderer's scripts are
loaded on the chat page only (the share page gets the highlighter alone)."""

from __future__ import annotations

import html
import uuid

import pytest
from django.test import Client

from conversations import services
from conversations.models import Turn
from sharing.services import share_link_create

pytestmark = pytest.mark.django_db(transaction=True)

RENDERER = "vendor/markdown-it-14.1.0.min.js"
HIGHLIGHTER = "vendor/highlight-11.11.1.min.js"


def answered(make_user, content: str, **answer_fields):
    """A user with one conversation whose question got ``content`` as its answer."""
    user = make_user()
    conversation = services.conversation_create(owner=user)
    question = services.turn_append_user(conversation=conversation, content="hi")
    answer = services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content=content, status=Turn.Status.COMPLETE, prompt_tokens=5, completion_tokens=7,
    )  # fmt: skip
    if answer_fields:
        Turn.objects.filter(turn_id=answer.turn_id).update(**answer_fields)
    client = Client()
    client.force_login(user)
    return client, conversation


def test_a_cut_off_answer_says_at_how_many_tokens(make_user):
    """Given an answer that ended because its token budget ran out (finish_reason length),
    when the conversation is shown, then it says "Cut off at 7 tokens."."""
    client, conversation = answered(make_user, "They helps", finish_reason="length")

    page = client.get(f"/c/{conversation.pk}/").content.decode()

    assert "Cut off at 7 tokens." in page


def test_a_finished_answer_has_no_cut_off_note(make_user):
    """Given an answer the model ended itself (finish_reason stop), then no cut-off note."""
    client, conversation = answered(make_user, "They help.", finish_reason="stop")

    page = client.get(f"/c/{conversation.pk}/").content.decode()

    assert "Cut off" not in page and "data-cut-off" not in page


def test_an_answer_copy_button_carries_its_markdown_escaped(make_user):
    """Given an answer with Markdown and markup in it, when shown, then its Copy button holds
    the answer's Markdown source (HTML-escaped in the attribute, so it is inert)."""
    source = '**bold** and <img src=x onerror="alert(1)">\n\n```py\nx = 1\n```'
    client, conversation = answered(make_user, source)

    page = client.get(f"/c/{conversation.pk}/").content.decode()

    attribute = f'data-copy-text="{html.escape(source, quote=True)}"'
    assert 'data-copy="answer"' in page
    assert attribute in page
    assert '<img src=x onerror="alert(1)">' not in page


def test_the_chat_page_loads_the_renderer_and_the_highlighter(make_user):
    client, conversation = answered(make_user, "hello")

    page = client.get(f"/c/{conversation.pk}/").content.decode()

    assert RENDERER in page and HIGHLIGHTER in page and "chat/render.js" in page


def test_other_pages_load_no_renderer(make_user):
    """Pages without answers load neither the Markdown renderer nor the highlighter."""
    client, _ = answered(make_user, "hello")

    page = client.get("/settings/api-keys/").content.decode()

    assert RENDERER not in page and HIGHLIGHTER not in page


def test_the_share_page_loads_the_highlighter_but_no_renderer(make_user):
    """A shared conversation shows stored HTML only: its code is highlighted, nothing renders
    Markdown there."""
    client, conversation = answered(make_user, "```py\nx = 1\n```")
    link = share_link_create(conversation=conversation, user=conversation.owner)

    page = Client().get(f"/s/{link.token}/").content.decode()

    assert 'class="language-py"' in page
    assert HIGHLIGHTER in page and RENDERER not in page
