"""The prefix cache isolated by tenant, with the real engine (issue 27 part 1; vLLM
CVE-2025-46570): the report's probe, repeated. User A sends a ~1,100-token private text over
``/v1/chat/completions`` with ``max_tokens`` 1; user B of another account sends the same text.
Unsalted, B's ``usage.prompt_tokens_details.cached_tokens`` was 1,024 (B learnt that somebody
sent exactly that text); salted by tenant it is 0, while A's own second request still reads A's
cached prefix.

Shares the session's engine and uvicorn server (tests/conftest.py ``live``)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from accounts.services import api_key_create

pytestmark = pytest.mark.real_engine

SENTENCES = [
    "The quarterly report for the northern warehouse lists every pallet received and shipped.",
    "Our private negotiation notes say the supplier would accept a lower price before March.",
    "Please keep the medical history of the patient in room four strictly confidential.",
    "The draft contract gives the buyer an option to extend the lease by two more years.",
    "Internal audit found three invoices that were paid twice during the summer holidays.",
    "My new password hint is the name of the street where I grew up, followed by a number.",
    "The board will vote on the merger next Tuesday; nobody outside the room may know yet.",
    "Salaries in the design team rise by four percent, the engineers by five and a half.",
]


def private_text(tag: str, words: int = 850) -> str:
    """About ``words`` words (~1,100 tokens for SmolLM2's tokenizer) of private-looking prose,
    unique to ``tag`` from its first word on."""
    body: list[str] = [f"Case {tag}."]
    index = 0
    while sum(len(s.split()) for s in body) < words:
        body.append(f"Item {index}: {SENTENCES[index % len(SENTENCES)]}")
        index += 1
    return " ".join(body)


def kv_block_size(engine) -> int:
    """The engine's KV cache block (tokens): prefix caching keeps whole blocks only."""
    config = getattr(getattr(engine, "_llm", None), "vllm_config", None)
    return int(getattr(getattr(config, "cache_config", None), "block_size", None) or 128)


def usage_of(client: httpx.Client, text: str) -> dict:
    response = client.post(
        "/v1/chat/completions",
        json={
            "model": "mini", "messages": [{"role": "user", "content": text}], "max_tokens": 1,
            "temperature": 0,
        },
    )  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def test_another_users_identical_prompt_reads_nothing_from_the_prefix_cache_and_the_owners_does(
    live, make_user
):
    """Given users A and B of different accounts and a ~1,100-token text only A has sent, when B
    sends the same text, then B is told no token was cached, while A's second request is."""
    text = private_text(uuid.uuid4().hex[:12])
    clients = {}
    for name in ("a", "b"):
        key = api_key_create(user=make_user(f"salt-{name}-{uuid.uuid4().hex[:6]}"), name="probe").raw
        clients[name] = live.client(headers={"Authorization": f"Bearer {key}"})
    with clients["a"] as a, clients["b"] as b:
        first = usage_of(a, text)
        probe = usage_of(b, text)
        again = usage_of(a, text)
    assert first["prompt_tokens"] > 1_000  # the premise: whole KV blocks of a private text
    assert probe["prompt_tokens"] == first["prompt_tokens"]
    assert probe["prompt_tokens_details"]["cached_tokens"] == 0
    block = kv_block_size(live.engine)
    # A's own cache: every whole KV block of the prompt (the last token is always computed).
    assert again["prompt_tokens_details"]["cached_tokens"] >= (first["prompt_tokens"] - 1) // block * block > 0
    assert live.unfinished() == 0
