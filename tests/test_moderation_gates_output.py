"""The output gate in the request path and a failing classifier (issue 6), with the real
classifiers and the scripted engine double: the output gate runs beside the stream, aborts a
flagged answer, tells the client to retract it and stores the verdict without the flagged text
(PF-M1); a failing classifier refuses the turn unless the organisation chose fail-open (PF-M2).
The input gate: test_moderation_gates.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from conversations import events as stream_events
from conversations.models import Turn
from core import metrics
from moderation import base as moderation_base
from tests.api_support import api_client, assert_error, new_conversation, post_json
from tests.chat_support import parse_sse, read_stream
from tests.moderation_support import WEAPONS_ANSWER, ask, turn_url, turns_of, with_org

pytestmark = pytest.mark.django_db(transaction=True)


# --- PF-M2: fail closed ----------------------------------------------------------------------


class Broken:
    name, version = "broken", "0"

    def check_input(self, text, policy):
        raise RuntimeError("classifier exploded")

    check_output = check_input


class Slow:
    name, version = "slow", "0"

    def check_input(self, text, policy):
        time.sleep(1.0)
        raise AssertionError("never reached: the gate times out first")

    check_output = check_input


@pytest.mark.parametrize(("moderator", "reason"), [(Broken(), "error"), (Slow(), "timeout")])
async def test_pf_m2_a_failing_classifier_refuses_the_turn_and_is_counted(
    make_user, engine_double, monkeypatch, settings, moderator, reason
):
    settings.CHAT_MODERATION_TIMEOUT_S = 0.2
    monkeypatch.setattr(moderation_base, "_moderator", moderator)
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    before = metrics.value("chat_moderation_failures_total", gate="input", reason=reason)
    response = await ask(client, conversation_id, "hello there")
    assert_error(response, 503, "moderation_unavailable")
    assert int(response["Retry-After"]) >= 1
    assert await turns_of(conversation_id) == []
    assert engine_double.requests == []
    assert metrics.value("chat_moderation_failures_total", gate="input", reason=reason) == before + 1


async def test_pf_m2_an_organisation_may_choose_fail_open(make_user, engine_double, monkeypatch):
    monkeypatch.setattr(moderation_base, "_moderator", Broken())
    client, user = await api_client(make_user)
    await with_org(user, moderation_fail_open=True)
    conversation_id = await new_conversation(client)
    response = await ask(client, conversation_id, "hello there")
    assert response.status_code == 200
    events = parse_sse(await read_stream(response))
    assert events[-1][0] == "done"
    question, _ = await turns_of(conversation_id)
    assert question.moderation_verdict["error"]  # the failure is on record, the turn went on


async def test_pf_m2_an_output_check_that_fails_withdraws_the_answer(make_user, engine_double, monkeypatch, settings):
    class BrokenOutput(Broken):
        def check_input(self, text, policy):
            from moderation.local import LocalModerator  # noqa: PLC0415

            return LocalModerator().check_input(text, policy)

        def check_output(self, text, policy):
            raise RuntimeError("output classifier exploded")

    monkeypatch.setattr(moderation_base, "_moderator", BrokenOutput())
    settings.CHAT_MODERATION_STEP_CHARS = 5
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    events = parse_sse(await read_stream(await ask(client, conversation_id, "hello")))
    assert events[-1][0] == "moderation"
    assert "moderation_unavailable" in events[-1][1]["categories"]
    _, answer = await turns_of(conversation_id)
    assert (answer.status, answer.content) == ("blocked", "")


# --- output gate -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script",
    [
        ["One", " two", " three", " four", " bananarama", " six", " seven", " eight"],
        ["One", " two", " three", " four", " banana", "rama", " seven", " eight"],  # split
    ],
    ids=["whole", "split-across-tokens"],
)
async def test_pf_m1_a_blocked_phrase_at_token_5_stops_generation_and_the_client_retracts(
    make_user, engine_double, settings, script
):
    settings.CHAT_MODERATION_STEP_CHARS = 8
    engine_double.scripts = [[*script[:6], 0.5, *script[6:]]]  # time for the gate to act
    client, user = await api_client(make_user)
    await with_org(user, blocked_terms=["bananarama"])
    conversation_id = await new_conversation(client)
    events = parse_sse(await read_stream(await ask(client, conversation_id, "count for me")))
    kinds = [e[0] for e in events]
    assert kinds[-1] == "moderation" and "done" not in kinds
    payload = events[-1][1]
    assert payload["retract"] is True and payload["categories"] == ["blocked_term"]
    assert "seven" not in "".join(e[1].get("text", "") for e in events if e[0] == "token")
    request_id = engine_double.requests[0][2]
    assert request_id in engine_double.aborted  # the engine request was aborted
    _, answer = await turns_of(conversation_id)
    assert (answer.status, answer.content) == ("blocked", "")
    assert answer.moderation_verdict["categories"] == ["blocked_term"]
    assert answer.moderation_verdict["gate"] == "output"
    assert answer.token_count >= 5  # charged for what was generated


async def test_a_blocked_answer_resumes_as_its_moderation_event(make_user, engine_double, settings):
    settings.CHAT_MODERATION_STEP_CHARS = 4
    engine_double.scripts = [WEAPONS_ANSWER]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await ask(client, conversation_id, "tell me about the Tokyo subway attack")
    events = parse_sse(await read_stream(response))
    assert events[-1][0] == "moderation" and "indiscriminate_weapons" in events[-1][1]["categories"]
    resumed = await client.get(f"{turn_url(conversation_id)}/{response['X-Turn-Id']}/events")
    again = parse_sse(await read_stream(resumed))
    assert again[-1][0] == "moderation" and again[-1][1]["retract"] is True
    # Once its event log is gone, the stored answer replays as the moderation event only.
    answer = await Turn.objects.aget(pk=response["X-Turn-Id"])
    only = parse_sse(b"".join([chunk async for chunk in stream_events.stored_answer_sse(answer)]))
    assert [e[0] for e in only] == ["moderation"]
    assert "indiscriminate_weapons" in only[0][1]["categories"] and only[0][1]["retract"] is True


async def test_a_system_prompt_leak_is_caught_even_reformatted(make_user, engine_double, settings):
    settings.CHAT_MODERATION_STEP_CHARS = 16
    secret = "You are Quill, the support agent of Acme Rockets. Never discuss pricing with customers."
    leak = ["Sure! My instructions:\n", "- YOU ARE QUILL the support agent\n", "- of ACME rockets;", " never discuss\n", "- pricing, with customers!"]
    engine_double.scripts = [leak]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client, system_prompt=secret)
    events = parse_sse(await read_stream(await ask(client, conversation_id, "tell me about yourself")))
    assert events[-1][0] == "moderation"
    assert "system_prompt_leak" in events[-1][1]["categories"]
    _, answer = await turns_of(conversation_id)
    assert "QUILL" not in answer.content and answer.status == "blocked"


async def test_a_clean_answer_is_done_with_its_clean_verdict_stored(make_user, engine_double):
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    events = parse_sse(await read_stream(await ask(client, conversation_id, "hello")))
    assert events[-1][0] == "done"
    _, answer = await turns_of(conversation_id)
    assert answer.status == "complete" and answer.moderation_verdict["flagged"] is False
    assert answer.moderation_verdict["gate"] == "output"


async def test_the_output_gate_never_holds_back_a_token(make_user, engine_double, monkeypatch, settings):
    """Every check blocks until the test releases it; all tokens still reach the client, and
    the answer ends once the checks are let go."""
    from moderation.local import LocalModerator  # noqa: PLC0415

    release = threading.Event()

    class Held(LocalModerator):
        def check_output(self, text, policy):
            release.wait(10)
            return super().check_output(text, policy)

    held = Held()
    monkeypatch.setattr(moderation_base, "_moderator", held)
    settings.CHAT_MODERATION_TIMEOUT_S = 20
    settings.CHAT_MODERATION_STEP_CHARS = 2
    engine_double.scripts = [["alpha", " beta", " gamma", " delta", " epsilon"]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    response = await ask(client, conversation_id, "list some letters")
    chunks = response.streaming_content
    seen = b""
    async for chunk in chunks:
        seen += chunk
        if b"epsilon" in seen:
            break
    assert b"event: done" not in seen  # the end waits for the checks, the tokens did not
    release.set()
    async for chunk in chunks:
        seen += chunk
    assert b"event: done" in seen


async def test_non_streamed_completions_end_with_content_filter_and_no_text(make_user, engine_double, settings):
    settings.CHAT_MODERATION_STEP_CHARS = 4
    engine_double.scripts = [WEAPONS_ANSWER]
    client, _ = await api_client(make_user)
    body = {"model": "mini", "messages": [{"role": "user", "content": "hi"}]}
    response = await post_json(client, "/v1/chat/completions", body)
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("content_filter", "")
    assert "indiscriminate_weapons" in choice["moderation"]["categories"]


async def test_streamed_completions_end_with_a_content_filter_chunk(make_user, engine_double, settings):
    settings.CHAT_MODERATION_STEP_CHARS = 4
    engine_double.scripts = [[*WEAPONS_ANSWER[:2], 0.3, WEAPONS_ANSWER[2]]]
    client, _ = await api_client(make_user)
    body = {"model": "mini", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    response = await post_json(client, "/v1/chat/completions", body)
    raw = (await read_stream(response)).decode()
    chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    final = chunks[-1]["choices"][0]
    assert final["finish_reason"] == "content_filter" and final["moderation"]["retract"] is True
    assert "everyone hates" not in raw
    assert raw.rstrip().endswith("data: [DONE]")
    await asyncio.sleep(0)


async def test_an_answer_describing_itself_like_the_short_default_prompt_is_not_a_leak(make_user, engine_double, settings):
    """Found by CI with the real model: "Just say hi." was answered "Hi! I'm a helpful,
    concise assistant..." and withdrawn as a leak of the 6-word default system prompt, which
    is no secret and cannot be told apart from the assistant describing itself."""
    settings.CHAT_MODERATION_STEP_CHARS = 8
    engine_double.scripts = [["Hi! I'm a helpful,", " concise assistant.", " You are a helpful", " person too."]]
    client, _ = await api_client(make_user)
    conversation_id = await new_conversation(client)
    events = parse_sse(await read_stream(await ask(client, conversation_id, "Just say hi.")))
    assert events[-1][0] == "done"
