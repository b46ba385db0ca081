"""A project chat's turn with the real engine (issue 30): the prompt carries the project's
instructions (system message) and a retrieved passage (last user message), the answer streams
to its end, and the chat page lists the passage as its source.

Shares the session's engine and uvicorn server (tests/conftest.py ``live``); retrieval is the
other branch's module, in the server's process."""

from __future__ import annotations

import httpx
import pytest

from accounts.services import api_key_create
from conversations import plan
from projects import services as project_services
from projects.models import ProjectTurnSource
from tests.projects_support import passage_file_add, retrieval  # noqa: F401 - fixture

pytestmark = [pytest.mark.real_engine, pytest.mark.django_db(transaction=True)]

INSTRUCTIONS = "Answer in one short sentence."
LAUNCH = "The launch code for the Antares mission is tangerine-42."


def test_a_project_turn_carries_instructions_and_a_passage_and_shows_its_source(live, make_user, retrieval, monkeypatch):  # noqa: F811
    user = make_user("real-project")
    project = project_services.project_create(owner=user, name="Antares", instructions=INSTRUCTIONS)
    passage_file_add(project, user=user, name="mission.md", passages=[LAUNCH, "Sourdough needs a cool, slow rise."])
    assembled: list[dict] = []
    real_assemble = plan.prompt_assemble

    def observed(**kwargs):
        assembled.append(kwargs)
        return real_assemble(**kwargs)

    monkeypatch.setattr(plan, "prompt_assemble", observed)
    key = api_key_create(user=user, name="real").raw
    with httpx.Client(base_url=live.url, timeout=180, headers={"Authorization": f"Bearer {key}"}) as client:
        created = client.post("/v1/conversations", json={"project_id": str(project.pk)})
        assert created.status_code == 201, created.text
        conversation_id = created.json()["conversation_id"]
        with client.stream(
            "POST", f"/v1/conversations/{conversation_id}/turns",
            json={"role": "user", "content": "What is the launch code for the Antares mission?", "max_tokens": 8},
        ) as response:  # fmt: skip
            assert response.status_code == 200, response.read()
            body = "".join(response.iter_text())
    assert "event: done" in body, body[-500:]
    live.drain()
    (kwargs,) = assembled
    assert kwargs["project_instructions"] == INSTRUCTIONS
    assert kwargs["question"].startswith("[From project file: mission.md]\n" + LAUNCH)
    assert ProjectTurnSource.objects.filter(conversation_id=conversation_id, text=LAUNCH).exists()
    page = live.login(user.username).get(f"/c/{conversation_id}/")
    assert page.status_code == 200
    sources = page.text.split('aria-label="Sources"')[1]
    assert "mission.md" in sources and "tangerine-42" in sources
