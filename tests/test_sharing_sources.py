"""The shared snapshot page (/s/<token>/) shows what the chat page shows around an answer
(issue 30): a project answer's sources, each passage opening in place, and the tool calls an
answer was written after; both escaped, neither beyond the snapshot's boundary."""

from __future__ import annotations

import pytest

from tests.projects_support import project_chat_with_sources
from tests.sharing_support import share, shared_url
from tests.test_sharing_snapshot import page, snapshot_of
from tests.tool_rounds import conversation_with_round, tool_round_seed

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_shared_project_answer_lists_its_sources(make_user):
    """Given a project chat whose answer had two passages as sources (one holding markup), when
    its link is opened by anyone, then the answer shows "Sources" with the file's name and each
    passage, escaped, in the prompt's order."""
    owner = make_user("olive")
    _project, chat, _answer = project_chat_with_sources(
        owner, passages=("Launch is at 06:00 from pad 39A.", "<b>Weather</b> permitting.")
    )
    link = share(chat)

    html = snapshot_of(page(link))

    assert '<section class="sources" aria-label="Sources">' in html
    assert html.count('<details class="source">') == 2
    assert "mission.md" in html and html.index("Launch is at 06:00") < html.index("&lt;b&gt;Weather&lt;/b&gt;")
    assert "<b>Weather</b>" not in html
    assert "data-stream-sources" not in html  # drawn shown, not as a streaming answer's


def test_a_shared_chat_outside_a_project_has_no_sources(make_user):
    """Given an ordinary chat, then its shared page has no Sources section."""
    owner = make_user("olive")
    conversation, _ = conversation_with_round(owner)

    assert 'class="sources"' not in page(share(conversation))


def test_a_shared_answer_after_tool_calls_shows_them_up_to_the_snapshot(make_user):
    """Given a shared conversation with a tool round, then the shared page shows "Used 2 tools"
    with the calls and results; a round added after the link was made is not shown."""
    owner = make_user("olive")
    conversation, _ = conversation_with_round(owner)
    link = share(conversation)
    tool_round_seed(conversation, question="And Rome?", calls=(("get_weather", '{"city": "Rome"}', "25"),))

    html = snapshot_of(page(link))

    assert "Used 2 tools" in html and "get_weather({&quot;city&quot;: &quot;Paris&quot;})" in html
    assert "Rome" not in html
    assert shared_url(link).startswith("/s/")
