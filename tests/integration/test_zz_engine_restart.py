"""The engine core process dies mid-answer (SIGKILL). Named to run last: it kills the shared
engine (which must come back by itself)."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import psutil
import pytest

from conversations.models import Turn
from tests.integration.test_real_stream import answer_turn, send

pytestmark = pytest.mark.real_engine


def engine_core_processes() -> list[psutil.Process]:
    me = psutil.Process(os.getpid())
    return [
        p for p in me.children(recursive=True)
        if "EngineCore" in " ".join(p.cmdline() or [p.name()]) or "EngineCore" in p.name()
    ]  # fmt: skip


def test_engine_killed_mid_answer_restarts_and_the_answer_continues(live, make_user, settings):
    """Kill the EngineCore process while an answer streams: /readyz reports not ready while
    the engine restarts; the turn loses nothing already streamed and is completed after the
    restart (re-prefilled with the text so far); the next turn works."""
    settings.CHAT_MAX_TOKENS = 200
    settings.CHAT_TEMPERATURE = 0.0
    # A restart takes ~50 s on a quiet 2-core machine; on a busy one spawning EngineCore alone
    # took 71 s and the whole restart over the default 180 s (issue 26). The behaviour tested
    # is that the answer continues, not how fast: a generous wait.
    settings.CHAT_ENGINE_RESTART_WAIT_S = 420
    make_user("phoenix")
    client = live.login("phoenix")
    conversation_id, url = send(client, "Write a long story about a phoenix.")
    cores = engine_core_processes()
    assert cores, "no EngineCore process found"
    restarts_before = live.engine.restarts

    streamed, statuses, done = [], [], None
    with client.stream("GET", url, timeout=480) as response:
        name = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if name == "token":
                    streamed.append(data["text"])
                    if len(streamed) == 5:
                        for core in cores:
                            core.send_signal(signal.SIGKILL)
                        time.sleep(1.0)
                        statuses.append(httpx.get(f"{live.url}/readyz").status_code)
                elif name in ("done", "error"):
                    done = (name, data)
                    break

    assert statuses == [503]  # not ready while the engine restarts
    assert done is not None and done[0] == "done", done
    assert done[1]["status"] == "complete"
    assert live.engine.restarts == restarts_before + 1
    stored = answer_turn(url)
    assert stored.status == Turn.Status.COMPLETE
    assert stored.content == "".join(streamed)
    assert len(streamed) > 5  # it went on after the restart
    assert httpx.get(f"{live.url}/readyz").status_code == 200
    assert set(p.pid for p in engine_core_processes()).isdisjoint(p.pid for p in cores)

    _, next_url = send(client, "Say hi.", conversation_id)
    with client.stream("GET", next_url, timeout=120) as response:
        body = "\n".join(response.iter_lines())
    assert "event: done" in body
