"""The output gate's rolling window over a streamed answer (pure, no I/O).

The output gate (moderation/gate.py) must not check every token (too slow) nor only each delta
(a phrase split across two deltas would never be seen whole: PF-M1). ``OutputWindow`` collects
the deltas and, once ``step_chars`` new characters have arrived, ``take`` hands out the newest
window: the last ``window_chars`` characters of the answer so far. Consecutive windows overlap
by ``window_chars - step_chars`` characters, so any phrase of up to that many characters (336
with the defaults 400 / 64) lies whole inside at least one window; ``take(final=True)`` hands
out the last window at the end of the answer, so the last characters are checked too.

More than ``step_chars`` new characters since the last window (one big delta: a remote engine
may send big chunks, a non-streamed answer arrives at once; or a check that fell behind a fast
stream) must not skip text: the window handed out then reaches back to cover everything since
the previous window plus the same overlap, so it can be longer than ``window_chars``.
"""

from __future__ import annotations

from django.conf import settings


class OutputWindow:
    """Rolling windows over an answer being streamed.

    ``window_chars`` (default ``settings.CHAT_MODERATION_WINDOW_CHARS``, 400) and
    ``step_chars`` (default ``settings.CHAT_MODERATION_STEP_CHARS``, 64) are characters;
    ``step_chars`` is capped at ``window_chars``. Raises ValueError for a size < 1.
    """

    def __init__(self, *, window_chars: int | None = None, step_chars: int | None = None):
        self.window_chars = int(window_chars if window_chars is not None
                                else settings.CHAT_MODERATION_WINDOW_CHARS)
        step = int(step_chars if step_chars is not None else settings.CHAT_MODERATION_STEP_CHARS)
        if self.window_chars < 1 or step < 1:
            raise ValueError(f"window_chars and step_chars must be >= 1 "
                             f"(got {self.window_chars}, {step})")
        self.step_chars = min(step, self.window_chars)
        self._parts: list[str] = []
        self._length = 0
        # The answer's end position when the previous window was handed out.
        self._checked_to = 0
        self._text_cache: str | None = ""

    @property
    def text(self) -> str:
        """The whole answer so far."""
        if self._text_cache is None:
            self._text_cache = "".join(self._parts)
            self._parts = [self._text_cache]
        return self._text_cache

    @property
    def pending(self) -> int:
        """Characters that arrived since the last window handed out (0..)."""
        return self._length - self._checked_to

    @property
    def due(self) -> bool:
        """Whether at least ``step_chars`` characters arrived since the last window."""
        return self.pending >= self.step_chars

    def append(self, text: str) -> None:
        """Add a delta of the answer (``text`` may be empty)."""
        if text:
            self._parts.append(text)
            self._length += len(text)
            self._text_cache = None

    def take(self, *, final: bool = False) -> str | None:
        """The next window to check, or None when none is due yet.

        While streaming (``final=False``) a window is due once ``step_chars`` characters arrived
        since the last one: the last ``window_chars`` characters of the answer (longer after more
        than a step: see the module docstring). At the end (``final=True``) any character not
        yet handed out makes the last window due, so the answer's end is checked; None then
        means everything was handed out already. Handing a window out marks its text as taken.
        """
        if self.pending <= 0 or (not final and not self.due):
            return None
        overlap = self.window_chars - self.step_chars
        start = max(0, min(self._length - self.window_chars, self._checked_to - overlap))
        self._checked_to = self._length
        return self.text[start:]
