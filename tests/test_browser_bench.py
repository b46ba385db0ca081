"""bench/browser_bench.py's pure parts: the scripted answer it streams, the per-mode summary
and the targets. No browser here; ``make bench`` runs the bench itself."""

from __future__ import annotations

import pytest

from bench.browser_bench import answer_steps, summarise, verdicts
from core.rendering import markdown_to_safe_html


def test_answer_steps_are_token_deltas_each_after_a_pause():
    steps = answer_steps(500, 0.02)
    pauses, deltas = steps[0::2], steps[1::2]
    assert len(deltas) == 500 and all(p == 0.02 for p in pauses)
    assert all(isinstance(d, str) and d for d in deltas)
    assert deltas[0].strip() and not deltas[0].startswith("#"), "the answer opens with prose"


def test_answer_steps_render_every_kind_of_block():
    html = markdown_to_safe_html("".join(answer_steps(500, 0.02)[1::2]))
    for tag in ("<h2>", "<ul>", "<table>", '<code class="language-python">', "<strong>"):
        assert tag in html


def run(mode, paint, longtasks=0, longtask_ms=0.0):
    return {"mode": mode, "first_paint_ms": paint, "longtasks": longtasks,
            "longtask_ms": longtask_ms, "stream_ms": 10_000.0}  # fmt: skip


def test_summary_is_per_mode_percentiles_and_long_task_totals():
    runs = [run("live", p, 1, 60.0) for p in (100, 110, 120)] + [run("plain", 90)]
    s = summarise(runs)
    assert s["live"]["runs"] == 3 and s["live"]["first_paint_p50_ms"] == 110
    assert s["live"]["first_paint_p99_ms"] == pytest.approx(119.8)
    assert s["live"]["longtasks"] == 3 and s["live"]["longtask_ms"] == 180.0
    assert s["plain"]["longtasks"] == 0


def test_summary_needs_both_modes():
    with pytest.raises(ValueError, match="plain"):
        summarise([run("live", 100)])


def test_verdicts_allow_30_ms_and_no_extra_long_tasks():
    ok = summarise([run("live", 130), run("plain", 100)])
    assert all(verdicts(ok).values())
    slow = summarise([run("live", 131), run("plain", 100)])
    assert not verdicts(slow)["p50_within"] and not verdicts(slow)["p99_within"]
    janky = summarise([run("live", 100, 1, 70.0), run("plain", 100)])
    assert verdicts(janky) == {"p50_within": True, "p99_within": True, "longtasks_not_more": False}
