"""Forms of the workspace pages: create an organisation, invite someone, the policies.

The moderation policy (thresholds, blocked terms, fail-open) has its own page and form
(moderation/forms.py, ``/orgs/<slug>/moderation/``); the policies page links to it.
"""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from accounts.models import Organisation
from conversations.selectors import retention_days_for_tier
from core import regions
from inference.pools import pool_set
from workspaces import invitations, services
from workspaces.selectors import Seat

MAX_RETENTION_DAYS = 36_500  # 100 years: beyond it, "keep" (blank on a kept tier) says it better
# The most a rate limit column holds (PostgreSQL ``integer``): the bound when the tier has none.
MAX_RATE_LIMIT = 2**31 - 1


def regions_available() -> list[str]:
    """The regions an organisation may choose: those with a database here
    (core/regions.py ``db_for_region``), in settings order."""
    available = []
    for region in settings.CHAT_REGIONS:
        try:
            regions.db_for_region(region)
        except ValidationError:
            continue
        available.append(region)
    return available


class OrganisationCreateForm(forms.Form):
    """Name, URL name (optional: derived from the name) and region of a new organisation."""

    name = forms.CharField(max_length=services.MAX_NAME_CHARS, label="Name")
    slug = forms.CharField(
        max_length=services.MAX_SLUG_CHARS,
        required=False,
        label="URL name",
        help_text="Lower-case letters, digits and hyphens; blank: made from the name.",
    )
    region = forms.ChoiceField(
        label="Region",
        help_text="Where the organisation's conversations are stored (data residency).",
    )

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        choices = regions_available()
        self.fields["region"].choices = [(r, r) for r in choices]
        if user is not None and user.region in choices:
            self.fields["region"].initial = user.region

    def clean_name(self) -> str:
        return services.name_clean(self.cleaned_data["name"])

    def clean(self) -> dict:
        data = super().clean()
        if "name" in data:
            try:
                data["slug"] = services.slug_clean(data.get("slug", ""), name=data["name"])
            except ValidationError as exc:
                self.add_error("slug", exc)
        return data


class InvitationForm(forms.Form):
    """Whom to invite (an email address, or blank for a link) and as what."""

    email = forms.CharField(
        required=False,
        max_length=254,
        label="Email address",
        help_text="Blank: make an invitation link to pass on yourself.",
        widget=forms.EmailInput(attrs={"autocomplete": "off"}),
    )
    role = forms.ChoiceField(label="Role")

    def __init__(self, *args, seat: Seat, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["role"].choices = seat.invitable_roles()

    def clean_email(self) -> str:
        return invitations.email_clean(self.cleaned_data["email"])


def org_tier_limits(org: Organisation) -> dict[str, int | None]:
    """The organisation tier's shared limits, ``{"rpm", "tpm"}`` (None: unlimited), from
    ``settings.CHAT_ORG_RATE_LIMITS_BY_TIER``."""
    entry = (getattr(settings, "CHAT_ORG_RATE_LIMITS_BY_TIER", None) or {}).get(org.tier) or {}
    return {"rpm": entry.get("rpm"), "tpm": entry.get("tpm")}


class PolicyForm(forms.Form):
    """An organisation's policies as its owners set them (``/orgs/<slug>/policies/``).

    - ``pinned_pool``: an exact pool version (``name@version``) the organisation's tier may use,
      or blank; every member's turn in the workspace uses it (inference/router.py).
    - ``retention_days``: conversations are purged this many days after their last turn; blank:
      the tier's default (conversations/retention.py).
    - ``region``: where new conversations are stored (those already stored stay where they are).
    - ``zero_retention``, ``not_for_training``: booleans.
    - ``share_prefix_cache``: the members share one prefix cache in the engine (faster first
      turns on shared instructions; a member can tell from an answer's speed what another sent).
      Off: each member has their own (gateway/tenancy.py).
    - ``rate_limit_rpm`` / ``rate_limit_tpm``: the organisation's shared limits per minute;
      blank: its tier's. Owners may lower them, never raise them above the tier's
      (settings.CHAT_ORG_RATE_LIMITS_BY_TIER): the tier is what the service sells; staff set
      any value in the admin.
    """

    pinned_pool = forms.ChoiceField(required=False, label="Pinned model version")
    retention_days = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_RETENTION_DAYS,
        label="Keep conversations for (days)",
    )
    region = forms.ChoiceField(label="Region")
    zero_retention = forms.BooleanField(required=False, label="Zero data retention")
    not_for_training = forms.BooleanField(required=False, label="Not for training")
    share_prefix_cache = forms.BooleanField(required=False, label="Share the model's prompt cache among members")
    rate_limit_rpm = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_RATE_LIMIT, label="Requests per minute"
    )
    rate_limit_tpm = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_RATE_LIMIT, label="Tokens per minute"
    )

    FIELDS = (
        "pinned_pool", "retention_days", "region", "zero_retention", "not_for_training",
        "share_prefix_cache", "rate_limit_rpm", "rate_limit_tpm",
    )  # fmt: skip

    def __init__(self, *args, org: Organisation, **kwargs):
        kwargs.setdefault("initial", {name: getattr(org, name) for name in self.FIELDS})
        super().__init__(*args, **kwargs)
        self.org = org
        pools = [p for p in pool_set() if org.tier in p.tiers]
        self.fields["pinned_pool"].choices = [("", "No pin: each member's usual model")] + [
            (p.key, f"{p.label or p.name} ({p.key})") for p in pools
        ]
        self.pin_unavailable = bool(org.pinned_pool) and org.pinned_pool not in {
            p.key for p in pools
        }
        available = regions_available()
        if org.region not in available:
            available.insert(0, org.region)  # shown, but saving it again is refused in clean
        self.fields["region"].choices = [(r, r) for r in available]
        self.tier_limits = org_tier_limits(org)
        for kind in ("rpm", "tpm"):
            ceiling = self.tier_limits[kind]
            field = self.fields[f"rate_limit_{kind}"]
            if ceiling is not None:
                field.validators.append(_at_most(ceiling, kind))
                field.widget.attrs.update({"max": ceiling, "placeholder": ceiling})
            else:
                field.widget.attrs["placeholder"] = "unlimited"
        self.tier_retention_days = retention_days_for_tier(org.tier)
        self.fields["retention_days"].widget.attrs["placeholder"] = (
            self.tier_retention_days if self.tier_retention_days is not None else "keep"
        )

    def clean_region(self) -> str:
        region = self.cleaned_data["region"]
        try:
            return services.region_clean(region)
        except ValidationError as exc:
            raise ValidationError(exc.messages[0], code="region_unavailable") from None

    def changes(self) -> dict:
        """The policy fields as validated (``None`` for blank numbers, "" for no pin)."""
        return {name: self.cleaned_data[name] for name in self.FIELDS}


def _at_most(ceiling: int, kind: str):
    """A validator refusing more than the tier's limit, with a message saying why."""
    unit = "requests" if kind == "rpm" else "tokens"

    def validate(value: int | None) -> None:
        if value is not None and value > ceiling:
            raise ValidationError(
                f"Your organisation's tier allows at most {ceiling:,} {unit} per minute; you can "
                "set a lower limit, not a higher one (ask the service's staff for more).",
                code="above_tier",
            )

    return validate
