"""Admin bulk actions in the audit log: every action run from an admin change list
("Delete selected", "Revoke the selected API keys", "Withdraw the selected invitations", ...),
one ``admin.action.<name>`` entry per selected row, by the staff member who ran it.

Why a middleware: Django records no LogEntry for custom actions, and logs several deletions at
once with ``bulk_create`` (no ``post_save`` signal for audit/signals.py to mirror). This sees
every model admin's change-list POST, present and future, without a hook in each admin.py.

It recognises an action the way ``ModelAdmin.changelist_view`` does (a POST with ``index``, or
with selected rows and no ``index``, and never ``_save``), runs the view itself, and records the
action only when it ran: the action is one the admin offers this user, rows were selected (or
"select all" was used), and the response is not a confirmation page (``delete_selected``'s first
step renders a template; its second step, and other actions, redirect or return their own
response). While the view runs, audit/signals.py's LogEntry mirror is off, so a deletion is
recorded once.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.admin import helpers
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from audit.models import Action
from audit.services import audit_record
from audit.signals import in_admin_action, org_of
from core import regions

MAX_ENTRIES = 1000  # per action; beyond this the rest are summed up in the last entry


def _action_name(request: HttpRequest) -> str | None:
    post = request.POST
    if "_save" in post:
        return None
    if "index" in post:
        try:
            return post.getlist("action")[int(post.get("index", 0))]
        except (ValueError, IndexError):
            return None
    if helpers.ACTION_CHECKBOX_NAME in post:
        return post.get("action")
    return None


class AdminActionAuditMiddleware:
    """Appended to ``settings.MIDDLEWARE`` (chatsite/settings/base.py, the audit block)."""

    def __init__(self, get_response: Callable):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(self, request: HttpRequest, view_func, view_args, view_kwargs):
        model_admin = getattr(view_func, "model_admin", None)
        match = request.resolver_match
        if (
            request.method != "POST"
            or model_admin is None
            or match is None
            or not (match.url_name or "").endswith("_changelist")
        ):
            return None
        name = _action_name(request)
        if not name or name not in model_admin.get_actions(request):
            return None
        selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        select_across = request.POST.get("select_across") == "1"
        opts = model_admin.model._meta
        orgs = {pk: org_of(opts.app_label, opts.model_name, pk) for pk in selected[:MAX_ENTRIES]}
        token = in_admin_action.set(True)
        try:
            response = view_func(request, *view_args, **view_kwargs)
        finally:
            in_admin_action.reset(token)
        ran = (selected or select_across) and (
            300 <= response.status_code < 400
            or (response.status_code < 300 and not isinstance(response, TemplateResponse))
        )
        if ran:
            self._record(
                request, name, f"{opts.app_label}.{opts.model_name}", selected, select_across, orgs,
                self._region(request, model_admin),
            )  # fmt: skip
        return response

    @staticmethod
    def _region(request: HttpRequest, model_admin) -> str | None:
        """The region whose rows a regional admin's list shows (conversations.regional_admin.RegionalAdmin:
        the selected ids are that region's, so their entries' ids stay there); None for others."""
        region_db = getattr(model_admin, "region_db", None)
        if region_db is None:
            return None
        return regions.region_of_db(region_db(request))

    @staticmethod
    def _record(request, name, target_type, selected, select_across, orgs, region) -> None:
        action = f"{Action.ADMIN_ACTION_PREFIX}{name}"
        if select_across:
            # "Select all N": the rows are those matching the change list's filters, not
            # listed in the request; record the filters.
            audit_record(
                actor=request.user,
                action=action,
                target_type=target_type,
                target_id=None,
                details={
                    "via": "admin",
                    "select_across": True,
                    "filters": request.GET.urlencode()[:500],
                },
                region=region,
            )
            return
        for pk in selected[:MAX_ENTRIES]:
            audit_record(
                actor=request.user,
                action=action,
                org=orgs.get(pk),
                target_type=target_type,
                target_id=pk,
                details={"via": "admin"},
                region=region,
            )
        if len(selected) > MAX_ENTRIES:
            audit_record(
                actor=request.user,
                action=action,
                target_type=target_type,
                target_id=None,
                details={"via": "admin", "more_rows": len(selected) - MAX_ENTRIES},
            )
