"""Moderation verdicts in the admin: every turn a gate judged (``Turn.moderation_verdict``), as
the proxy ModeratedTurn, filterable by outcome, category, gate, status, role, pool and model
version. Read-only, like the turn log they are part of.

The organisation admin is the accounts app's (accounts/admin.py); this app replaces its
registration with a subclass whose form checks the moderation fields, so accounts imports nothing
of moderation.
"""

from __future__ import annotations

from django.contrib import admin

from accounts.admin import OrganisationAdmin
from accounts.models import Organisation
from conversations.admin import ModelVersionFilter, PoolFilter, TurnAdminBase, excerpt
from conversations.regional_admin import RegionalAdmin, RegionFilter
from moderation import services as moderation_services
from moderation.forms import OrganisationAdminForm
from moderation.models import ModeratedTurn, WithdrawnAnswer
from moderation.verdicts import CATEGORIES


class OutcomeFilter(admin.SimpleListFilter):
    """Flagged (the text must not pass) or clean verdicts."""

    title = "outcome"
    parameter_name = "outcome"

    def lookups(self, request, model_admin):
        return (("flagged", "Flagged"), ("clean", "Clean"))

    def queryset(self, request, queryset):
        if self.value() == "flagged":
            return queryset.filter(moderation_verdict__flagged=True)
        if self.value() == "clean":
            return queryset.filter(moderation_verdict__flagged=False)
        return queryset


class CategoryFilter(admin.SimpleListFilter):
    """Verdicts that flagged a category (moderation/verdicts.py ``CATEGORIES``)."""

    title = "category"
    parameter_name = "category"

    def lookups(self, request, model_admin):
        return [(c, c.replace("_", " ")) for c in CATEGORIES]

    def queryset(self, request, queryset):
        if self.value() not in CATEGORIES:
            return queryset
        return queryset.filter(moderation_verdict__contains={"categories": [self.value()]})


class GateFilter(admin.SimpleListFilter):
    """The gate that judged: input (the user's message) or output (the answer)."""

    title = "gate"
    parameter_name = "gate"

    def lookups(self, request, model_admin):
        return (("input", "Input (messages)"), ("output", "Output (answers)"))

    def queryset(self, request, queryset):
        if self.value() not in ("input", "output"):
            return queryset
        return queryset.filter(moderation_verdict__gate=self.value())


@admin.register(ModeratedTurn)
class ModeratedTurnAdmin(TurnAdminBase):
    list_display = (
        "created_at", "verdict", "role", "status", "text", "pool", "model_version",
        "conversation",
    )  # fmt: skip
    list_filter = (
        RegionFilter, OutcomeFilter, CategoryFilter, GateFilter, "status", "role", PoolFilter,
        ModelVersionFilter,
    )  # fmt: skip

    def get_queryset(self, request):
        # Turns a gate judged; the conversation in the same query (see ModeratedTurn).
        return (
            super().get_queryset(request)
            .exclude(moderation_verdict={})
            .select_related("conversation")
        )  # fmt: skip

    @admin.display(description="verdict")
    def verdict(self, turn: ModeratedTurn) -> str:
        return self.moderation(turn)

    @admin.display(description="text")
    def text(self, turn: ModeratedTurn) -> str:
        """The start of the judged text (a withdrawn answer keeps none of the flagged text)."""
        return excerpt(turn.content, 60) or "-"


class NoOrganisationFilter(admin.SimpleListFilter):
    """Withdrawn answers of users without an organisation: the site's admins review those
    (an organisation's own admins review theirs at /orgs/<slug>/moderation/review/)."""

    title = "organisation"
    parameter_name = "org"

    def lookups(self, request, model_admin):
        return (("none", "No organisation (site admins review)"), ("any", "An organisation"))

    def queryset(self, request, queryset):
        if self.value() == "none":
            return queryset.filter(org__isnull=True)
        if self.value() == "any":
            return queryset.filter(org__isnull=False)
        return queryset


@admin.register(WithdrawnAnswer)
class WithdrawnAnswerAdmin(RegionalAdmin):
    """Answers the output gate withdrew, with the window that fired (issue 28). Read-only but
    for the "This was fine" action, which records a labelled false positive."""

    list_display = ("created_at", "categories_shown", "window_excerpt", "fine", "owner_id", "org_id")
    list_filter = (RegionFilter, NoOrganisationFilter, "fine")
    readonly_fields = ("conversation", "turn_id", "owner", "org", "verdict", "window", "text",
                       "created_at", "fine", "reviewed_by", "reviewed_at")
    actions = ("mark_fine",)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="categories")
    def categories_shown(self, review: WithdrawnAnswer) -> str:
        return ", ".join(c.replace("_", " ") for c in review.categories) or "-"

    @admin.display(description="window that fired")
    def window_excerpt(self, review: WithdrawnAnswer) -> str:
        return excerpt(review.window, 80) or "-"

    @admin.action(description="This was fine (record a false positive)")
    def mark_fine(self, request, queryset):
        for review in queryset:
            moderation_services.withdrawn_answer_mark_fine(review=review, reviewer=request.user)
        self.message_user(request, f"{queryset.count()} recorded as false positives.")


admin.site.unregister(Organisation)


@admin.register(Organisation)
class ModeratedOrganisationAdmin(OrganisationAdmin):
    """accounts/admin.py's ``OrganisationAdmin``: the moderation fields (raw JSON there) pass the
    same checks as the organisation's own moderation page (moderation/forms.py)."""

    form = OrganisationAdminForm
