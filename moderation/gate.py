"""The output gate: checks an answer beside its stream, never in front of it.

DESIGN.md places output moderation "beside the stream on a rolling window (never delays a
token)". :class:`OutputGate` is fed each delta *after* it was sent and keeps the answer in an
:class:`~moderation.window.OutputWindow`; once ``settings.CHAT_MODERATION_STEP_CHARS`` new
characters have arrived it checks, in a worker thread (moderation/base.py ``acheck``), the
window's next window: the text since the previous check plus the ``WINDOW_CHARS - STEP_CHARS``
characters before it. So every check sees about ``CHAT_MODERATION_WINDOW_CHARS`` characters,
consecutive checks overlap by that margin (a phrase split across deltas, or across two checks,
is whole in one of them: PF-M1), and when checks fall behind a fast stream the next one covers
everything not yet checked (nothing is skipped).

When a check flags, ``on_flag(verdict)`` is called at once (the caller aborts the engine
request); :meth:`OutputGate.finish` checks what is left at the end and returns the verdict.
A check that fails or times out follows the policy's fail-open setting (fail closed by default,
PF-M2), as ``acheck`` decides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from moderation.base import acheck
from moderation.verdicts import CATEGORY_NAMES, Policy, Verdict
from moderation.window import OutputWindow


class OutputGate:
    """The rolling-window output check of one answer (see the module docstring).

    ``policy``: thresholds, blocked terms, fail-open and the turn's real system prompt (for the
    leak check). ``on_flag``: called once, from the gate's task, with the first flagged verdict.
    The window's sizes come from settings (``OutputWindow``'s defaults; ValueError for a size
    < 1).
    """

    def __init__(self, policy: Policy, on_flag: Callable[[Verdict], None] | None = None):
        self.policy = policy
        self.on_flag = on_flag
        self.window = OutputWindow()
        self.verdict: Verdict | None = None  # the latest verdict (the flagged one once flagged)
        self.flagged: Verdict | None = None
        self.flagged_window = ""  # the window the flagged verdict judged (kept for review)
        self._task: asyncio.Task | None = None

    def feed(self, text: str) -> None:
        """Add a delta that was just sent. Starts a check when a window is due and none is
        running (a running check picks the new text up when it is done). Never waits."""
        if not text or self.flagged is not None:
            return
        self.window.append(text)
        if self.window.due and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(final=False))

    async def _run(self, *, final: bool) -> None:
        while self.flagged is None:
            span = self.window.take(final=final)
            if span is None:
                return
            verdict = await acheck("output", span, self.policy)
            self.verdict = verdict
            if verdict.flagged:
                self.flagged = verdict
                self.flagged_window = span
                if self.on_flag is not None:
                    self.on_flag(verdict)
                return

    async def finish(self) -> Verdict | None:
        """Check whatever the running checks have not covered yet (the answer's end) and return
        the verdict: the flagged one if any check flagged, else the last (None when nothing
        was ever checked: an empty answer)."""
        if self._task is not None:
            # wait() neither raises the check's own cancellation nor hides ours.
            await asyncio.wait([self._task])
        if self.flagged is None:
            await self._run(final=True)
        return self.flagged or self.verdict

    def cancel(self) -> None:
        """Stop a running check (the answer was cancelled; its verdict no longer matters)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()


def withdrawn_message(categories) -> str:
    """The notice that replaces an answer the output gate stopped."""
    if "moderation_unavailable" in categories:
        return "The answer was withdrawn because the safety check is unavailable right now. Try again in a minute."
    if "system_prompt_leak" in categories:
        return "The answer was withdrawn: it repeated the assistant's hidden instructions."
    named = [CATEGORY_NAMES[c] for c in categories if c in CATEGORY_NAMES]
    if named:
        return (f"The answer was withdrawn by the safety check ({', '.join(named)}). "
                "You were not charged for it. Try asking in another way.")
    return "The answer was withdrawn by the content filter. Try asking in another way."


def verdict_message(data: dict) -> str:
    """The sentence for a person (``Verdict.message``) of a verdict stored as JSON on a turn
    (``Verdict.as_json``)."""
    return verdict_from_json(data).message()


def verdict_from_json(data: dict) -> Verdict:
    """The :class:`Verdict` a turn's stored ``moderation_verdict`` describes."""
    return Verdict(
        flagged=bool(data.get("flagged")),
        categories=tuple(data.get("categories") or ()),
        scores=dict(data.get("scores") or {}),
        classifier=str(data.get("classifier") or ""),
        version=str(data.get("version") or ""),
        gate=str(data.get("gate") or "input"),
        error=data.get("error"),
        noted=tuple(data.get("noted") or ()),
    )
