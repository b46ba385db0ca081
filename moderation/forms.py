"""Forms for an organisation's moderation policy: per-category thresholds, blocked terms and
fail-open (the page at ``/orgs/<slug>/moderation/`` and the organisation admin).

What is stored (accounts.models.Organisation):

- ``moderation_thresholds``: ``{category: float}``, only the categories the organisation set; a
  missing category uses ``settings.CHAT_MODERATION_THRESHOLDS`` (moderation/verdicts.py
  ``policy_for`` merges them at each turn).
- ``blocked_terms``: a list of trimmed, de-duplicated strings (at most
  :data:`MAX_BLOCKED_TERMS`, each at most :data:`MAX_TERM_CHARS` characters).
- ``moderation_fail_open``: whether a failed or timed-out check lets a turn through (PF-M2).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from accounts.models import Organisation

MAX_BLOCKED_TERMS = 500
MAX_TERM_CHARS = 100
THRESHOLD_PREFIX = "threshold_"

# What each category catches, for people setting its threshold. Categories come from
# settings.CHAT_MODERATION_THRESHOLDS; one missing here is shown by its name.
CATEGORY_LABELS: dict[str, tuple[str, str]] = {
    "child_sexual_exploitation": (
        "Sexual content involving minors",
        "Requests for sexual content about children (S4). Stops messages and answers.",
    ),
    "indiscriminate_weapons": (
        "Weapons of mass harm",
        "Chemical, biological, nuclear weapons and explosives (S9). Stops messages and answers.",
    ),
    "violent_crimes": (
        "Violent crimes",
        "Help hurting or killing people (S1). Stops messages; answers are noted.",
    ),
    "self_harm": (
        "Self-harm",
        "Ways to hurt or kill oneself (S11). Stops messages; answers are noted.",
    ),
    "hate": (
        "Hate",
        "Content attacking people for who they are (S10). Stops messages; answers are noted.",
    ),
    "harassment": (
        "Harassment and threats",
        "Threatening, stalking or bullying someone. Noted only, unless you set a threshold.",
    ),
    "non_violent_crimes": (
        "Non-violent crimes",
        "Fraud, hacking, theft, drugs (S2). Noted only, unless you set a threshold.",
    ),
    "sexual_content": (
        "Sexual content (adults)",
        "Explicit sexual content (S12). Noted only, unless you set a threshold.",
    ),
    "offensive": (
        "Offensive language",
        "Insults, slurs and profanity (alt-profanity-check's model). Noted only: offensive "
        "words alone stop nothing unless you set a threshold.",
    ),
    "prompt_injection": (
        "Prompt injection",
        "Attempts to override the assistant's instructions: \"ignore previous instructions\", "
        "role-play jailbreaks, encoded, translated or split-up variants.",
    ),
    "blocked_term": (
        "Blocked terms",
        "Any of this organisation's blocked terms below, in a message or an answer.",
    ),
    "system_prompt_leak": (
        "System prompt leak",
        "An answer that repeats the assistant's instructions, also reformatted (answers only).",
    ),
    "unsafe": (
        "Unsafe content (guard model)",
        "The hazard categories of a Llama-Guard-style model, where this deployment uses one.",
    ),
}


def moderation_categories() -> list[str]:
    """The categories with a threshold, in settings order (``CHAT_MODERATION_THRESHOLDS``)."""
    return list(settings.CHAT_MODERATION_THRESHOLDS)


def category_label(category: str) -> str:
    """A person's name for ``category`` ("prompt_injection" -> "Prompt injection")."""
    return CATEGORY_LABELS.get(category, (category.replace("_", " ").capitalize(), ""))[0]


def thresholds_clean(value: object) -> dict[str, float]:
    """Validate stored thresholds: a dict of known categories to numbers in 0..1.

    Returns ``{category: float}``. Raises ValidationError naming the first bad key or value.
    Used by the organisation admin, where the field is edited as raw JSON."""
    if value in (None, ""):
        return {}
    if not isinstance(value, dict):
        raise ValidationError(
            'Thresholds must be an object such as {"offensive": 0.9}.', code="not_a_dict"
        )
    known = moderation_categories()
    cleaned: dict[str, float] = {}
    for category, raw in value.items():
        if category not in known:
            raise ValidationError(
                f'Unknown category "{category}": use one of {", ".join(known)}.',
                code="unknown_category",
            )
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            raise ValidationError(
                f'The threshold of "{category}" must be a number from 0 to 1.', code="not_a_number"
            )
        if not 0 <= raw <= 1:
            raise ValidationError(
                f'The threshold of "{category}" must be from 0 to 1 (it is {raw}).', code="range"
            )
        cleaned[category] = float(raw)
    return cleaned


def blocked_terms_clean(terms: Iterable[object]) -> list[str]:
    """Trim each term (inner whitespace runs become one space), drop empty ones and repeats
    (case-insensitive: matching ignores case, moderation/local.py), keep the first spelling and
    the order. Raises ValidationError for a term longer than :data:`MAX_TERM_CHARS` characters
    (naming its line) or more than :data:`MAX_BLOCKED_TERMS` distinct terms."""
    cleaned: list[str] = []
    seen: set[str] = set()
    for line, raw in enumerate(terms, start=1):
        if not isinstance(raw, str):
            raise ValidationError(f"Term {line} is not text.", code="not_text")
        term = " ".join(raw.replace("\x00", "").split())
        if not term:
            continue
        if len(term) > MAX_TERM_CHARS:
            raise ValidationError(
                f'Line {line} ("{term[:30]}…") is {len(term)} characters long; a blocked term '
                f"can be at most {MAX_TERM_CHARS}.",
                code="term_too_long",
            )
        key = term.casefold()
        if key in seen:
            continue
        seen.add(key)
        cleaned.append(term)
    if len(cleaned) > MAX_BLOCKED_TERMS:
        raise ValidationError(
            f"That is {len(cleaned)} different terms; at most {MAX_BLOCKED_TERMS} are allowed.",
            code="too_many_terms",
        )
    return cleaned


class ModerationPolicyForm(forms.ModelForm):
    """An organisation's moderation policy, as its owners and admins edit it.

    One optional number field per category (``threshold_<category>``, 0..1; blank: the
    deployment default, shown as the placeholder), ``blocked_terms`` (a textarea, one term per
    line) and ``moderation_fail_open``. :meth:`save` writes only the three moderation fields."""

    blocked_terms = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 40, "spellcheck": "false"}),
        label="Blocked terms",
        help_text=(
            f"One per line. Matched as whole words, ignoring case, in messages and answers. "
            f"At most {MAX_BLOCKED_TERMS} terms of up to {MAX_TERM_CHARS} characters."
        ),
    )

    class Meta:
        model = Organisation
        fields = ("moderation_fail_open",)
        labels = {"moderation_fail_open": "Let turns through when the check fails (fail-open)"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        defaults = settings.CHAT_MODERATION_THRESHOLDS
        stored = self.instance.moderation_thresholds or {}
        fields = {}
        for category in moderation_categories():
            label, help_text = CATEGORY_LABELS.get(category, (category_label(category), ""))
            fields[THRESHOLD_PREFIX + category] = forms.FloatField(
                required=False,
                min_value=0,
                max_value=1,
                label=label,
                help_text=help_text,
                initial=stored.get(category),
                widget=forms.NumberInput(
                    attrs={"step": "0.01", "placeholder": defaults[category]}
                ),
            )
        # Thresholds first, then terms, then fail-open: the order of the page.
        self.fields = {**fields, **self.fields}
        self.fields["blocked_terms"].initial = "\n".join(self.instance.blocked_terms or [])

    def threshold_rows(self) -> list[dict]:
        """One row per category for the template: ``{"category", "field", "default"}``."""
        defaults = settings.CHAT_MODERATION_THRESHOLDS
        return [
            {"category": c, "field": self[THRESHOLD_PREFIX + c], "default": defaults[c]}
            for c in moderation_categories()
        ]

    def clean_blocked_terms(self) -> list[str]:
        return blocked_terms_clean(self.cleaned_data["blocked_terms"].splitlines())

    def thresholds(self) -> dict[str, float]:
        """The thresholds set (valid form only): blank fields are left out (defaults apply)."""
        return {
            category: value
            for category in moderation_categories()
            if (value := self.cleaned_data.get(THRESHOLD_PREFIX + category)) is not None
        }

    @transaction.atomic
    def save(self, commit: bool = True) -> Organisation:
        """Store the policy on the organisation; with ``commit``, only the three moderation
        columns are written (an edit elsewhere in the meantime is not overwritten). It applies
        from the next turn: each turn reads its organisation's policy."""
        org = self.instance
        org.moderation_thresholds = self.thresholds()
        org.blocked_terms = self.cleaned_data["blocked_terms"]
        org.moderation_fail_open = self.cleaned_data["moderation_fail_open"]
        if commit:
            org.save(
                update_fields=["moderation_thresholds", "blocked_terms", "moderation_fail_open"]
            )
        return org


class OrganisationAdminForm(forms.ModelForm):
    """The organisation admin's form: the moderation JSON fields pass the same checks as the
    organisation's own page (:func:`thresholds_clean`, :func:`blocked_terms_clean`)."""

    class Meta:
        model = Organisation
        exclude = ("members",)  # memberships are edited inline (a through model)

    def clean_moderation_thresholds(self) -> dict[str, float]:
        return thresholds_clean(self.cleaned_data.get("moderation_thresholds"))

    def clean_blocked_terms(self) -> list[str]:
        value = self.cleaned_data.get("blocked_terms") or []
        if not isinstance(value, list):
            raise ValidationError('Blocked terms must be a list such as ["term one", "term two"].')
        return blocked_terms_clean(value)
