"""The organisation moderation pages, for the organisation's owners and admins: the policy
(thresholds, blocked terms, fail-open) and the review of withdrawn answers (issue 28)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from accounts.selectors import org_get_for_admin
from audit.models import Action
from audit.services import audit_record
from moderation import selectors as moderation_selectors
from moderation import services as moderation_services
from moderation.forms import ModerationPolicyForm, category_label


@require_http_methods(["GET", "POST"])
@login_required
def org_moderation_page(request: HttpRequest, slug: str) -> HttpResponse:
    """``GET``: organisation ``slug``'s moderation policy as a form. ``POST``: validate and
    save it, then redirect back (303) with a confirmation; an invalid form is shown again with
    its errors (400). Owners and admins of that organisation only: 404 for every other
    signed-in user, whether or not the organisation exists (accounts.selectors.org_get_for_admin);
    anonymous visitors are sent to sign in, as on the organisation's usage page. Changes
    apply from the next turn: each turn reads its organisation's policy."""
    org = org_get_for_admin(slug=slug, user=request.user)
    status = 200
    if request.method == "POST":
        form = ModerationPolicyForm(request.POST, instance=org)
        if form.is_valid():
            form.save()
            audit_record(
                actor=request.user, action=Action.ORG_MODERATION_CHANGE, org=org,
                target_type="accounts.organisation", target_id=org.pk,
                details={"fields": form.changed_data},
            )  # fmt: skip
            messages.success(request, "Saved. The new policy applies from the next message.")
            response = redirect("org-moderation", slug=org.slug)
            response.status_code = 303
            return response
        status = 400
    else:
        form = ModerationPolicyForm(instance=org)
    context = {
        "org": org,
        "form": form,
        "timeout_ms": round(settings.CHAT_MODERATION_TIMEOUT_S * 1000),
        "guard_pool": (
            settings.CHAT_MODERATION_GUARD_POOL
            if settings.CHAT_MODERATOR.endswith("GuardModerator")
            else ""
        ),
    }
    return render(request, "moderation/org_moderation.html", context, status=status)


@require_http_methods(["GET"])
@login_required
def org_review_page(request: HttpRequest, slug: str) -> HttpResponse:
    """The answers the output gate withdrew from organisation ``slug``'s members, newest first:
    the verdict (categories in plain words, scores), the window of the answer that fired, the
    text as it was streamed, and a "This was fine" button (a labelled false positive). Owners
    and admins only (404 otherwise, as the policy page). Rows follow the conversations'
    retention: a purged or deleted conversation takes its withdrawn answers along."""
    org = org_get_for_admin(slug=slug, user=request.user)
    rows = [
        {
            "review": review,
            "categories": [category_label(c) for c in review.categories],
            "scores": sorted(((category_label(c), s) for c, s in (review.verdict.get("scores") or {}).items()
                              if s >= 0.5), key=lambda pair: -pair[1]),
        }
        for review in moderation_selectors.withdrawn_answers_for_org(org=org)
    ]
    return render(request, "moderation/org_review.html", {"org": org, "rows": rows})


@require_POST
@login_required
def org_review_fine(request: HttpRequest, slug: str, review_id) -> HttpResponse:
    """"This was fine": record the withdrawn answer ``review_id`` as a false positive, then back
    to the review page (303). Owners and admins of ``slug`` only; 404 for another
    organisation's answer."""
    org = org_get_for_admin(slug=slug, user=request.user)
    review = moderation_selectors.withdrawn_answer_get_for_org(review_id=review_id, org=org)
    moderation_services.withdrawn_answer_mark_fine(review=review, reviewer=request.user)
    messages.success(request, "Recorded as a false positive. Thank you.")
    response = redirect("org-moderation-review", slug=org.slug)
    response.status_code = 303
    return response
