"""The output gate's rolling window (moderation/window.py) and the live output gate that uses
it (moderation/gate.py ``OutputGate``, as conversations/generate.py and api/completions.py
run it): PF-M1, a blocked phrase is caught whole, split across deltas, or in one big chunk.

The real local moderator throughout (moderation/local.py); the gate's checks go through
``acheck`` on its worker threads as in production. The gate inside a whole turn (abort,
retract, stored verdict) is in test_moderation_gates_output.py.
"""

from __future__ import annotations

import asyncio

import pytest

from moderation import base
from moderation.gate import OutputGate
from moderation.local import LocalModerator
from moderation.verdicts import Policy, Verdict
from moderation.window import OutputWindow


@pytest.fixture(scope="module")
def mod() -> LocalModerator:
    return LocalModerator()


def fed(window: OutputWindow, text: str) -> str | None:
    """Append one delta and take the window it made due (None when none is due yet)."""
    window.append(text)
    return window.take()


def test_a_phrase_split_across_two_deltas_is_whole_in_a_window(mod):
    policy = Policy(thresholds={}, blocked_terms=("blue heron",))
    window = OutputWindow(window_chars=40, step_chars=8)
    deltas = ["The code", " is blue", " he", "ron. Goodbye", " now."]

    verdicts = []
    for delta in deltas:
        if (text := fed(window, delta)) is not None:
            verdicts.append(mod.check_output(text, policy))
    if (text := window.take(final=True)) is not None:
        verdicts.append(mod.check_output(text, policy))

    assert not any(mod.check_output(d, policy).flagged for d in deltas)
    assert any(v.categories == ("blocked_term",) for v in verdicts)


def test_the_window_hands_out_the_newest_characters_every_step():
    window = OutputWindow(window_chars=10, step_chars=4)

    assert fed(window, "abc") is None
    assert fed(window, "d") == "abcd"
    # 10 new characters: the window reaches back window - step = 6 before the last one's end
    assert fed(window, "efghijklmn") == "abcdefghijklmn"
    assert fed(window, "op") is None
    assert window.take(final=True) == "ghijklmnop"
    assert window.take(final=True) is None
    assert window.text == "abcdefghijklmnop"


def test_a_delta_longer_than_the_window_is_checked_whole_with_the_overlap():
    window = OutputWindow(window_chars=10, step_chars=4)
    assert fed(window, "0123456789ab") == "0123456789ab"  # the first window starts at 0

    got = fed(window, "x" * 25)

    assert got == "6789ab" + "x" * 25  # all new text + window - step characters before it


def test_every_phrase_up_to_the_overlap_is_whole_in_some_window():
    text = "".join(chr(ord("a") + i % 26) for i in range(500))
    window = OutputWindow(window_chars=50, step_chars=10)
    windows = []
    for start in range(0, len(text), 7):
        if (got := fed(window, text[start:start + 7])) is not None:
            windows.append(got)
    if (got := window.take(final=True)) is not None:
        windows.append(got)

    phrase = 40  # window - step
    for start in range(len(text) - phrase + 1):
        assert any(text[start:start + phrase] in w for w in windows), start


def test_window_sizes_default_to_settings(settings):
    settings.CHAT_MODERATION_WINDOW_CHARS = 123
    settings.CHAT_MODERATION_STEP_CHARS = 45

    window = OutputWindow()

    assert (window.window_chars, window.step_chars) == (123, 45)
    with pytest.raises(ValueError):
        OutputWindow(window_chars=0)


class Recording:
    """The real local moderator, remembering every window the output gate checked."""

    def __init__(self, real: LocalModerator):
        self.real, self.name, self.version = real, real.name, real.version
        self.windows: list[str] = []

    def check_input(self, text, policy):
        return self.real.check_input(text, policy)

    def check_output(self, text, policy):
        self.windows.append(text)
        return self.real.check_output(text, policy)


@pytest.fixture
def recording(mod, monkeypatch) -> Recording:
    """The process-wide moderator (the one ``acheck`` calls) for one test: ``mod``, recorded."""
    recorder = Recording(mod)
    monkeypatch.setattr(base, "_moderator", recorder)
    return recorder


async def stream_into(gate: OutputGate, deltas: list[str]) -> int:
    """Feed ``deltas`` as a stream whose checks keep pace with it (each running check ends
    before the next delta is sent). Returns how many deltas were sent when the gate flagged
    (the caller would stop the engine there), or all of them."""
    for sent, delta in enumerate(deltas, start=1):
        gate.feed(delta)
        if gate._task is not None:
            await asyncio.wait([gate._task])
        if gate.flagged is not None:
            return sent
    return len(deltas)


@pytest.mark.parametrize(
    ("deltas", "flagged_at"),
    [
        (["One", " two", " three", " four", " bananarama", " six", " seven", " eight"], 5),
        (["One", " two", " three", " four", " banana", "rama", " seven", " eight"], 6),  # split
    ],
    ids=["whole", "split-across-two-deltas"],
)
async def test_pf_m1_the_live_output_gate_flags_a_blocked_phrase_at_token_5_while_streaming(
    recording, settings, deltas, flagged_at
):
    """The phrase starts at token 5; the gate flags it as soon as it is complete (token 5, or
    token 6 when split), so the caller stops the answer before token 7."""
    settings.CHAT_MODERATION_WINDOW_CHARS = 16  # overlap 12: a 10-character phrase is whole
    settings.CHAT_MODERATION_STEP_CHARS = 4
    policy = Policy(thresholds={}, blocked_terms=("bananarama",))
    flags: list[Verdict] = []
    gate = OutputGate(policy, flags.append)

    sent = await stream_into(gate, deltas)

    assert sent == flagged_at
    assert gate.flagged is not None and gate.flagged.categories == ("blocked_term",)
    assert gate.flagged.gate == "output"
    assert flags == [gate.flagged]  # on_flag called once, at once
    assert len(recording.windows) >= 3  # checked as it streamed, not once at the end
    assert await gate.finish() is gate.flagged
    assert flags == [gate.flagged]


async def test_pf_m1_a_split_phrase_is_flagged_by_the_window_not_by_any_delta(
    recording, settings, mod
):
    settings.CHAT_MODERATION_WINDOW_CHARS = 16  # overlap 12: a 10-character phrase is whole
    settings.CHAT_MODERATION_STEP_CHARS = 4
    policy = Policy(thresholds={}, blocked_terms=("bananarama",))
    deltas = ["One", " two", " three", " four", " banana", "rama", " seven"]
    gate = OutputGate(policy)

    await stream_into(gate, deltas)

    assert not any(mod.check_output(d, policy).flagged for d in deltas)
    assert any(w.endswith(" banana") for w in recording.windows[:-1])  # a check cut the phrase
    assert "bananarama" in recording.windows[-1] and gate.flagged is not None


@pytest.mark.parametrize("step", [64, 8])
async def test_pf_m1_a_non_streamed_answer_fed_whole_is_flagged(recording, settings, step):
    """A non-streamed answer (or a remote engine's one big chunk) arrives as one delta: longer
    than the window, the phrase far from its end, it is still checked whole; shorter than a
    step, only ``finish`` checks it."""
    settings.CHAT_MODERATION_STEP_CHARS = step
    policy = Policy(thresholds={}, blocked_terms=("bananarama",))
    long = "One two three four bananarama. " + "Then the rest of a long answer. " * 30
    short = "I said bananarama."

    for answer in (long, short):
        gate = OutputGate(policy)
        gate.feed(answer)
        verdict = await gate.finish()

        assert verdict is gate.flagged and verdict.categories == ("blocked_term",), answer[:20]
    assert any(len(w) > 400 for w in recording.windows)  # the long answer in one window


async def test_the_live_output_gate_passes_a_clean_answer_with_its_clean_verdict(
    recording, settings
):
    settings.CHAT_MODERATION_STEP_CHARS = 8
    flags: list[Verdict] = []
    gate = OutputGate(Policy(thresholds={}, blocked_terms=("bananarama",)), flags.append)

    await stream_into(gate, ["One", " two", " three", " four", " banana", " split", " six."])
    verdict = await gate.finish()

    assert verdict is not None and not verdict.flagged and verdict.gate == "output"
    assert gate.flagged is None and flags == []
    assert recording.windows[-1].endswith(" six.")  # the end was checked too


async def test_an_empty_answer_gets_no_output_verdict(recording):
    gate = OutputGate(Policy())

    gate.feed("")

    assert await gate.finish() is None and recording.windows == []
