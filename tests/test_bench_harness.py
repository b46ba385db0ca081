"""The benches' shared harness (bench/harness.py, bench/clients.py): the one percentile, TPOT,
the SSE parser, the tier-machinery settings, the disturbance rule, the CPU meter and the server
process. Pure helpers, no engine, no database."""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

from bench.clients import sse_events_sync, sse_split
from bench.harness import (
    TIER_MACHINERY_OFF,
    CpuMeter,
    Spawned,
    disturbed,
    free_port,
    ms,
    percentile,
    ratio,
    tier_machinery_off,
    tier_machinery_off_env,
    tpot,
)

# --------------------------------------------------------------------------------------------
# percentile


def test_percentile_interpolates_linearly_between_the_closest_ranks():
    # Given four samples: rank (n - 1) * q / 100 falls between two of them
    values = [4.0, 1.0, 3.0, 2.0]

    # Then each percentile is the straight line between its neighbours
    assert percentile(values, 50) == 2.5
    assert percentile(values, 25) == 1.75
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(range(1, 101), 99) == pytest.approx(99.01)


def test_percentile_is_numpys_default_method():
    # Given unsorted samples of an awkward size
    rng = random.Random(17)
    values = [rng.expovariate(3.0) for _ in range(37)]

    # Then every percentile equals numpy.percentile's (method "linear")
    for q in (0, 1, 10, 25, 50, 75, 90, 99, 99.9, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-12)


def test_percentile_50_is_the_median():
    for values in ([3.0, 1.0, 2.0], [5.0, 1.0, 4.0, 2.0]):
        assert percentile(values, 50) == statistics.median(values)


def test_percentile_of_one_sample_is_that_sample():
    for q in (0, 50, 99, 100):
        assert percentile([0.25], q) == 0.25


def test_percentile_of_no_values_raises():
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)


def test_percentile_of_no_values_returns_the_default_when_given():
    assert percentile([], 99, default=None) is None
    assert percentile([2.0], 99, default=None) == 2.0  # the default is only for no values


@pytest.mark.parametrize("q", [-1, 100.5, 101])
def test_percentile_rejects_q_outside_0_to_100(q):
    with pytest.raises(ValueError, match="0..100"):
        percentile([1.0, 2.0], q)


def test_percentile_refuses_missing_samples():
    # None is a sample the caller forgot to filter out, not a number to sort
    with pytest.raises(TypeError):
        percentile([1.0, None, 2.0], 50)


# --------------------------------------------------------------------------------------------
# Small numbers


def test_tpot_is_the_decode_time_over_the_tokens_after_the_first():
    # Given the first token at 1.0 s and the tenth at 1.9 s
    assert tpot(1.0, 1.9, 10) == pytest.approx(0.1)


def test_tpot_needs_two_tokens_and_both_times():
    assert tpot(1.0, 1.0, 1) is None
    assert tpot(None, 2.0, 5) is None
    assert tpot(1.0, None, 5) is None


def test_ms_formats_seconds_as_milliseconds():
    assert ms(0.12346) == "123.5"
    assert ms(0.12346, 0) == "123"
    assert ms(0.0123456, 2) == "12.35"
    assert ms(None) == "-"


def test_ratio_is_none_without_both_numbers():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(3.0, 0.0) is None
    assert ratio(3.0, None) is None


# --------------------------------------------------------------------------------------------
# SSE


def test_sse_split_returns_complete_events_and_keeps_the_incomplete_rest():
    # Given two complete blocks, a keep-alive comment and half a third block
    buffer = (
        b'id: 1\nevent: token\ndata: {"text": "Hi"}\n\n'
        b": keep-alive\n\n"
        b'event: done\ndata: {"usage": {"completion_tokens": 1}}\n\n'
        b"event: tok"
    )

    # When it is split
    events, rest = sse_split(buffer)

    # Then the events come decoded, the comment is skipped and the rest waits for more bytes
    assert events == [("token", {"text": "Hi"}), ("done", {"usage": {"completion_tokens": 1}})]
    assert rest == b"event: tok"


def test_sse_split_keeps_openai_done_marker_and_unnamed_events():
    events, rest = sse_split(b'data: {"choices": []}\n\ndata: [DONE]\n\n')

    assert events == [("message", {"choices": []}), ("message", "[DONE]")]
    assert rest == b""


def test_sse_events_sync_joins_blocks_split_across_chunks():
    # Given a response whose chunks cut an event in the middle
    chunks = [b'event: token\nda', b'ta: {"text": "a"}\n', b'\nevent: done\ndata: {}\n\n']
    response = SimpleNamespace(iter_raw=lambda: iter(chunks))

    # When its events are read
    events = [(name, data) for name, data, _ in sse_events_sync(response)]

    # Then each arrives once, whole
    assert events == [("token", {"text": "a"}), ("done", {})]


# --------------------------------------------------------------------------------------------
# Settings


def test_tier_machinery_off_env_is_unlimited_tiers_without_reserved_slots_or_shedding():
    env = tier_machinery_off_env()

    limits = json.loads(env["CHAT_RATE_LIMITS_BY_TIER"])
    assert limits == {t: {"rpm": None, "tpm": None} for t in ("free", "paid", "enterprise")}
    assert json.loads(env["CHAT_ORG_RATE_LIMITS_BY_TIER"]) == limits
    assert env["CHAT_RESERVED_SLOTS"] == "0"
    for name in ("CHAT_SHED_FREE_WAITING", "CHAT_DEGRADE_PAID_WAITING",
                 "CHAT_REASONING_LAST_WAITING"):  # fmt: skip
        assert env[name] == "100000"
    assert env["CHAT_SHED_FREE_WAIT_S"] == "0.0"
    assert env["CHAT_ADMISSION_ADAPTIVE"] == "False"  # env_bool reads it as off


def test_tier_machinery_off_gives_settings_copies_of_their_own():
    # Given a settings object the bench then changes
    settings = SimpleNamespace()
    tier_machinery_off(settings)
    settings.CHAT_RATE_LIMITS_BY_TIER["free"]["rpm"] = 5

    # Then the shared table is untouched, and every value was applied
    assert TIER_MACHINERY_OFF["CHAT_RATE_LIMITS_BY_TIER"]["free"]["rpm"] is None
    assert settings.CHAT_RESERVED_SLOTS == 0
    assert settings.CHAT_SHED_FREE_WAITING == 100_000


# --------------------------------------------------------------------------------------------
# The machine


def test_disturbed_when_others_used_more_than_5_percent_of_the_machine(monkeypatch):
    # Given a 4-CPU machine and a 10 s span: 5% is 2 CPU-seconds
    monkeypatch.setattr("os.cpu_count", lambda: 4)

    assert disturbed({"other_cpu_s": 2.1, "wall_s": 10.0})
    assert not disturbed({"other_cpu_s": 1.9, "wall_s": 10.0})
    assert not disturbed({})  # nothing measured
    # The span can be the caller's (a batch's wall time) instead of the meter's own
    assert disturbed({"other_cpu_s": 1.9, "wall_s": 10.0}, wall_s=9.0)


def test_cpu_meter_counts_this_process_cpu_seconds():
    # Given a meter started before 0.1 CPU-seconds of work in this process
    meter = CpuMeter()
    meter.start()
    until = time.process_time() + 0.1
    while time.process_time() < until:
        pass

    # When it stops
    cpu = meter.stop()

    # Then it saw that work, and its breakdown is there
    assert cpu["bench_process_cpu_s"] >= 0.1
    assert cpu["stack_cpu_s"] >= 0
    assert "bench" in cpu["stack_cpu_by_role_s"]


def test_spawned_server_is_waited_for_and_stopped(tmp_path):
    # Given a small HTTP server spawned in its own process group
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    server = Spawned("http.server", argv, port=port, log_path=tmp_path / "server.log")
    server.start()
    try:
        # When it is waited for, then it answers
        assert server.wait_ready("/", timeout_s=30, poll_s=0.1) > 0
    finally:
        stopped = server.stop(grace_s=10)

    # Then SIGTERM ended it
    assert stopped.startswith("SIGTERM, exit")
    assert server.proc.poll() is not None
    assert server.stop() == "not running"


def test_spawned_server_that_exits_is_reported_with_its_log(tmp_path):
    port = free_port()
    argv = [sys.executable, "-c", "print('no model here'); raise SystemExit(3)"]
    server = Spawned("broken", argv, port=port, log_path=tmp_path / "broken.log")
    server.start()

    with pytest.raises(RuntimeError, match=r"broken exited \(3\); see .*broken.log"):
        server.wait_ready("/readyz", timeout_s=30, poll_s=0.05)
    assert "no model here" in (tmp_path / "broken.log").read_text()


def test_spawned_appended_log_keeps_earlier_output(tmp_path):
    log_path = tmp_path / "server.log"
    log_path.write_text("earlier server\n")
    argv = [sys.executable, "-c", "print('this one')"]
    server = Spawned("uvicorn", argv, port=free_port(), log_path=log_path, append=True)

    server.start()
    server.proc.wait(30)

    text = log_path.read_text()
    assert text.startswith("earlier server\n")
    assert server.log_offset == len("earlier server\n")
    assert f"===== uvicorn on port {server.port} =====" in text
    assert text.rstrip().endswith("this one")


# --------------------------------------------------------------------------------------------
# The engine bench's mixed-tier part (bench/engine_mixed.py)


def _mixed_sample(user: int, *, ttft=0.5, tpot=0.05, tokens=10, error=None):
    from bench.engine_runs import Sample  # noqa: PLC0415

    return Sample("s", "mixed", user, 0, 0.0, 1.0, None if error else ttft,
                  None if error else tpot, 20, 0 if error else tokens, error)  # fmt: skip


def test_the_tier_mix_is_seeded_and_has_the_paid_count():
    from bench.engine_mixed import tier_mix  # noqa: PLC0415

    mix = tier_mix(9, 16, 4)
    assert mix == tier_mix(9, 16, 4)
    assert sorted(mix) == list(range(16))
    assert sum(1 for t in mix.values() if t == "paid") == 4
    assert sum(1 for t in mix.values() if t == "free") == 12
    assert any(tier_mix(seed, 16, 4) != mix for seed in range(10, 15))
    with pytest.raises(ValueError):
        tier_mix(9, 16, 17)


def test_phase_tags_change_every_message_and_nothing_else():
    from bench.engine_mixed import tagged  # noqa: PLC0415
    from bench.engine_workload import Turn, UserPlan  # noqa: PLC0415

    plans = [UserPlan(0, 0.5, (Turn(0, 0, "hello", 40, 0.0), Turn(0, 1, "again", 50, 1.5)))]
    (plan,) = tagged(plans, "adaptive")
    assert [t.content for t in plan.turns] == ["[adaptive] hello", "[adaptive] again"]
    assert (plan.arrival_s, [t.max_tokens for t in plan.turns]) == (0.5, [40, 50])


def test_the_mixed_summary_splits_tiers_and_counts_shed_turns_apart_from_errors():
    from bench.engine_mixed import mixed_summary  # noqa: PLC0415

    tiers = {0: "paid", 1: "free", 2: "free"}
    samples = [
        _mixed_sample(0, ttft=0.3, tpot=0.04, tokens=30),
        _mixed_sample(1, ttft=1.5, tpot=0.06, tokens=20),
        _mixed_sample(2, error="RuntimeError('POST turns -> 503: busy')"),
        _mixed_sample(2, error="RuntimeError('error event')"),
    ]

    summary = mixed_summary(samples, tiers, wall_s=10.0)

    assert (summary["turns"], summary["admitted"], summary["shed"], summary["errors"]) == (4, 2, 1, 1)
    assert summary["shed_by_tier"] == {"paid": 0, "free": 1}
    assert summary["paid_ttft_p99_ms"] == 300.0
    assert summary["free_ttft_p99_ms"] == 1500.0  # admitted free turns only
    assert summary["admitted_tpot_p99_ms"] == pytest.approx(59.8)
    assert summary["tokens_per_s"] == 5.0


def _phase(**values):
    base = {"admitted_tpot_p99_ms": 70.0, "paid_ttft_p99_ms": 700.0, "free_ttft_p99_ms": 1900.0,
            "tokens_per_s": 90.0, "cap_min": 6, "cap_final": 8}  # fmt: skip
    return {**base, **values}


def test_mixed_checks_pass_within_the_targets_and_say_the_ratio():
    from bench.engine_mixed import mixed_checks  # noqa: PLC0415

    rows = mixed_checks({"adaptive": _phase(), "uncapped": _phase(tokens_per_s=100.0)},
                        {"ttft_p50_s": 0.1, "tpot_p50_s": 0.03})  # fmt: skip

    assert [r["pass"] for r in rows] == [True, True, True, True]
    assert "0.90x" in rows[-1]["shown"]


def test_mixed_checks_miss_each_target_and_scale_ttft_bounds_by_the_single_stream():
    from bench.engine_mixed import mixed_checks  # noqa: PLC0415

    slow = _phase(admitted_tpot_p99_ms=81.0, paid_ttft_p99_ms=900.0, free_ttft_p99_ms=2100.0,
                  tokens_per_s=70.0)  # fmt: skip
    rows = mixed_checks({"adaptive": slow, "uncapped": _phase(tokens_per_s=100.0)},
                        {"ttft_p50_s": 0.1, "tpot_p50_s": 0.03})  # fmt: skip
    assert [r["pass"] for r in rows] == [False, False, False, False]

    # A slow single stream (1 s TTFT) widens the TTFT bounds to 1.25 s / 2 s ...
    rows = mixed_checks({"adaptive": slow, "uncapped": _phase()}, {"ttft_p50_s": 1.0, "tpot_p50_s": 0.03})
    assert [r["pass"] for r in rows[1:3]] == [True, False]
    # ... and a single stream slower than 40 ms per token makes the TPOT target a MISS naming the cap.
    rows = mixed_checks({"adaptive": _phase(), "uncapped": _phase()}, {"ttft_p50_s": 0.1, "tpot_p50_s": 0.058})
    assert rows[0]["pass"] is False and "cap reached 6" in rows[0]["shown"]
