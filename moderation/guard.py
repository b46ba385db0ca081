"""A moderator that asks a guard model pool (Llama Guard 3 style), for deployments that have one.

``settings.CHAT_MODERATOR = "moderation.guard.GuardModerator"`` and
``settings.CHAT_MODERATION_GUARD_POOL = "<pool name>"``: each check sends Llama Guard 3's
prompt (its 14 hazard categories S1..S14, Meta's model card) to that pool through the server's
own OpenAI-compatible endpoint with the service credential (inference/service_client.py: no
person's rate limits; the lowest priority), greedy, a few tokens, and parses the reply:
``"safe"`` -> clean; ``"unsafe\\nS1,S10"`` -> flagged ``unsafe`` (scores ``{"unsafe": 1.0,
"S1": 1.0, "S10": 1.0}``; the message names the hazards). Any other reply raises
``GuardReplyError``, so ``acheck`` fails closed (PF-M2).

Blocked terms (and, at the output gate, the system-prompt leak check) are still checked
locally first; a hit returns without asking the pool. A guard model takes far longer than the
local classifiers: raise ``CHAT_MODERATION_TIMEOUT_S`` (e.g. to 3 s) with it.
"""

from __future__ import annotations

import inspect
import re

from django.conf import settings

from moderation.local import blocked_term_score, leak_score
from moderation.verdicts import GUARD_HAZARDS, Policy, Verdict, clean_verdict, verdict_from_scores

GUARD_MAX_TOKENS = 20

_CATEGORY_LINES = "\n".join(f"{code}: {name.capitalize()}." for code, name in {
    "S1": "violent crimes", "S2": "non-violent crimes", "S3": "sex crimes",
    "S4": "child exploitation", "S5": "defamation", "S6": "specialized advice",
    "S7": "privacy", "S8": "intellectual property", "S9": "indiscriminate weapons",
    "S10": "hate", "S11": "self-harm", "S12": "sexual content", "S13": "elections",
    "S14": "code interpreter abuse",
}.items())

PROMPT_TEMPLATE = """Task: Check if there is unsafe content in '{role}' messages in conversations \
according our safety policy with the below categories.

<BEGIN UNSAFE CONTENT CATEGORIES>
{categories}
<END UNSAFE CONTENT CATEGORIES>

<BEGIN CONVERSATION>

{conversation}

<END CONVERSATION>

Provide your safety assessment for ONLY THE LAST {role} message in the above conversation:
 - First line must read 'safe' or 'unsafe'.
 - If unsafe, a second line must include a comma-separated list of violated categories."""

_CODE = re.compile(r"^S(\d{1,2})$")


class GuardReplyError(ValueError):
    """The guard model's reply is not ``safe`` or ``unsafe`` + a list of S-codes."""


def guard_prompt(text: str, *, gate: str) -> str:
    """The Llama Guard 3 prompt asking about ``text``: as the ``User`` message at the input
    gate, as the ``Agent`` message (after an elided user turn) at the output gate."""
    if gate == "output":
        role = "Agent"
        conversation = f"User: (not shown)\n\nAgent: {text}"
    else:
        role = "User"
        conversation = f"User: {text}"
    return PROMPT_TEMPLATE.format(role=role, categories=_CATEGORY_LINES,
                                  conversation=conversation)


def parse_guard_reply(reply: str) -> tuple[bool, tuple[str, ...]]:
    """``(unsafe, codes)`` from a Llama Guard reply: ``"safe"`` -> ``(False, ())``;
    ``"unsafe\\nS1,S10"`` -> ``(True, ("S1", "S10"))`` (codes checked against S1..S14, case and
    spaces tolerated; ``"unsafe"`` alone -> ``(True, ())``). Raises GuardReplyError for
    anything else (empty, prose, unknown codes)."""
    lines = [line.strip() for line in (reply or "").strip().splitlines() if line.strip()]
    if not lines:
        raise GuardReplyError("the guard model sent an empty reply")
    first = lines[0].lower().rstrip(".")
    if first == "safe":
        return False, ()
    if first != "unsafe":
        raise GuardReplyError(f"the guard model's reply does not start with safe/unsafe: "
                              f"{reply[:200]!r}")
    codes: list[str] = []
    if len(lines) > 1:
        for part in re.split(r"[,\s]+", lines[1].upper()):
            if not part:
                continue
            match = _CODE.match(part)
            if not match or f"S{int(match.group(1))}" not in GUARD_HAZARDS:
                raise GuardReplyError(f"the guard model named an unknown category {part!r}")
            code = f"S{int(match.group(1))}"
            if code not in codes:
                codes.append(code)
    return True, tuple(codes)


def guard_complete(prompt: str, *, pool: str) -> str:
    """The guard pool's reply to ``prompt`` (one user message; greedy, ``GUARD_MAX_TOKENS``):
    through ``inference.service_client.chat_complete`` with ``model=pool`` (the service
    credential). Raises ServiceCallError like it."""
    from inference import service_client

    messages = [{"role": "user", "content": prompt}]
    if "model" in inspect.signature(service_client.chat_complete).parameters:
        return service_client.chat_complete(messages, max_tokens=GUARD_MAX_TOKENS,
                                            temperature=0.0, model=pool)
    # chat_complete always asks settings.CHAT_MODEL_NAME; the guard must ask its own pool, so
    # send the same request with the pool as the model (the /v1 router accepts pool names).
    body = {"model": pool, "messages": messages, "max_tokens": GUARD_MAX_TOKENS,
            "temperature": 0.0, "stream": False}
    with service_client.http_client() as client:
        response = client.post("/v1/chat/completions", json=body)
    if response.status_code != 200:
        raise service_client.ServiceCallError(
            f"the guard pool {pool!r} answered {response.status_code}: {response.text[:500]}"
        )
    try:
        return response.json()["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise service_client.ServiceCallError(
            f"the guard pool {pool!r} sent no completion: {response.text[:500]}"
        ) from exc


class GuardModerator:
    """``Moderator`` asking the pool ``settings.CHAT_MODERATION_GUARD_POOL`` (required: raises
    ImproperlyConfigured when empty, so ``acheck`` fails closed rather than checking nothing)."""

    def __init__(self, pool: str | None = None) -> None:
        from django.core.exceptions import ImproperlyConfigured

        self.pool = pool or getattr(settings, "CHAT_MODERATION_GUARD_POOL", "")
        if not self.pool:
            raise ImproperlyConfigured(
                "CHAT_MODERATOR is the guard adapter but CHAT_MODERATION_GUARD_POOL is empty"
            )
        self.name = f"guard:{self.pool}"
        self.version = "guard-1 (Llama Guard 3 prompt, S1-S14)"

    def _check(self, text: str, policy: Policy, gate: str) -> Verdict:
        if not text.strip():
            return clean_verdict(classifier=self.name, version=self.version, gate=gate)
        local: dict[str, float] = {}
        if policy.blocked_terms:
            local["blocked_term"] = blocked_term_score(text, policy.blocked_terms)
        if gate == "output" and policy.system_prompt:
            local["system_prompt_leak"] = leak_score(text, policy.system_prompt)
        verdict = verdict_from_scores(local, policy, classifier=self.name,
                                      version=self.version, gate=gate)
        if verdict.flagged:
            return verdict
        unsafe, codes = parse_guard_reply(guard_complete(guard_prompt(text, gate=gate),
                                                         pool=self.pool))
        scores = {**local, "unsafe": 1.0 if unsafe else 0.0, **{c: 1.0 for c in codes}}
        return verdict_from_scores(scores, policy, classifier=self.name, version=self.version,
                                   gate=gate)

    def check_input(self, text: str, policy: Policy) -> Verdict:
        """The guard's verdict on a user message (blocked terms checked locally first)."""
        return self._check(text, policy, "input")

    def check_output(self, text: str, policy: Policy) -> Verdict:
        """The guard's verdict on a window of the answer (blocked terms and the system-prompt
        leak checked locally first)."""
        return self._check(text, policy, "output")
