"""Tool rounds on the chat page (issue 30): an answer written after tool calls shows, above its
text, a closed "Used N tools" block with each call (function and arguments) and its result,
escaped; the rounds are read with the page's text, so the page's query count does not grow with
them. Django test client, real PostgreSQL; rounds from tests/tool_rounds.py."""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from conversations import toolrounds
from tests.tool_rounds import conversation_with_round, tool_round_seed

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def answer_article(html: str, turn_id) -> str:
    """The ``<article>`` of answer ``turn_id`` in ``html``."""
    match = re.search(rf'<article class="turn assistant[^"]*" id="turn-{turn_id}">.*?</article>', html, re.S)
    assert match, f"answer {turn_id} not on the page"
    return match.group(0)


def test_an_answer_after_tool_calls_shows_its_calls_and_results(make_user):
    """Given a stored round of two calls, when the conversation opens, then the final answer's
    article holds a closed "Used 2 tools" block, before its text, with each function, its
    arguments and its result."""
    user = make_user()
    conversation, rnd = conversation_with_round(user)

    html = signed_in(user).get(f"/c/{conversation.pk}/").content.decode()

    article = answer_article(html, rnd.answer.turn_id)
    block = re.search(r'<details class="tool-uses" data-tool-uses>.*?</ol>\s*</details>', article, re.S)
    assert block, article
    assert "Used 2 tools" in block.group(0) and block.group(0).count('class="tool-use"') == 2
    assert "<details class=\"tool-uses\" data-tool-uses open" not in article  # closed
    assert article.index("data-tool-uses") < article.index("It is 21 degrees and clear.")
    assert "get_weather({&quot;city&quot;: &quot;Paris&quot;})" in article
    assert "get_time({&quot;tz&quot;: &quot;Europe/Paris&quot;})" in article
    assert "{&quot;temp_c&quot;: 21, &quot;sky&quot;: &quot;clear&quot;}" in article
    assert ">14:05</pre>" in article


def test_call_and_result_text_is_escaped(make_user):
    """Given a call whose arguments and result hold markup, when the page renders, then both
    show as text (escaped), never as elements."""
    user = make_user()
    evil = "<img src=x onerror=alert(1)>"
    conversation, rnd = conversation_with_round(
        user, calls=(("lookup", json.dumps({"q": evil}), f"<script>alert(2)</script>{evil}"),)
    )

    article = answer_article(signed_in(user).get(f"/c/{conversation.pk}/").content.decode(), rnd.answer.turn_id)

    assert "<img src=x" not in article and "<script>alert(2)" not in article
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in article
    assert "&lt;img src=x onerror=alert(1)&gt;" in article
    assert "Used 1 tool<" in article


def test_a_long_result_shows_its_first_lines_and_opens_in_full(make_user):
    """Given a result of 30 lines, then the block shows its first lines with an ellipsis and
    the whole text inside a "Show the whole result" details."""
    user = make_user()
    long = "\n".join(f"row {i}" for i in range(30))
    conversation, rnd = conversation_with_round(user, calls=(("rows", "{}", long),))

    article = answer_article(signed_in(user).get(f"/c/{conversation.pk}/").content.decode(), rnd.answer.turn_id)

    preview = re.search(r'<pre class="tool-use-preview" data-tool-result>(.*?)</pre>', article, re.S).group(1)
    assert preview == "\n".join(f"row {i}" for i in range(toolrounds.RESULT_PREVIEW_LINES)) + "\u2026"
    assert "Show the whole result" in article
    full = re.search(r'<pre class="tool-use-full" data-tool-result-full>(.*?)</pre>', article, re.S).group(1)
    assert full == long


def test_an_answer_without_tools_has_no_block(make_user, engine_double):
    """Given an ordinary exchange beside a round, then only the round's answer has the block."""
    user = make_user()
    conversation, rnd = conversation_with_round(user)
    plain = tool_round_seed(conversation, question="And tomorrow?", calls=(), answer="Rain.")

    html = signed_in(user).get(f"/c/{conversation.pk}/").content.decode()

    assert html.count("data-tool-uses") == 1
    assert "data-tool-uses" in answer_article(html, rnd.answer.turn_id)
    assert "data-tool-uses" not in answer_article(html, plain.answer.turn_id)


def _queries(client: Client, conversation) -> list[dict]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"/c/{conversation.pk}/")
    assert response.status_code == 200
    return queries.captured_queries


def test_the_page_query_count_does_not_grow_with_rounds(make_user):
    """Given a conversation with one round and one with eight, when each opens, then both take
    the same number of SQL queries, and the second shows all eight blocks."""
    user = make_user()
    one, _ = conversation_with_round(user)
    eight, _ = conversation_with_round(user)
    for i in range(7):
        tool_round_seed(eight, question=f"Again {i}?")
    client = signed_in(user)
    _queries(client, one)  # warm the per-process caches

    few = _queries(client, one)
    many = _queries(client, eight)

    assert len(many) == len(few), [q["sql"][:120] for q in many]
    assert client.get(f"/c/{eight.pk}/").content.decode().count("data-tool-uses") == 8


def test_a_version_flipped_to_shows_its_tool_round(make_user):
    """Given an answer after tool calls, when its version fragment is asked for (the `< >`
    buttons), then it carries the same block."""
    user = make_user()
    conversation, rnd = conversation_with_round(user)

    html = signed_in(user).get(f"/c/{conversation.pk}/turns/{rnd.answer.turn_id}/version").content.decode()

    assert "Used 2 tools" in html and "get_weather(" in html
