"""Settings of the moderation gates (issue 6; moderation/), imported by
chatsite/settings/base.py. Every name is overridable from the environment.
"""

from __future__ import annotations

import json
import os

from chatsite.settings.env import env_bool, env_int

# --- Moderation gates (issue 6; moderation/) ---
# The Moderator every turn is checked with: the local classifiers (offensive language from
# alt-profanity-check's shipped model, a prompt-injection classifier trained on the repo's
# labelled set, per-org blocked terms, system-prompt leak detection) or the adapter that asks a
# model pool with a Llama-Guard-style prompt (moderation.guard.GuardModerator, pool below).
CHAT_MODERATOR = os.environ.get("CHAT_MODERATOR", "moderation.local.LocalModerator")
CHAT_MODERATION_GUARD_POOL = os.environ.get("CHAT_MODERATION_GUARD_POOL", "")
# Gates on or off (off: the benchmark's baseline; never in production).
CHAT_MODERATION_INPUT = env_bool("CHAT_MODERATION_INPUT", True)
CHAT_MODERATION_OUTPUT = env_bool("CHAT_MODERATION_OUTPUT", True)
# Score at or above which a category flags (0..1; classifier probabilities, so thresholds are
# policy). Organisation.moderation_thresholds overrides per category.
CHAT_MODERATION_THRESHOLDS: dict[str, float] = json.loads(
    os.environ.get("CHAT_MODERATION_THRESHOLDS", "null")
) or {
    # The harm classifier's (moderation/harm.py): 0.9 = "high confidence" (issue 28).
    "child_sexual_exploitation": 0.9,
    "indiscriminate_weapons": 0.9,
    "violent_crimes": 0.9,
    "self_harm": 0.9,
    "hate": 0.9,
    "harassment": 0.9,
    "non_violent_crimes": 0.9,
    "sexual_content": 0.9,
    "offensive": 0.85,
    "prompt_injection": 0.5,
    "blocked_term": 0.5,
    "system_prompt_leak": 0.5,
    "unsafe": 0.5,
}
# What reaching a category's threshold does, per gate (moderation/verdicts.py): "block" (refuse
# the message / withdraw the answer) or "flag" (noted in the verdict, passes). Only
# high-severity harm blocks by default; offensive words never do (DESIGN.md "Judgement").
# An organisation opts a category in to blocking by setting its threshold.
CHAT_MODERATION_ACTIONS: dict[str, dict[str, str]] = json.loads(
    os.environ.get("CHAT_MODERATION_ACTIONS", "null")
) or {
    "child_sexual_exploitation": {"input": "block", "output": "block"},
    "indiscriminate_weapons": {"input": "block", "output": "block"},
    "violent_crimes": {"input": "block", "output": "flag"},
    "self_harm": {"input": "block", "output": "flag"},
    "hate": {"input": "block", "output": "flag"},
    "harassment": {"input": "flag", "output": "flag"},
    "non_violent_crimes": {"input": "flag", "output": "flag"},
    "sexual_content": {"input": "flag", "output": "flag"},
    "offensive": {"input": "flag", "output": "flag"},
    "prompt_injection": {"input": "block", "output": "flag"},
    "blocked_term": {"input": "block", "output": "block"},
    "system_prompt_leak": {"input": "block", "output": "block"},
    "unsafe": {"input": "block", "output": "block"},
}
# A check that takes longer than this (seconds) counts as failed: the turn is refused unless
# the organisation chose fail-open (PF-M2). A guard against a hung or broken classifier, not a
# latency target (checks take ~10-20 ms): 1 s leaves room for a 2-core machine under load, where
# 0.25 s refused healthy turns.
CHAT_MODERATION_TIMEOUT_S = float(os.environ.get("CHAT_MODERATION_TIMEOUT_S", "1.0"))
# Worker threads the checks run on (moderation/base.py): a few, because the checks are
# CPU-bound and a timed-out check keeps its thread until it returns.
CHAT_MODERATION_THREADS = env_int("CHAT_MODERATION_THREADS", 4)
# How long a check may wait for a free worker thread before it fails closed (reason "queue").
# Apart from the timeout above, which counts from when the check starts: 30 messages arriving
# at once on 2 cores queue ~0.5-1 s behind each other, which refused healthy turns (issue 28)
# while every check itself took ~15-40 ms.
CHAT_MODERATION_QUEUE_S = float(os.environ.get("CHAT_MODERATION_QUEUE_S", "10"))
# The output gate checks the newest CHAT_MODERATION_WINDOW_CHARS characters of the answer each
# time CHAT_MODERATION_STEP_CHARS more have streamed (and the tail at the end), so a phrase
# split across tokens is whole in some window (PF-M1).
CHAT_MODERATION_WINDOW_CHARS = env_int("CHAT_MODERATION_WINDOW_CHARS", 400)
CHAT_MODERATION_STEP_CHARS = env_int("CHAT_MODERATION_STEP_CHARS", 64)
