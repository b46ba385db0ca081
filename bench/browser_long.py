"""Long conversations in a real browser (issue 29): a 3,000-turn conversation with 20 branches
against a 10-turn one, in the same run, on a phone-sized, slowed-down browser.

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.browser_long [--loads 7] [--typing-runs 2]

The stack is bench/browser_bench.py's: one uvicorn (``python -m chatsite.serve``) with the
scripted engine double streaming its Markdown-rich answer (``--tokens`` tokens, one every
``--token-ms`` ms), headless Debian Chromium through Playwright, signed in once. The two
conversations are written by tests/long_conversation.py's bulk seeder. Every page has a
390x844 viewport and 4x CPU throttling (CDP ``Emulation.setCPUThrottlingRate``, rate 4, as
Lighthouse's mobile profile), set before it navigates. Loads and typing runs alternate between
the two conversations, so load on the shared machine lands on both alike.

Measured in the page (``performance.now()``, whose origin is the navigation's start):

- **ready**: navigation start -> the composer accepts input: the first task after the page's
  DOMContentLoaded handlers (htmx, chat.js, follow.js's scroll to the latest message) and the
  frame after them have run, with ``#composer textarea`` present and enabled. p50 of
  ``--loads`` loads each;
- **DOM nodes** after open (``document.getElementsByTagName('*').length`` once ready);
- **keystroke -> paint** while an answer streams: a message is sent, and once its first token
  shows, ``--chars`` characters are typed into the box ``--key-ms`` ms apart; each printable
  key's latency runs from its keydown's ``timeStamp`` (so time queued behind a busy main thread
  counts) to a ``setTimeout(0)`` queued from the next animation frame, which runs after that
  frame's paint (the usual approximation). Only keys typed while the answer still streams
  count. p50 / p99 over every such key of ``--typing-runs`` runs.

Targets (the issue): the 3,000-turn ready p50 <= 1.5x the 10-turn one's; keystroke -> paint
p99 <= 50 ms at 3,000 turns; DOM nodes at 3,000 turns <= 2x the 10-turn's + 2,000. Results: a
table on stdout and ``var/bench/browser_long.json``. Exit status 0 when every run completed
(``--strict``: 1 on a missed target), 2 when a run failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.browser_bench import (
    CHROMIUM, drop_users, make_user, result_write, scripted_server, setup_django, sign_in,
)  # fmt: skip
from bench.harness import VAR, log, percentile

VIEWPORT = {"width": 390, "height": 844}
CPU_THROTTLING = 4  # Chrome DevTools' "4x slowdown", Lighthouse's mobile CPU
SIZES = {"short": (10, 0), "long": (3000, 20)}  # turns, branches
TARGET_READY_RATIO = 1.5
TARGET_KEY_P99_MS = 50.0
TARGET_DOM_FACTOR, TARGET_DOM_EXTRA = 2, 2000
QUESTION = "One more question: how do I sort a list of tuples by the second item?"

# Installed before any of the page's scripts (an init script), so its DOMContentLoaded listener
# is the first: the setTimeout it queues runs after every other handler.
PAGE_PROBE = """
(() => {
  const b = window.__long = {ready: null, nodes: null, keys: []};
  const box = () => document.querySelector('#composer textarea');
  document.addEventListener('DOMContentLoaded', () => setTimeout(() => requestAnimationFrame(() =>
    setTimeout(() => {
      const t = box();
      if (t && !t.disabled) b.ready = performance.now();
      b.nodes = document.getElementsByTagName('*').length;
    }, 0)), 0));
  document.addEventListener('keydown', (e) => {
    if (e.key.length !== 1 || !e.target.matches || !e.target.matches('#composer textarea')) return;
    const streaming = !!document.querySelector('#messages article.assistant.streaming');
    const start = e.timeStamp;
    requestAnimationFrame(() => setTimeout(() => {
      b.keys.push([performance.now() - start, streaming]);
    }, 0));
  }, true);
})();
"""


def throttled_page(context):
    """A page of ``context`` with the CPU slowed :data:`CPU_THROTTLING` times (before it
    navigates, so parsing and scripts are slowed too), and its CDP session."""
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Emulation.setCPUThrottlingRate", {"rate": CPU_THROTTLING})
    return page, cdp


def profile_top(profile: dict, n: int = 15) -> list[tuple[str, float]]:
    """The ``n`` biggest self times (ms) of a CDP ``Profiler.stop`` profile, by function and
    script (``(program)`` is the renderer's own work outside JavaScript: style, layout, paint,
    input dispatch; ``(idle)`` waiting)."""
    nodes = {node["id"]: node["callFrame"] for node in profile["nodes"]}
    self_ms: dict[str, float] = {}
    for node_id, delta in zip(profile["samples"], profile["timeDeltas"]):
        frame = nodes[node_id]
        name = f"{frame['functionName'] or '(anonymous)'} {frame['url'].rsplit('/', 1)[-1]}:{frame['lineNumber'] + 1}"
        if not frame["url"]:
            name = frame["functionName"] or "(anonymous)"
        self_ms[name] = self_ms.get(name, 0.0) + delta / 1000
    return sorted(self_ms.items(), key=lambda kv: -kv[1])[:n]


def one_load(context, url: str) -> dict:
    """Open ``url``; return ``ready_ms`` (navigation start -> composer accepting input) and
    ``nodes`` (elements in the document then)."""
    page, _ = throttled_page(context)
    try:
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_function("window.__long.ready !== null", timeout=120_000)
        b = page.evaluate("window.__long")
    finally:
        page.close()
    return {"ready_ms": round(b["ready"], 1), "nodes": b["nodes"]}


def one_typing_run(
    context, url: str, chars: int, key_ms: float, timeout_s: float, profile: list | None = None
) -> list[float]:
    """Open ``url``, send :data:`QUESTION`, and type ``chars`` characters while its answer
    streams; return the keystroke -> paint latencies (ms) of the keys typed while it streamed.
    Waits for the answer to end, so the next run's message is not refused (409). ``profile``:
    a list to append the CPU profile of the typing to (CDP ``Profiler``)."""
    page, cdp = throttled_page(context)
    try:
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_function("window.__long.ready !== null && typeof window.htmx === 'object'", timeout=120_000)
        page.fill("#composer textarea", QUESTION)
        page.press("#composer textarea", "Enter")
        page.wait_for_function(
            "(() => { const a = document.querySelector('#messages article.assistant.streaming [data-stream-text]');"
            " return a && a.textContent.trim().length > 0; })()",
            timeout=timeout_s * 1000,
        )
        if profile is not None:
            cdp.send("Profiler.enable")
            cdp.send("Profiler.setSamplingInterval", {"interval": 200})
            cdp.send("Profiler.start")
        page.keyboard.type(("the quick brown fox jumps over the lazy dog " * 4)[:chars], delay=key_ms)
        page.wait_for_timeout(300)  # the last key's frame
        if profile is not None:
            profile.append(cdp.send("Profiler.stop")["profile"])
        keys = page.evaluate("window.__long.keys")
        page.wait_for_function(
            "!document.querySelector('#messages article.assistant.streaming')", timeout=timeout_s * 1000
        )
    finally:
        page.close()
    return [round(ms, 2) for ms, streaming in keys if streaming]


def summarise(loads: list[dict], keys: dict[str, list[float]]) -> dict:
    """Per size: ready p50 (ms), DOM nodes (the median load's count), and keystroke -> paint
    p50 / p99 (ms; None without keys). ``loads``: dicts with ``size``, ``ready_ms`` and
    ``nodes``. Raises ValueError when a size has no loads."""
    out: dict = {}
    for size in SIZES:
        mine = [r for r in loads if r["size"] == size]
        if not mine:
            raise ValueError(f"no {size} loads")
        typed = keys.get(size) or []
        out[size] = {
            "loads": len(mine),
            "ready_p50_ms": round(percentile([r["ready_ms"] for r in mine], 50), 1),
            "nodes": int(percentile([r["nodes"] for r in mine], 50)),
            "keys": len(typed),
            "key_p50_ms": round(percentile(typed, 50), 1) if typed else None,
            "key_p99_ms": round(percentile(typed, 99), 1) if typed else None,
        }
    return out


def verdicts(summary: dict) -> dict[str, bool]:
    """The issue's targets on :func:`summarise`'s result."""
    short, long = summary["short"], summary["long"]
    return {
        "ready_ratio": long["ready_p50_ms"] <= TARGET_READY_RATIO * short["ready_p50_ms"],
        "key_p99": long["key_p99_ms"] is not None and long["key_p99_ms"] <= TARGET_KEY_P99_MS,
        "dom_nodes": long["nodes"] <= TARGET_DOM_FACTOR * short["nodes"] + TARGET_DOM_EXTRA,
    }


def seed(username: str) -> dict[str, str]:
    """The two conversations of ``username`` (tests/long_conversation.py): size -> its id."""
    from django.contrib.auth import get_user_model

    from tests.long_conversation import long_conversation_seed

    owner = get_user_model().objects.get(username=username)
    ids = {}
    for size, (turns, branches) in SIZES.items():
        started = time.monotonic()
        seeded = long_conversation_seed(owner=owner, turns=turns, branches=branches)
        log(f"seeded {seeded.turns} turns ({branches} branches) in {time.monotonic() - started:.1f} s")
        ids[size] = str(seeded.conversation.pk)
    return ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=7, help="loads per conversation (alternating)")
    parser.add_argument("--typing-runs", type=int, default=2, help="typing runs per conversation")
    parser.add_argument("--chars", type=int, default=40, help="characters typed per run")
    parser.add_argument("--key-ms", type=float, default=80, help="ms between keystrokes")
    parser.add_argument("--tokens", type=int, default=500, help="tokens per answer")
    parser.add_argument("--token-ms", type=float, default=20, help="ms between tokens")
    parser.add_argument("--strict", action="store_true", help="exit 1 on a missed target")
    parser.add_argument("--profile", action="store_true",
                        help="print where the main thread's time goes while typing at 3,000 turns")  # fmt: skip
    parser.add_argument("--out", default=str(VAR / "bench" / "browser_long.json"))
    args = parser.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: run `make browser`", file=sys.stderr)
        return 2

    setup_django()
    from playwright.sync_api import sync_playwright

    server = scripted_server(args.tokens, args.token_ms, "browser_long.server.log")
    username = make_user("long")
    loads: list[dict] = []
    keys: dict[str, list[float]] = {size: [] for size in SIZES}
    profiles: list[dict] = []
    failed = 0
    log(f"long-conversation bench: {args.loads} loads and {args.typing_runs} typing runs per "
        f"conversation, {VIEWPORT['width']}x{VIEWPORT['height']}, {CPU_THROTTLING}x CPU throttling")  # fmt: skip
    try:
        ids = seed(username)
        server.start()
        server.wait_ready("/healthz", 90, poll_s=0.2)
        timeout_s = 60 + args.tokens * args.token_ms / 1000 * 3
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            context = browser.new_context(viewport=VIEWPORT)
            context.add_init_script(PAGE_PROBE)
            sign_in(context, server.url, username)
            urls = {size: f"{server.url}/c/{cid}/" for size, cid in ids.items()}
            for size in SIZES:  # warm-up, not counted (static files, the server's first render)
                one_load(context, urls[size])
            for i in range(args.loads * len(SIZES)):
                size = list(SIZES)[i % len(SIZES)]
                try:
                    loads.append({"size": size, **one_load(context, urls[size])})
                except Exception as exc:  # noqa: BLE001  a failed run is counted and reported
                    failed += 1
                    log(f"load {i} ({size}) failed: {exc}")
            for i in range(args.typing_runs * len(SIZES)):
                size = list(SIZES)[i % len(SIZES)]
                try:
                    profile = profiles if args.profile and size == "long" and not profiles else None
                    keys[size] += one_typing_run(context, urls[size], args.chars, args.key_ms, timeout_s, profile)
                except Exception as exc:  # noqa: BLE001
                    failed += 1
                    log(f"typing run {i} ({size}) failed: {exc}")
            browser.close()
    finally:
        server.stop()
        drop_users([username])

    try:
        summary = summarise(loads, keys)
    except ValueError as exc:
        print(f"no completed loads: {exc}", file=sys.stderr)
        return 2
    verdict = verdicts(summary)
    print()
    print(f"== long conversations: {VIEWPORT['width']}x{VIEWPORT['height']}, {CPU_THROTTLING}x CPU "
          f"throttling, typing while a {args.tokens}-token answer streams at {args.token_ms:g} ms/token ==")  # fmt: skip
    print(f"{'conversation':<26}{'loads':>6}{'ready p50 ms':>14}{'DOM nodes':>11}{'keys':>6}"
          f"{'key p50 ms':>12}{'key p99 ms':>12}")  # fmt: skip
    labels = {"short": "10 turns", "long": "3,000 turns, 20 branches"}
    for size in SIZES:
        s = summary[size]
        p50 = "-" if s["key_p50_ms"] is None else f"{s['key_p50_ms']:.1f}"
        p99 = "-" if s["key_p99_ms"] is None else f"{s['key_p99_ms']:.1f}"
        print(f"{labels[size]:<26}{s['loads']:>6}{s['ready_p50_ms']:>14.1f}{s['nodes']:>11}{s['keys']:>6}"
              f"{p50:>12}{p99:>12}")  # fmt: skip
    short, long = summary["short"], summary["long"]
    print(f"ready: 3,000 / 10 turns = {long['ready_p50_ms'] / short['ready_p50_ms']:.2f}x "
          f"(target <= {TARGET_READY_RATIO}x)")
    print(f"keystroke -> paint p99 at 3,000 turns: {long['key_p99_ms']} ms (target <= {TARGET_KEY_P99_MS:g} ms)")
    print(f"DOM nodes: {long['nodes']} vs {short['nodes']} (target <= {TARGET_DOM_FACTOR} x "
          f"{short['nodes']} + {TARGET_DOM_EXTRA} = {TARGET_DOM_FACTOR * short['nodes'] + TARGET_DOM_EXTRA})")
    print("targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in verdict.items()))
    if profiles:
        print("while typing at 3,000 turns, main-thread self time (ms, CPU profile):")
        for name, spent in profile_top(profiles[0]):
            print(f"  {spent:9.1f}  {name}")
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "viewport": VIEWPORT,
        "cpu_throttling": CPU_THROTTLING,
        "failed_runs": failed,
        "summary": summary,
        "verdicts": verdict,
        "loads": loads,
        "keys": keys,
    }
    return result_write(result, args.out, failed=failed, strict=args.strict)


if __name__ == "__main__":
    sys.exit(main())
