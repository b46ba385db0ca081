"""Helpers for tests of the /v1 API: a Bearer-key async client, JSON posts, a new conversation,
the JSON error shape, and a branched conversation built through the services."""

from __future__ import annotations

import json
import uuid

from asgiref.sync import sync_to_async
from django.test import AsyncClient

from accounts import services as account_services
from conversations import services


class BearerClient(AsyncClient):
    """An async test client that sends ``Authorization: Bearer <key>`` on every request
    (AsyncClient's own ``headers=`` defaults are sent under WSGI names, so not used)."""

    def __init__(self, key: str):
        super().__init__()
        self.key = key

    def generic(self, method, path, data="", content_type="application/octet-stream", secure=False, *, headers=None, **extra):
        headers = {"Authorization": f"Bearer {self.key}", **(headers or {})}
        return super().generic(method, path, data, content_type, secure, headers=headers, **extra)


async def api_client(make_user, username="api-user", **fields) -> tuple[AsyncClient, object]:
    user = await sync_to_async(make_user)(username, **fields)
    issued = await sync_to_async(account_services.api_key_create)(user=user, name="tests")
    return BearerClient(issued.raw), user


async def post_json(client, url, body, **headers):
    return await client.post(url, json.dumps(body), content_type="application/json", headers=headers)


async def new_conversation(client, **body) -> str:
    response = await post_json(client, "/v1/conversations", body)
    assert response.status_code == 201, response.content
    return response.json()["conversation_id"]


def assert_error(response, status: int, type_: str):
    assert response.status_code == status, response.content
    body = response.json()
    assert body["error"]["type"] == type_
    assert body["error"]["message"]


def answer_stored(conversation, question, content):
    return services.turn_append_assistant(
        conversation_id=conversation.pk, turn_id=uuid.uuid4(), reply_to_id=question.turn_id,
        content=content, status="complete", prompt_tokens=3, completion_tokens=2,
    )  # fmt: skip


def branched_conversation(user, title="Branches"):
    """A conversation with a branch, built through the services (no engine): q1/a1 -> q2/a2,
    then an edit of q1 (q1'/a1') that is the branch shown. Returns (conversation, turns by
    name: q1, a1, q2, a2, q1e, a1e)."""
    conversation = services.conversation_create(owner=user, title=title)
    q1 = services.turn_append_user(conversation=conversation, content="first question")
    a1 = answer_stored(conversation, q1, "first answer")
    q2 = services.turn_append_user(conversation=conversation, content="second question", parent_id=q1.turn_id)
    a2 = answer_stored(conversation, q2, "second answer")
    q1e = services.turn_append_user(conversation=conversation, content="first question, edited", replaces=q1)
    a1e = answer_stored(conversation, q1e, "answer to the edit")
    conversation.refresh_from_db()
    return conversation, {"q1": q1, "a1": a1, "q2": q2, "a2": a2, "q1e": q1e, "a1e": a1e}
