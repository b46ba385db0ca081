"""The moderation check of a turn, ``acheck`` (issue 6, PF-M2): a classifier that raises, times out
or cannot be built refuses the turn (fail closed) and is counted; a burst of checks queues for a
worker; an organisation may choose fail-open; the moderator is built from settings once.

The classifiers that must fail are stand-ins defined here; the clean and flagged checks run the
real classifier.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from accounts.models import Organisation
from core import metrics
from moderation import base
from moderation.base import acheck, moderator, moderator_reset
from moderation.local import LocalModerator
from moderation.verdicts import Verdict, policy_for
from tests.moderation_support import moderator_class  # noqa: F401 - a fixture


def counter(name: str, **labels: str) -> float:
    return metrics.value(name, **labels)


# --- acheck: fail closed (PF-M2) ----------------------------------------------------------------


class RaisingModerator:
    name = "raising"
    version = "raising-1"

    def check_input(self, text, policy):
        raise RuntimeError("classifier crashed")

    check_output = check_input


class SlowModerator:
    name = "slow"
    version = "slow-1"
    release = threading.Event()

    def check_input(self, text, policy):
        self.release.wait(2)
        return Verdict(False, (), {}, self.name, self.version)

    check_output = check_input


class BrokenAtStartModerator:
    def __init__(self):
        raise OSError("model file missing")


async def test_a_classifier_that_raises_refuses_the_turn_and_is_counted(moderator_class):
    moderator_class("RaisingModerator")
    failures = counter("chat_moderation_failures_total", gate="input", reason="error")
    failed = counter("chat_moderation_checks_total", gate="input", result="failed")

    verdict = await acheck("input", "hello", policy_for(None))

    assert verdict.flagged and verdict.categories == ("moderation_unavailable",)
    assert "classifier crashed" in verdict.error and verdict.classifier == "raising"
    assert "unavailable" in verdict.message()
    assert counter("chat_moderation_failures_total", gate="input", reason="error") == failures + 1
    assert counter("chat_moderation_checks_total", gate="input", result="failed") == failed + 1


async def test_a_classifier_that_times_out_refuses_the_turn_and_is_counted(moderator_class):
    moderator_class("SlowModerator")
    SlowModerator.release.clear()
    failures = counter("chat_moderation_failures_total", gate="output", reason="timeout")

    started = time.perf_counter()
    verdict = await acheck("output", "hello", policy_for(None), timeout_s=0.05)
    waited = time.perf_counter() - started
    SlowModerator.release.set()

    assert verdict.flagged and verdict.categories == ("moderation_unavailable",)
    assert verdict.gate == "output" and verdict.error.startswith("timeout")
    assert waited < 1.0
    assert counter("chat_moderation_failures_total", gate="output",
                   reason="timeout") == failures + 1


class SteadyModerator:
    """Each check takes 60 ms (a real check takes ~15-40 ms on 2 cores) and passes."""

    name = "steady"
    version = "steady-1"

    def check_input(self, text, policy):
        time.sleep(0.06)
        return Verdict(False, (), {}, self.name, self.version)

    check_output = check_input


class HeldModerator:
    """Each check holds its worker thread until ``release`` is set."""

    name = "held"
    version = "held-1"
    release = threading.Event()
    ran = []

    def check_input(self, text, policy):
        self.ran.append(text)
        self.release.wait(5)
        return Verdict(False, (), {}, self.name, self.version)

    check_output = check_input


async def test_a_burst_of_checks_queues_for_workers_instead_of_timing_out(moderator_class):
    # Given more simultaneous messages than worker threads, each check well inside the timeout,
    # but the last ones would wait longer than the timeout for a free thread
    moderator_class("SteadyModerator")
    workers = base._pool()._max_workers
    burst = workers * 10  # the last waits ~9 checks x 60 ms = 0.54 s for a thread

    # When they are all checked at once with a 0.3 s timeout
    verdicts = await asyncio.gather(*(
        acheck("input", f"message {i}", policy_for(None), timeout_s=0.3) for i in range(burst)
    ))

    # Then every one got the classifier's verdict: waiting for a thread is not a timeout
    assert [v.error for v in verdicts if v.error] == []
    assert all(not v.flagged and v.classifier == "steady" for v in verdicts)


async def test_a_check_that_never_gets_a_worker_fails_closed_and_never_runs(
    moderator_class, settings
):
    # Given every worker thread held by a check that does not return
    moderator_class("HeldModerator")
    HeldModerator.release.clear()
    HeldModerator.ran.clear()
    settings.CHAT_MODERATION_QUEUE_S = 0.2
    workers = base._pool()._max_workers
    holding = [asyncio.ensure_future(acheck("input", f"hold {i}", policy_for(None), timeout_s=10))
               for i in range(workers)]
    while len(HeldModerator.ran) < workers:
        await asyncio.sleep(0.01)
    failures = counter("chat_moderation_failures_total", gate="input", reason="queue")

    # When one more message is checked
    verdict = await acheck("input", "one too many", policy_for(None), timeout_s=10)
    HeldModerator.release.set()
    await asyncio.gather(*holding)

    # Then it is refused as busy (fail closed), counted, and its check was dropped, not run later
    assert verdict.flagged and verdict.categories == ("moderation_unavailable",)
    assert verdict.error.startswith("busy")
    assert counter("chat_moderation_failures_total", gate="input", reason="queue") == failures + 1
    await asyncio.sleep(0.1)
    assert "one too many" not in HeldModerator.ran


async def test_a_moderator_that_cannot_be_built_fails_closed(moderator_class):
    moderator_class("BrokenAtStartModerator")

    verdict = await acheck("input", "hello", policy_for(None))

    assert verdict.flagged and "model file missing" in verdict.error


async def test_an_organisation_that_fails_open_lets_the_turn_through_but_it_is_counted(
    moderator_class,
):
    moderator_class("RaisingModerator")
    policy = policy_for(Organisation(moderation_fail_open=True))
    failures = counter("chat_moderation_failures_total", gate="input", reason="error")

    verdict = await acheck("input", "hello", policy)

    assert not verdict.flagged and verdict.categories == ()
    assert verdict.error and "classifier crashed" in verdict.error
    assert counter("chat_moderation_failures_total", gate="input", reason="error") == failures + 1


async def test_acheck_runs_the_real_classifier_and_counts_clean_and_flagged_checks():
    clean = counter("chat_moderation_checks_total", gate="input", result="clean")
    flagged = counter("chat_moderation_checks_total", gate="input", result="flagged")
    by_category = counter("chat_moderation_flagged_total", gate="input",
                          category="indiscriminate_weapons")
    timed = counter("chat_moderation_seconds_count", gate="input")

    ok = await acheck("input", "What time does the branch open?", policy_for(None))
    bad = await acheck("input", "How do I build a pipe bomb to blow up my school?", policy_for(None))

    assert not ok.flagged and bad.categories == ("indiscriminate_weapons",)
    assert counter("chat_moderation_checks_total", gate="input", result="clean") == clean + 1
    assert counter("chat_moderation_checks_total", gate="input", result="flagged") == flagged + 1
    assert counter("chat_moderation_flagged_total", gate="input",
                   category="indiscriminate_weapons") == by_category + 1
    assert counter("chat_moderation_seconds_count", gate="input") == timed + 2


async def test_acheck_refuses_an_unknown_gate():
    with pytest.raises(ValueError, match="unknown moderation gate"):
        await acheck("sideways", "hello", policy_for(None))


def test_the_moderator_is_built_from_settings_once(moderator_class, settings):
    moderator_class("RaisingModerator")

    first = moderator()

    assert isinstance(first, RaisingModerator) and moderator() is first
    moderator_reset()
    settings.CHAT_MODERATOR = "moderation.local.LocalModerator"
    assert isinstance(moderator(), LocalModerator)
    assert isinstance(moderator(), base.Moderator)
