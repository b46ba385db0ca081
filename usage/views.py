"""Pages: the user's usage, an organisation's usage per member, and account settings."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from accounts import selectors as account_selectors
from accounts.selectors import orgs_not_for_training
from accounts.services import CUSTOM_INSTRUCTIONS_MAX_CHARS
from usage import selectors
from usage.charts import daily_bar_chart

DAY_CHOICES = (7, 30, 90)
DEFAULT_DAYS = 30


def _days(request: HttpRequest) -> int:
    """The window the page shows: ``?days=`` one of DAY_CHOICES, else 30."""
    try:
        days = int(request.GET.get("days", DEFAULT_DAYS))
    except ValueError:
        return DEFAULT_DAYS
    return days if days in DAY_CHOICES else DEFAULT_DAYS


@require_GET
@login_required
def usage_page(request: HttpRequest) -> HttpResponse:
    """The signed-in user's tokens and cost per UTC day over the last ``?days=`` (7, 30 or 90;
    default 30): a bar chart, a table and totals; links to the organisations they administer."""
    days = _days(request)
    now = timezone.now()  # one "today" for the table and the totals
    daily = selectors.usage_daily(user=request.user, days=days, now=now)
    context = {
        "days": days,
        "day_choices": DAY_CHOICES,
        "daily": list(reversed(daily)),  # the table reads newest first
        "chart": daily_bar_chart(daily),
        "totals": selectors.usage_totals(user=request.user, days=days, now=now),
        "orgs": selectors.orgs_administered(user=request.user),
    }
    return render(request, "usage/usage.html", context)


@require_GET
@login_required
def org_usage_page(request: HttpRequest, slug: str) -> HttpResponse:
    """Usage charged to organisation ``slug`` per member over the last ``?days=`` UTC days.
    Owners and admins of that organisation only: 404 for everyone else."""
    org = account_selectors.org_get_for_admin(slug=slug, user=request.user)
    days = _days(request)
    members = selectors.usage_by_member(org=org, days=days)
    context = {
        "org": org,
        "days": days,
        "day_choices": DAY_CHOICES,
        "members": members,
        "total_tokens": sum(m.tokens for m in members),
        "total_cost": sum((m.cost_usd for m in members), selectors.ZERO_COST),
        "total_requests": sum(m.requests for m in members),
    }
    return render(request, "usage/org_usage.html", context)


@require_GET
@login_required
def account_settings(request: HttpRequest) -> HttpResponse:
    """The user's custom instructions (a form: accounts.views.custom_instructions_set), their
    training opt-out (a checkbox: accounts.views.training_opt_out_set) with the organisations
    of theirs that opted out, tier,
    the models (pools) it allows with their prices and ceilings, the rate limits that apply,
    and links to API keys and usage."""
    user = request.user
    pools = selectors.pools_for_user(user=user)
    # Whether every pool on offer runs the same model: then the page says so plainly (the
    # default set-up: one SmolLM2-135M-Instruct engine, pools differ in priority, limits, price).
    served = {(p.backend, str(p.model_path), p.url, p.model) for p in pools}
    context = {
        "pools": pools,
        "one_model": pools[0].model if len(served) == 1 and pools else "",
        "limits": selectors.rate_limits_for_user(user=user),
        "orgs": selectors.orgs_administered(user=user),
        "custom_instructions_max": CUSTOM_INSTRUCTIONS_MAX_CHARS,
        "orgs_not_for_training": orgs_not_for_training(user=user),
    }
    return render(request, "accounts/settings.html", context)
