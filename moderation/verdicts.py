"""Moderation verdicts and policies (issue 6): what a gate decided and the rules it applied.

Categories (issue 28): the hazard categories of the MLCommons taxonomy as Llama Guard 3 names
them (S1 violent crimes, S2 non-violent crimes, S4 child sexual exploitation, S9 indiscriminate
weapons, S10 hate, S11 self-harm, S12 sexual content) plus OpenAI's harassment, scored by the
harm classifier (moderation/harm.py); the design's prompt injection and system-prompt leak; the
organisation's blocked terms; offensive language; a guard model's ``unsafe``.

Actions by severity: each category has an action per gate (``settings.CHAT_MODERATION_ACTIONS``):
``block`` (the input gate refuses the message, the output gate withdraws the answer) when its
score reaches the category's threshold, or ``flag`` (the verdict notes the category at
``NOTE_THRESHOLD``, the text passes). By default only high-severity categories block, at high
confidence (threshold 0.9 for the harm classifier's); offensive words, sexual content between
adults and the medium-severity harms only flag. An organisation opts a category in to blocking
at both gates by setting its threshold (``Organisation.moderation_thresholds``).

A ``Verdict`` is what one check of one text (a user message at the input gate, a window of the
answer at the output gate) concluded; ``Verdict.as_json()`` is what ``Turn.moderation_verdict``
stores. A ``Policy`` is what the check applies: per-category thresholds (the deployment's
``settings.CHAT_MODERATION_THRESHOLDS`` overridden by the organisation's
``moderation_thresholds``), the organisation's blocked terms, whether a failed check lets the
turn through (``moderation_fail_open``, default no: PF-M2), and the turn's real system prompt
(for the output gate's leak check).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

# The harm classifier's categories (moderation/harm.py), in severity order.
HARM_CATEGORIES = (
    "child_sexual_exploitation",
    "indiscriminate_weapons",
    "violent_crimes",
    "self_harm",
    "hate",
    "harassment",
    "non_violent_crimes",
    "sexual_content",
)
CATEGORIES = (
    *HARM_CATEGORIES,
    "offensive",
    "prompt_injection",
    "blocked_term",
    "system_prompt_leak",
    "unsafe",
    "moderation_unavailable",
)
# Categories a threshold applies to (moderation_unavailable is not scored: a failed check).
SCORED_CATEGORIES = CATEGORIES[:-1]
# Used for a category missing from settings and the organisation's overrides.
DEFAULT_THRESHOLD = 0.5
# A score at or above this is noted in the verdict (``Verdict.noted``) even when the category
# only flags: what admins and the bench read, never what stops a text.
NOTE_THRESHOLD = 0.5
BLOCK, FLAG = "block", "flag"
ACTIONS = (BLOCK, FLAG)

# Llama Guard 3's hazard categories (MLCommons taxonomy), for the guard adapter's S-codes.
GUARD_HAZARDS = {
    "S1": "violent crimes",
    "S2": "non-violent crimes",
    "S3": "sex-related crimes",
    "S4": "child sexual exploitation",
    "S5": "defamation",
    "S6": "specialized advice",
    "S7": "privacy",
    "S8": "intellectual property",
    "S9": "indiscriminate weapons",
    "S10": "hate",
    "S11": "suicide and self-harm",
    "S12": "sexual content",
    "S13": "elections",
    "S14": "code interpreter abuse",
}

# Plain words for each category (notices, admin pages).
CATEGORY_NAMES = {
    "child_sexual_exploitation": "sexual content involving minors",
    "indiscriminate_weapons": "weapons of mass harm",
    "violent_crimes": "violence",
    "self_harm": "self-harm",
    "hate": "hate",
    "harassment": "harassment or threats",
    "non_violent_crimes": "crime",
    "sexual_content": "sexual content",
    "offensive": "offensive language",
    "prompt_injection": "an attempt to override the assistant's instructions",
    "blocked_term": "a blocked term",
    "system_prompt_leak": "the assistant's hidden instructions",
    "unsafe": "unsafe content",
}

_REASONS = {
    "child_sexual_exploitation": "it asks for sexual content involving children",
    "indiscriminate_weapons": "it asks how to make weapons that can kill many people",
    "violent_crimes": "it asks for help hurting or killing someone",
    "self_harm": (
        "it asks for ways to hurt yourself. If you are thinking about it, please talk to "
        "someone you trust or a local crisis line now"
    ),
    "hate": "it asks for content attacking people for who they are",
    "harassment": "it asks for help threatening or harassing someone",
    "non_violent_crimes": "it asks for help committing a crime",
    "sexual_content": "it asks for explicit sexual content",
    "offensive": "it contains offensive language",
    "prompt_injection": "it looks like an attempt to override the assistant's instructions",
    "blocked_term": "it contains a term your organisation does not allow",
    "system_prompt_leak": "it repeated the assistant's confidential instructions",
    "unsafe": "it was judged unsafe",
    "moderation_unavailable": (
        "the safety check is unavailable right now, so nothing was sent unchecked; "
        "please try again in a moment"
    ),
}


@dataclass(frozen=True)
class Verdict:
    """One moderation check's outcome.

    ``flagged``: the text must not pass. ``categories``: the flagged categories in
    ``CATEGORIES`` order (empty when clean). ``scores``: every category checked -> score 0..1
    (the guard adapter also lists the hazard codes it reported, ``"S10": 1.0``).
    ``classifier``: ``"local"`` or ``"guard:<pool>"``; ``version``: the classifier's version
    string; ``gate``: ``"input"`` or ``"output"``; ``error``: why the check failed (a verdict
    from a failed check, flagged unless the policy fails open), else None.
    """

    flagged: bool
    categories: tuple[str, ...]
    scores: dict[str, float]
    classifier: str
    version: str
    gate: str = "input"
    error: str | None = None
    noted: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """What ``Turn.moderation_verdict`` stores: ``{"flagged", "categories", "scores",
        "classifier", "version", "gate", "error", "noted"}`` (JSON types; scores rounded to 4
        places)."""
        return {
            "flagged": self.flagged,
            "categories": list(self.categories),
            "scores": {k: round(float(v), 4) for k, v in self.scores.items()},
            "classifier": self.classifier,
            "version": self.version,
            "gate": self.gate,
            "error": self.error,
            "noted": list(self.noted),
        }

    def message(self) -> str:
        """One sentence a person understands, naming why the text was stopped: ``"This message
        was not sent: it looks like an attempt to override the assistant's instructions."``
        (input gate) or ``"This answer was withdrawn: ..."`` (output gate). A clean verdict
        says so."""
        subject = ("This answer was withdrawn" if self.gate == "output"
                   else "This message was not sent")
        if not self.flagged:
            return "This message passed the safety checks."
        reasons = []
        for category in self.categories:
            reason = _REASONS.get(category, f"it was flagged ({category})")
            if category == "unsafe":
                hazards = [GUARD_HAZARDS[c] for c in self.scores if c in GUARD_HAZARDS]
                if hazards:
                    reason += f" ({', '.join(hazards)})"
            reasons.append(reason)
        if not reasons:
            reasons = ["it was flagged by the safety checks"]
        if len(reasons) > 1:
            reasons = [", ".join(reasons[:-1]) + " and " + reasons[-1]]
        return f"{subject}: {reasons[0]}."

    @property
    def category(self) -> str | None:
        """The first flagged category (the one an API error names), or None when clean."""
        return self.categories[0] if self.categories else None


def clean_verdict(*, classifier: str, version: str, gate: str = "input",
                  scores: dict[str, float] | None = None) -> Verdict:
    """A verdict that lets the text through (e.g. for an empty text, or with gates off)."""
    return Verdict(flagged=False, categories=(), scores=dict(scores or {}),
                   classifier=classifier, version=version, gate=gate)


def verdict_from_scores(scores: dict[str, float], policy: Policy, *, classifier: str,
                        version: str, gate: str) -> Verdict:
    """The verdict for ``scores`` (category -> 0..1) under ``policy`` at ``gate``: a category
    stops the text (is in ``categories``, ``flagged`` True) when its action at this gate is
    ``block`` and its score >= ``policy.threshold(category)``; any other category scoring >=
    ``min(NOTE_THRESHOLD, threshold)`` is ``noted``. Categories come out in ``CATEGORIES``
    order; keys outside ``CATEGORIES`` (e.g. guard S-codes) are kept in scores, never flagged."""
    flagged, noted = [], []
    for c in CATEGORIES:
        if c not in scores:
            continue
        threshold = policy.threshold(c)
        if policy.action(c, gate) == BLOCK and scores[c] >= threshold:
            flagged.append(c)
        elif scores[c] >= min(NOTE_THRESHOLD, threshold):
            noted.append(c)
    return Verdict(flagged=bool(flagged), categories=tuple(flagged), scores=dict(scores),
                   classifier=classifier, version=version, gate=gate, noted=tuple(noted))


@dataclass(frozen=True)
class Policy:
    """What a check applies. ``thresholds``: category -> score at or above which it flags
    (0..1); ``blocked_terms``: words or phrases no message or answer may contain (matched
    case- and spelling-insensitively at word boundaries); ``fail_open``: a check that errors or
    times out lets the text through (counted, never silent) instead of refusing it;
    ``system_prompt``: the turn's real system prompt (the output gate's leak check; "" skips)."""

    thresholds: dict[str, float] = field(default_factory=dict)
    blocked_terms: tuple[str, ...] = ()
    fail_open: bool = False
    system_prompt: str = ""
    actions: dict[str, dict[str, str]] = field(default_factory=dict)

    def threshold(self, category: str) -> float:
        """The threshold for ``category`` (``DEFAULT_THRESHOLD`` if not configured)."""
        return float(self.thresholds.get(category, DEFAULT_THRESHOLD))

    def action(self, category: str, gate: str) -> str:
        """``"block"`` or ``"flag"``: what reaching ``category``'s threshold does at ``gate``
        (``"input"`` / ``"output"``). A category without a configured action blocks (the
        pre-issue-28 behaviour, and fail-closed for a new category); ``moderation_unavailable``
        is not scored (acheck decides it)."""
        return self.actions.get(category, {}).get(gate, BLOCK)


def _clean_thresholds(raw: Any) -> dict[str, float]:
    """Known categories with numeric values clamped to 0..1; anything else is dropped (an
    organisation's bad JSON must not break the gate)."""
    out: dict[str, float] = {}
    if not isinstance(raw, dict):
        return out
    for category, value in raw.items():
        if category not in SCORED_CATEGORIES or isinstance(value, bool):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if number == number:  # not NaN
            out[category] = min(1.0, max(0.0, number))
    return out


def policy_for(org=None, *, system_prompt: str = "") -> Policy:
    """The policy for a turn of ``org`` (an ``accounts.Organisation`` or None for a personal
    account): ``settings.CHAT_MODERATION_THRESHOLDS`` overridden per category by
    ``org.moderation_thresholds``, ``org.blocked_terms`` (strings, stripped, empty ones and
    duplicates dropped), ``org.moderation_fail_open``; ``system_prompt``: the turn's real
    system prompt; actions from ``settings.CHAT_MODERATION_ACTIONS``, every category the
    organisation set a threshold for blocking at both gates (its opt-in). Reads only the org's
    fields (no query)."""
    thresholds = _clean_thresholds(settings.CHAT_MODERATION_THRESHOLDS)
    actions = _clean_actions(getattr(settings, "CHAT_MODERATION_ACTIONS", None))
    terms: list[str] = []
    fail_open = False
    if org is not None:
        chosen = _clean_thresholds(org.moderation_thresholds)
        thresholds.update(chosen)
        # Setting a threshold opts the category in to blocking at both gates.
        for category in chosen:
            actions[category] = {"input": BLOCK, "output": BLOCK}
        for term in org.blocked_terms or ():
            if isinstance(term, str) and term.strip() and term.strip() not in terms:
                terms.append(term.strip())
        fail_open = bool(org.moderation_fail_open)
    return Policy(thresholds=thresholds, blocked_terms=tuple(terms), fail_open=fail_open,
                  system_prompt=system_prompt or "", actions=actions)


def _clean_actions(raw: Any) -> dict[str, dict[str, str]]:
    """``{category: {"input": "block"|"flag", "output": ...}}`` for known categories; anything
    else dropped (a gate left out keeps the default, block)."""
    out: dict[str, dict[str, str]] = {}
    if not isinstance(raw, dict):
        return out
    for category, gates in raw.items():
        if category in SCORED_CATEGORIES and isinstance(gates, dict):
            out[category] = {g: a for g, a in gates.items()
                             if g in ("input", "output") and a in ACTIONS}
    return out
