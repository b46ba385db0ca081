"""A turn with an attached text file is answered by the real engine (issue 8): the chat page
posts the message with the file (multipart) to daphne + Django + vLLM, over real HTTP."""

from __future__ import annotations

import re

import pytest

from attachments.models import Attachment
from conversations.models import Turn
from tests.integration.test_real_stream import read_events
from tests.test_attachments import media  # noqa: F401 - fixture: files in a folder of the test's own

pytestmark = pytest.mark.real_engine


@pytest.fixture(autouse=True)
def _patient_moderation(settings):
    """A slow input check on a busy machine must not refuse the turn (not what is tested)."""
    settings.CHAT_MODERATION_TIMEOUT_S = 10


NOTES = (
    "Project notes\n\n"
    "The launch code is tangerine. The backup code is plum.\n"
    "The meeting is on Tuesday at 10 in room 4.\n"
)


def test_a_turn_with_an_attached_text_file_is_answered(live, make_user, media):
    """Given a signed-in user, when they send a question with a text file attached, then the
    real model answers it (done, complete, some text), the file's text was in the prompt (the
    prompt is longer than the file), and the file is stored and linked to the message."""
    make_user("reader")
    client = live.login("reader")
    response = client.post(
        "/chat/turns",
        data={"content": "What is the launch code in the attached notes? Answer in one sentence."},
        files={"files": ("notes.txt", NOTES.encode(), "text/plain")},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200, response.text
    assert "notes.txt" in response.text  # its chip
    events_url = re.search(r'sse-connect="([^"]+)"', response.text).group(1)

    events = read_events(client, events_url)

    name, done, _ = events[-1]
    assert name == "done", events[-1]
    assert done["status"] == Turn.Status.COMPLETE
    question = Turn.objects.get(turn_id=events_url.split("/")[4])
    answer = Turn.objects.get(reply_to_id=question.turn_id)
    assert answer.content.strip()
    attachment = Attachment.objects.get(turn_id=question.turn_id)
    assert attachment.tokens > 20 and not attachment.truncated
    assert done["usage"]["prompt_tokens"] > attachment.tokens
    assert list(media.rglob("*"))  # the file is in storage
    assert live.unfinished() == 0
