"""The usage page in a real browser (headless Debian Chromium, Playwright) against daphne
serving the real app (``live``): the server-rendered SVG chart draws one bar per day, scaled
to the day's tokens, with the totals beside it. Fixtures come from chat_ui_support.py."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from inference.pools import pool_set
from tests.browser.chat_ui_support import browser, new_page  # noqa: F401
from usage.models import UsageRecord
from usage.services import usage_record

pytestmark = pytest.mark.browser


def signed_in_page(new_page, live, user):  # noqa: F811
    """A page whose browser context carries ``user``'s session cookie."""
    client = Client()
    client.force_login(user)
    page = new_page()
    page.context.add_cookies(
        [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live.url}]
    )
    return page


def test_usage_page_draws_one_bar_per_day_and_the_totals(live, new_page, make_user):  # noqa: F811
    """Given 1,500 tokens today and 500 three days ago, when the user opens the usage page for
    the last 7 days, then the chart (an image named by its title) has 7 bars, today's drawn
    three times as tall as the earlier day's and idle days flat, and the totals read 2,000
    tokens and $0.007115."""
    user = make_user("uma")
    now = timezone.now()
    for when, pool_name, prompt, cached, completion in [
        (now, "mini", 1200, 200, 300),
        (now - dt.timedelta(days=3), "frontier", 400, 0, 100),
    ]:
        row = usage_record(
            user=user, org=None, turn_id=uuid.uuid4(), conversation_id=None,
            route_pool=pool_set().get(pool_name), tier="free", prompt_tokens=prompt,
            cached_tokens=cached, completion_tokens=completion, status="complete",
        )
        UsageRecord.objects.filter(pk=row.pk).update(created_at=when)
    page = signed_in_page(new_page, live, user)

    page.goto(f"{live.url}/usage/?days=7")

    chart = page.get_by_role("img", name="Tokens per day, last 7 days")
    expect(chart).to_be_visible()
    bars = chart.locator("rect.bar")
    expect(bars).to_have_count(7)
    heights = {}  # as drawn, in CSS pixels (a flat bar has no box: 0)
    for i in range(7):
        box = bars.nth(i).bounding_box()
        heights[bars.nth(i).get_attribute("data-date")] = box["height"] if box else 0.0
    today, earlier = now.date().isoformat(), (now - dt.timedelta(days=3)).date().isoformat()
    assert list(heights) == sorted(heights)  # oldest first, today last
    assert list(heights)[-1] == today
    assert heights[earlier] > 0
    assert heights[today] == pytest.approx(3 * heights[earlier], rel=0.02)
    assert [h for d, h in heights.items() if d not in (today, earlier)] == [0] * 5
    expect(page.locator("#total-tokens")).to_have_text("2,000")
    expect(page.locator("#total-cost")).to_have_text("$0.007115")
    expect(page.locator(f'#usage-daily tr[data-date="{today}"] td').nth(3)).to_have_text("1,500")
