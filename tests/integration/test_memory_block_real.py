"""The memory block warmed into the real engine's prefix cache (issue 19 part 3): after a user's
facts change, the rebuild's 1-token background request (conversations/prefix_warm.py, through the server's
own /v1/completions with the service key) leaves the user's new-chat prefix in vLLM's prefix
cache, so the first turn of their next new conversation reads it from there.

Shares the session's engine and uvicorn server (tests/conftest.py ``live``); the rebuild runs
eagerly in this thread after the facts commit and calls that server over loopback."""

from __future__ import annotations

import uuid

import httpx
import pytest

from accounts.services import api_key_create
from conversations.models import Turn
from conversations.plan import new_chat_prefix
from memory import services as memory_services
from memory.blocks import memory_block_current

pytestmark = [pytest.mark.real_engine, pytest.mark.django_db(transaction=True)]

FACTS = [
    "prefers metric units", "is learning Rust", "lives in Lyon", "has a grey cat called Pixel",
    "works as a beekeeper", "is vegetarian", "plays the cello", "is training for a marathon",
    "has two daughters", "drives a red bicycle to work", "is allergic to peanuts",
    "speaks Portuguese and French", "reads science fiction", "grows tomatoes and basil",
    "uses Linux at home", "is saving for a trip to Japan", "prefers short answers",
    "studies astronomy at night school", "likes baroque organ music", "is afraid of flying",
]  # fmt: skip


def kv_block_size(engine) -> int:
    """The engine's KV cache block (tokens): prefix caching keeps whole blocks only."""
    config = getattr(getattr(engine, "_llm", None), "vllm_config", None)
    size = getattr(getattr(config, "cache_config", None), "block_size", None)
    return int(size or 128)


def test_a_new_chat_after_the_rebuild_reads_the_memory_block_from_the_prefix_cache(
    live, make_user, settings
):
    """Given a user whose 21 pinned facts (one unique to this run) fit the block, when the facts are
    stored (rebuild + warm-up), then the first turn of a new conversation reports at least the
    whole KV blocks of the prefix through the memory block as cached - more than the shared
    instructions before the block could account for, so the warm-up put the block there."""
    settings.CHAT_INTERNAL_API_URL = live.url
    settings.CHAT_MEMORY_BLOCK_WARM = True
    settings.CHAT_MEMORY_MAX_TOKENS = 1000
    settings.CHAT_MEMORY_PROMPT_MAX_TOKENS = 1000  # a block this size is padded only past issue 28's cap
    tag = uuid.uuid4().hex[:10]
    user = make_user(f"memory-warm-{tag}")
    # Pinned facts (standing preferences): the ones the block carries (issue 28).
    texts = [f"The user's locker code word is {tag}."] + [f"The user {f}." for f in FACTS]
    memory_services.memory_facts_store(
        user=user, facts=[memory_services.FactIn(t, slot="preference") for t in texts]
    )
    block = memory_block_current(user_id=user.pk)
    assert not block.overflow and tag in block.text
    _, prefix = new_chat_prefix(user=user, memory=block.text)
    _, before_block = new_chat_prefix(user=user, memory="")
    size = kv_block_size(live.engine)
    assert len(prefix) % size == 0, (len(prefix), size)  # aligned: every block of it is whole
    assert len(prefix) > len(before_block)  # the premise: the block fills KV blocks of its own

    key = api_key_create(user=user, name="warm").raw
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=live.url, timeout=120, headers=headers) as client:
        created = client.post("/v1/conversations", json={})
        assert created.status_code == 201, created.text
        conversation_id = created.json()["conversation_id"]
        with client.stream(
            "POST", f"/v1/conversations/{conversation_id}/turns",
            json={"role": "user", "content": "Name one prime number.", "max_tokens": 4},
        ) as response:  # fmt: skip
            assert response.status_code == 200, response.read()
            body = "".join(response.iter_text())
    assert "event: done" in body, body[-500:]
    live.drain()
    answer = Turn.objects.filter(conversation_id=conversation_id, role=Turn.Role.ASSISTANT).get()
    assert answer.cached_tokens is not None and answer.cached_tokens >= len(prefix)
