"""Helpers for the sharing tests (tests/test_sharing*.py): store a conversation and its
answers, make a link through the service, signed-in clients, the sharing URLs, a check for the
sign-in redirect, and the ``people`` fixture (an owner, another user, a shared conversation
and its link)."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client
from django.urls import reverse

from conversations import services as conversation_services
from conversations.models import Conversation, Turn
from sharing import services
from sharing.models import ShareLink

# --- helpers --------------------------------------------------------------------------------


def answer(conversation: Conversation, question: Turn, text: str, **fields) -> Turn:
    """Store the assistant's answer to ``question`` (as the write-back does)."""
    return conversation_services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content=text, status=fields.pop("status", Turn.Status.COMPLETE), prompt_tokens=5,
        completion_tokens=2, **fields,
    )  # fmt: skip


def converse(owner, exchanges=(("Hello there", "General Kenobi"),), *, org=None) -> Conversation:
    """A conversation of ``owner`` with these (question, answer) exchanges stored, reloaded."""
    conversation = conversation_services.conversation_create(owner=owner, org=org)
    for question_text, answer_text in exchanges:
        question = conversation_services.turn_append_user(conversation=conversation, content=question_text)
        answer(conversation, question, answer_text)
    conversation.refresh_from_db()
    return conversation


def share(conversation: Conversation) -> ShareLink:
    """A link made by the conversation's owner, through the service."""
    return services.share_link_create(conversation=conversation, user=conversation.owner)


def client_for(user=None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def shared_url(link: ShareLink) -> str:
    return reverse("shared", args=[link.token])


def continue_url(link: ShareLink) -> str:
    return reverse("shared-continue", args=[link.token])


def manage_url(conversation: Conversation) -> str:
    return reverse("share-manage", args=[conversation.pk])


def update_url(link: ShareLink) -> str:
    return reverse("share-update", args=[link.conversation_id, link.pk])


def revoke_url(link: ShareLink) -> str:
    return reverse("share-revoke", args=[link.conversation_id, link.pk])


def is_login_redirect(response, next_path: str | None = None) -> bool:
    location = response.get("Location", "")
    ok = response.status_code == 302 and location.startswith(reverse("login"))
    if next_path is not None:
        from urllib.parse import parse_qs, urlsplit  # noqa: PLC0415

        ok = ok and parse_qs(urlsplit(location).query).get("next") == [next_path]
    return ok


@pytest.fixture
def people(make_user):
    """The cast: the owner of a shared conversation, another signed-up user, and the link."""
    owner = make_user("olive")
    other = make_user("otto")
    conversation = converse(owner)
    link = share(conversation)
    return owner, other, conversation, link
