"""The guard adapter (``moderation.guard``): a guard model's reply read as a verdict, unparseable
replies failing closed, blocked terms and leaks checked locally, and the pool named as the model.
Only the guard pool's HTTP answer is a stand-in.
"""

from __future__ import annotations

import json

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured

from moderation import guard
from moderation.base import acheck
from moderation.guard import GuardModerator, GuardReplyError, parse_guard_reply
from moderation.verdicts import Policy, policy_for
from tests.moderation_support import (
    SYSTEM_PROMPT,
    moderator_class,  # noqa: F401 - a fixture
)

# --- guard adapter ------------------------------------------------------------------------------


@pytest.fixture
def guard_replies(monkeypatch):
    """inference.service_client.chat_complete answers with the queued replies and records each
    call (messages, max_tokens, model)."""
    from inference import service_client

    replies: list[str] = []
    calls: list[dict] = []

    def chat_complete(messages, *, max_tokens, temperature=0.0, model=None):
        calls.append({"messages": messages, "max_tokens": max_tokens, "model": model,
                      "temperature": temperature})
        return replies.pop(0)

    monkeypatch.setattr(service_client, "chat_complete", chat_complete)
    return replies, calls


def test_the_guard_flags_an_unsafe_reply_and_names_the_hazards(guard_replies):
    replies, calls = guard_replies
    replies.append("unsafe\nS1,S10")

    verdict = GuardModerator(pool="guard").check_input("some message", policy_for(None))

    assert verdict.flagged and verdict.categories == ("unsafe",)
    assert verdict.scores == {"unsafe": 1.0, "S1": 1.0, "S10": 1.0}
    assert verdict.classifier == "guard:guard"
    assert verdict.message() == ("This message was not sent: it was judged unsafe "
                                 "(violent crimes, hate).")
    prompt = calls[0]["messages"][0]["content"]
    assert calls[0]["model"] == "guard" and calls[0]["temperature"] == 0.0
    assert "S14: Code interpreter abuse." in prompt
    assert "User: some message" in prompt
    assert "Provide your safety assessment for ONLY THE LAST User message" in prompt
    assert "First line must read 'safe' or 'unsafe'." in prompt


def test_the_guard_passes_a_safe_reply_and_asks_about_the_agent_at_the_output_gate(
    guard_replies,
):
    replies, calls = guard_replies
    replies.append("safe")

    verdict = GuardModerator(pool="guard").check_output("an answer", policy_for(None))

    assert not verdict.flagged and verdict.scores == {"unsafe": 0.0}
    assert "Agent: an answer" in calls[0]["messages"][0]["content"]
    assert "ONLY THE LAST Agent message" in calls[0]["messages"][0]["content"]


async def test_an_unparseable_guard_reply_fails_closed(guard_replies, moderator_class, settings):
    replies, _ = guard_replies
    replies.append("I think this message is probably fine.")
    settings.CHAT_MODERATION_GUARD_POOL = "guard"
    moderator_class("GuardForTests")

    verdict = await acheck("input", "hello", policy_for(None), timeout_s=2)

    assert verdict.flagged and verdict.categories == ("moderation_unavailable",)
    assert "GuardReplyError" in verdict.error


class GuardForTests(GuardModerator):
    pass


def test_the_guard_checks_blocked_terms_and_leaks_locally_without_asking_the_pool(
    guard_replies,
):
    _, calls = guard_replies
    policy = Policy(thresholds={}, blocked_terms=("falcon",), system_prompt=SYSTEM_PROMPT)

    term = GuardModerator(pool="guard").check_input("when is falcon out", policy)
    leak = GuardModerator(pool="guard").check_output(SYSTEM_PROMPT, Policy(
        thresholds={}, system_prompt=SYSTEM_PROMPT))

    assert term.categories == ("blocked_term",) and leak.categories == ("system_prompt_leak",)
    assert calls == []


@pytest.mark.parametrize(
    ("reply", "expected"),
    [("safe", (False, ())), (" Unsafe \n s3 , S12 ", (True, ("S3", "S12"))),
     ("unsafe", (True, ())), ("unsafe\nS10\n", (True, ("S10",)))],
)
def test_guard_replies_that_parse(reply, expected):
    assert parse_guard_reply(reply) == expected


@pytest.mark.parametrize("reply", ["", "maybe", "unsafe\nS15", "unsafe\nviolence", "safe-ish"])
def test_guard_replies_that_do_not_parse_raise(reply):
    with pytest.raises(GuardReplyError):
        parse_guard_reply(reply)


def test_the_guard_needs_a_pool(settings):
    settings.CHAT_MODERATION_GUARD_POOL = ""

    with pytest.raises(ImproperlyConfigured):
        GuardModerator()


def test_the_guard_sends_the_pool_as_the_model_with_the_service_client(monkeypatch):
    """While chat_complete cannot choose the model, the adapter posts the same request itself
    through the service client, naming the guard pool."""
    from inference import service_client

    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"message": {"content": "safe"}}]})

    def chat_complete(messages, *, max_tokens, temperature=0.0):  # no model parameter
        raise AssertionError("must not ask the default model")

    monkeypatch.setattr(service_client, "chat_complete", chat_complete)
    monkeypatch.setattr(service_client, "http_client", lambda: httpx.Client(
        base_url="http://gateway", transport=httpx.MockTransport(handler)))

    assert guard.guard_complete("prompt", pool="llama-guard") == "safe"
    assert seen[0]["model"] == "llama-guard" and seen[0]["stream"] is False
    assert seen[0]["messages"] == [{"role": "user", "content": "prompt"}]
