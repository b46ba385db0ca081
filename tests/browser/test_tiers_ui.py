"""Tiers in the browser (issue 5): the model picker, each answer's tokens and cost, and a rate
limit shown as a message a person can act on. Headless Chromium against the shared server
(tests/browser/chat_ui_support.py has the fixtures' story), with the scripted engine double."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from conversations.models import Turn
from tests.browser.chat_ui_support import ANSWER, COMPOSER_BOX, browser, new_page, send, ui_login  # noqa: F401

pytestmark = pytest.mark.browser


def test_a_paid_user_picks_reasoning_and_sees_each_answers_tokens_and_cost(
    live, engine_double, make_user, new_page  # noqa: F811
):
    make_user("pat", tier="paid")
    page = new_page()
    ui_login(page, live.url, "pat")
    picker = page.locator("#composer select[name=model]")
    expect(picker.locator("option")).to_have_text([re.compile("Mini"), re.compile("Frontier"), re.compile("Reasoning")])
    expect(picker).to_have_value("frontier")  # the paid tier's default
    picker.select_option("reasoning")
    send(page, "why is the sky blue?")

    usage = page.locator(f"{ANSWER}.complete [data-stream-usage]")
    expect(usage).to_have_text(re.compile(r"^\d+ \+ 4 tokens · \$0\.\d{6} · reasoning$"))
    answer = Turn.objects.get(role="assistant", conversation__owner__username="pat")
    assert answer.pool == "reasoning"
    # After a reload the stored answer shows the same line, and the pick stays.
    page.reload()
    expect(page.locator(f"{ANSWER} .usage")).to_have_text(
        f"{answer.prompt_tokens} + 4 tokens · ${answer.cost_usd:.6f} · reasoning"
    )
    expect(page.locator("#composer select[name=model]")).to_have_value("reasoning")


def test_a_free_user_over_the_limit_reads_why_and_when_to_retry(
    live, engine_double, make_user, new_page, settings  # noqa: F811
):
    settings.CHAT_RATE_LIMITS_BY_TIER = {"free": {"rpm": 1, "tpm": 1_000_000}}
    make_user("fay")
    page = new_page()
    ui_login(page, live.url, "fay")
    expect(page.locator("#composer select[name=model]")).to_have_count(0)  # one model: no picker
    send(page, "first")
    expect(page.locator(f"{ANSWER}.complete")).to_have_count(1)
    send(page, "second")
    expect(page.locator("#composer-error")).to_have_text(re.compile(r"limit of requests per minute .* Try again in \d+ s"))
    expect(page.locator("#messages article.user")).to_have_count(1)
    assert page.input_value(COMPOSER_BOX) == "second"  # the message is kept to send again
    assert len(engine_double.requests) == 1
