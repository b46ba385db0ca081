"""The output gate's rolling window over a streamed answer (pure, no I/O).

The output gate must not check every token (too slow) nor only each delta (a phrase split
across two deltas would never be seen whole: PF-M1). ``OutputWindow`` collects the deltas and,
each time ``step_chars`` new characters have arrived, hands out the newest window: the last
``window_chars`` characters of the answer so far. Consecutive windows overlap by
``window_chars - step_chars`` characters, so any phrase of up to that many characters (336 with
the defaults 400 / 64) lies whole inside at least one window; ``tail()`` hands out the last
window at the end of the answer, so the last characters are checked too.

One delta longer than ``step_chars`` (a remote engine may send big chunks, a non-streamed
answer arrives at once) must not skip text: the window handed out then reaches back to cover
everything since the previous window plus the same overlap, so it can be longer than
``window_chars``.
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

    def _window(self) -> str:
        overlap = self.window_chars - self.step_chars
        start = max(0, min(self._length - self.window_chars, self._checked_to - overlap))
        self._checked_to = self._length
        return self.text[start:]

    def feed(self, text: str) -> str | None:
        """Append a delta (``text`` may be empty). Returns the newest window when at least
        ``step_chars`` characters arrived since the last window (the last ``window_chars``
        characters of the answer, longer only after a delta bigger than the step: see the
        module docstring), else None."""
        if text:
            self._parts.append(text)
            self._length += len(text)
            self._text_cache = None
        if self.pending >= self.step_chars:
            return self._window()
        return None

    def tail(self) -> str | None:
        """At the end of the answer: the last window if any characters arrived since the last
        window handed out, else None (everything was checked already)."""
        if self.pending > 0:
            return self._window()
        return None
