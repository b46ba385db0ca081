"""The organisation moderation page: thresholds, blocked terms and fail-open, for the
organisation's owners and admins."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from audit.models import Action
from audit.services import audit_record
from moderation.forms import ModerationPolicyForm
from usage.selectors import org_get_for_admin


@require_http_methods(["GET", "POST"])
@login_required
def org_moderation_page(request: HttpRequest, slug: str) -> HttpResponse:
    """``GET``: organisation ``slug``'s moderation policy as a form. ``POST``: validate and
    save it, then redirect back (303) with a confirmation; an invalid form is shown again with
    its errors (400). Owners and admins of that organisation only: 404 for every other
    signed-in user, whether or not the organisation exists (usage.selectors.org_get_for_admin);
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
