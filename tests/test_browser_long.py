"""bench/browser_long.py's pure parts: the per-conversation summary, the issue's targets and
the CPU profile's top self times. No browser here; ``make bench`` runs the bench itself."""

from __future__ import annotations

import pytest

from bench.browser_long import profile_top, summarise, verdicts


def loads(size, ready, nodes):
    return [{"size": size, "ready_ms": r, "nodes": nodes} for r in ready]


def test_summary_takes_the_median_load_and_the_key_percentiles():
    summary = summarise(
        loads("short", [100, 300, 200], 400) + loads("long", [150, 250, 1000], 1200),
        {"short": [10.0] * 99 + [90.0], "long": []},
    )
    assert summary["short"]["ready_p50_ms"] == 200 and summary["long"]["ready_p50_ms"] == 250
    assert summary["short"]["key_p50_ms"] == 10.0 and summary["short"]["key_p99_ms"] > 10.0
    assert summary["long"]["key_p99_ms"] is None and summary["long"]["nodes"] == 1200


def test_a_size_without_loads_is_an_error():
    with pytest.raises(ValueError):
        summarise(loads("short", [100], 400), {})


@pytest.mark.parametrize(
    ("long_ready", "long_p99", "long_nodes", "missed"),
    [
        (150, 50.0, 2800, set()),
        (151, 50.0, 2800, {"ready_ratio"}),
        (150, 50.1, 2800, {"key_p99"}),
        (150, None, 2800, {"key_p99"}),
        (150, 50.0, 2801, {"dom_nodes"}),
    ],
)
def test_the_targets_are_the_issues(long_ready, long_p99, long_nodes, missed):
    summary = {
        "short": {"ready_p50_ms": 100, "nodes": 400, "key_p99_ms": 10.0},
        "long": {"ready_p50_ms": long_ready, "nodes": long_nodes, "key_p99_ms": long_p99},
    }
    assert {name for name, met in verdicts(summary).items() if not met} == missed


def test_profile_top_sums_self_time_by_function_and_script():
    frame = lambda name, url, line: {"functionName": name, "url": url, "lineNumber": line}  # noqa: E731
    profile = {
        "nodes": [
            {"id": 1, "callFrame": frame("(program)", "", -1)},
            {"id": 2, "callFrame": frame("toBottom", "http://x/static/chat/follow.js", 44)},
        ],
        "samples": [1, 2, 2, 1],
        "timeDeltas": [1000, 3000, 2000, 500],  # microseconds
    }
    assert profile_top(profile) == [("toBottom follow.js:45", 5.0), ("(program)", 1.5)]
