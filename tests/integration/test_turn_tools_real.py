"""Function calling on /v1/conversations/{id}/turns with the real model (issue 30, part 1): a
whole round trip, call then result then answer. ``tool_choice: required`` makes the call certain
(structured output constrains the answer to a call valid against the schema)."""

from __future__ import annotations

import json

import httpx
import pytest

from accounts.services import api_key_create
from conversations.models import Turn

pytestmark = pytest.mark.real_engine

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def _events(response: httpx.Response) -> list[tuple[str, dict]]:
    """(event, data) of an SSE body."""
    events, name = [], None
    for line in response.text.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and name is not None:
            events.append((name, json.loads(line[6:])))
            name = None
    return events


def test_a_turn_calls_a_tool_then_answers_after_its_result(live, make_user):
    issued = api_key_create(user=make_user("turn-tools"), name="turn tools")
    with httpx.Client(base_url=f"{live.url}/v1", headers={"Authorization": f"Bearer {issued.raw}"}, timeout=180) as client:
        conversation_id = client.post("/conversations", json={}).json()["conversation_id"]
        first = client.post(f"/conversations/{conversation_id}/turns", json={
            "role": "user", "content": "What is the weather in Paris?", "tools": [WEATHER_TOOL],
            "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 60,
        })  # fmt: skip
        assert first.status_code == 200, first.text
        events = _events(first)
        calls = [data for name, data in events if name == "tool_call"]
        assert events[-1][0] == "done" and events[-1][1]["finish_reason"] == "tool_calls", events[-1]
        assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather"
        assert set(json.loads(calls[0]["function"]["arguments"])) == {"city"}

        second = client.post(f"/conversations/{conversation_id}/turns", json={
            "role": "tool", "results": [{"tool_call_id": calls[0]["id"], "content": '{"temp_c": 21, "sky": "sunny"}'}],
            "tools": [WEATHER_TOOL], "tool_choice": "none", "max_tokens": 30,
        })  # fmt: skip

        assert second.status_code == 200, second.text
        done = _events(second)[-1]
        assert done[0] == "done" and done[1]["finish_reason"] in {"stop", "length"}
        turns = client.get(f"/conversations/{conversation_id}").json()["turns"]
    assert [t["role"] for t in turns] == ["user", "assistant", "tool", "assistant"]
    assert turns[2]["tool_call_id"] == calls[0]["id"]
    assert Turn.objects.filter(role="assistant", continues_id=turns[1]["turn_id"]).exists()
