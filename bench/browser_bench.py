"""The chat page in a real browser (issue 18's benchmark): what live Markdown rendering costs a
reader, against a plain-text baseline in the same run.

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.browser_bench [--runs 30]

One uvicorn (``python -m chatsite.serve``) serves the app with the scripted engine double
(``tests.fakes.ScriptedEngine``) streaming a fixed, Markdown-rich answer of ``--tokens`` (500)
tokens, one every ``--token-ms`` (20) ms: headings, paragraphs, lists, a table and a Python code
block, so the live renderer does the work a real answer gives it. Headless Debian Chromium
(Playwright) signs in once per mode and then, per run, opens a new chat, types a question and
presses Enter. Two modes, alternating run by run (live, plain, live, ...) so that load on the
shared machine lands on both alike:

- **live**: the page as served (static/chat/render.js: markdown-it, DOMPurify and highlight.js
  render each token's text as it arrives);
- **plain** (the baseline): the same page with render.js and the three vendored libraries
  refused by the browser (Playwright routes them to an error), so chat.js appends each token's
  text as a text node and swaps in the server's HTML on ``done``.

Measured in the page (``performance.now()``, one clock):

- **Enter -> first token painted**: from the Enter keydown in the composer (a capture listener
  that runs before chat.js's) to just after the first frame that paints text in the streaming
  bubble: a ``setTimeout(0)`` queued after that frame's callbacks (text drawn by a frame
  callback, as the live renderer does) or from the next frame (text put in by a task, as the
  baseline does) runs after that frame's paint, the usual approximation.
- **Long tasks** (the Long Tasks API, tasks over 50 ms on the main thread) from Enter until the
  answer is marked complete, counted and summed per run.

Targets (the issue): live p50 and p99 within 30 ms of the baseline's, and no more long tasks in
all live runs than in all baseline runs. Results: a table on stdout and
``var/bench/browser_bench.json``. Exit status 0 when every run completed (``--strict``: 1 on a
missed target), 2 when a run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

from bench.harness import (
    VAR,
    Spawned,
    free_port,
    log,
    percentile,
    server_argv,
    tier_machinery_off_env,
)

ENGINE_CLASS = "tests.fakes.ScriptedEngine"
CHROMIUM = "/usr/bin/chromium"
PASSWORD = "bench-browser-pw-1"
QUESTION = "Write me a short guide to Python lists, with a table and an example."
# What the plain-text baseline refuses: the live renderer and the libraries it uses.
LIVE_RENDER_SCRIPTS = ("chat/render.js", "vendor/markdown-it-", "vendor/purify-", "vendor/highlight-")
TARGET_DELTA_MS = 30.0

# Measures in the page; installed before any of the page's scripts (an init script).
PAGE_PROBE = """
(() => {
  const b = window.__bench = {t0: null, text: null, painted: null, done: null, longtasks: []};
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) b.longtasks.push([e.startTime, e.duration]);
    }).observe({type: 'longtask', buffered: true});
  } catch (e) { b.longtasksUnsupported = String(e); }
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && e.target.matches && e.target.matches('#composer textarea'))
      b.t0 = performance.now();
  }, true);
  // The first frame that paints the answer's text: text put in by a frame callback (the live
  // renderer draws once a frame) is painted right after that frame's callbacks; text put in by
  // a task (the plain baseline appends on each event) is painted by the next frame. In both
  // cases the setTimeout(0) below runs just after that paint.
  const paintedSoon = () => setTimeout(() => { b.painted = performance.now(); }, 0);
  const look = (inFrame) => {
    if (b.t0 === null) return;
    const all = document.querySelectorAll('#messages article.assistant');
    const a = all[all.length - 1];
    if (!a) return;
    const t = a.querySelector('[data-stream-text]') || a.querySelector('.bubble');
    if (b.text === null && t && t.textContent.trim()) {
      b.text = performance.now();
      if (inFrame) paintedSoon(); else nativeFrame(paintedSoon);
    }
    if (b.done === null && a.classList.contains('complete')) b.done = performance.now();
  };
  const nativeFrame = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = (cb) => nativeFrame((ts) => { cb(ts); look(true); });
  const start = () => new MutationObserver(() => look(false)).observe(document.body, {
    subtree: true, childList: true, characterData: true, attributes: true, attributeFilter: ['class'],
  });
  if (document.body) start(); else document.addEventListener('DOMContentLoaded', start);
})();
"""


def answer_steps(tokens: int, token_s: float) -> list:
    """The scripted engine's steps for a ``tokens``-token Markdown answer: text deltas (one
    token each: a word with its following space or newline) with a ``token_s`` pause before
    each. After an opening sentence the text cycles through a heading, a paragraph, a list, a table and a code block, so
    every kind of block the live renderer handles streams in, open fences included."""
    section = (
        "## Working with lists\n\n"
        "A list holds items **in order**, and you can change it after you make it. "
        "Use `append` to add one item and `extend` to add many.\n\n"
        "- `len(items)` counts the items\n"
        "- `items[0]` is the first one\n"
        "- `items[-1]` is the *last* one\n\n"
        "| method | what it does | returns |\n"
        "|---|---|---|\n"
        "| append | adds one item | None |\n"
        "| pop | removes the last item | the item |\n"
        "| sort | orders the items | None |\n\n"
        "```python\n"
        "items = [3, 1, 2]\n"
        "items.append(4)\n"
        "for index, item in enumerate(sorted(items)):\n"
        "    print(index, item)  # 0 1, 1 2, ...\n"
        "```\n\n"
    )
    # Answers open with prose (a first token that is a Markdown mark, "## ", shows nothing
    # until the next one, rendered or not: it would time the model's choice, not the page).
    pieces: list[str] = []
    text = "Sure, here is a short guide to Python lists.\n\n" + section
    while len(pieces) < tokens:
        for line in text.splitlines(keepends=True):
            words = line.split(" ")
            for i, word in enumerate(words):
                piece = word + (" " if i < len(words) - 1 else "")
                if piece:
                    pieces.append(piece)
        text = section
    steps: list = []
    for piece in pieces[:tokens]:
        steps += [token_s, piece]
    return steps


def summarise(runs: list[dict]) -> dict:
    """Per mode: Enter -> first token painted p50/p99 (ms) over the runs, and long tasks (count
    and summed ms, over all runs). ``runs``: dicts with ``mode``, ``first_paint_ms``,
    ``longtasks`` (a count) and ``longtask_ms``. Raises ValueError when a mode has no runs."""
    out: dict = {}
    for mode in ("live", "plain"):
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            raise ValueError(f"no {mode} runs")
        paint = [r["first_paint_ms"] for r in mine]
        out[mode] = {
            "runs": len(mine),
            "first_paint_p50_ms": round(percentile(paint, 50), 1),
            "first_paint_p99_ms": round(percentile(paint, 99), 1),
            "longtasks": sum(r["longtasks"] for r in mine),
            "longtask_ms": round(sum(r["longtask_ms"] for r in mine), 1),
            "stream_ms_p50": round(percentile([r["stream_ms"] for r in mine], 50), 1),
        }
    return out


def verdicts(summary: dict, delta_ms: float = TARGET_DELTA_MS) -> dict[str, bool]:
    """The issue's targets on :func:`summarise`'s result: live p50 and p99 at most
    ``delta_ms`` above the baseline's, and no more long tasks in the live runs than in the
    baseline's."""
    live, plain = summary["live"], summary["plain"]
    return {
        "p50_within": live["first_paint_p50_ms"] - plain["first_paint_p50_ms"] <= delta_ms,
        "p99_within": live["first_paint_p99_ms"] - plain["first_paint_p99_ms"] <= delta_ms,
        "longtasks_not_more": live["longtasks"] <= plain["longtasks"],
    }


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    os.environ.setdefault("CHAT_ENGINE_CLASS", ENGINE_CLASS)  # never load the model here
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_user(tag: str) -> str:
    from django.contrib.auth import get_user_model

    username = f"browser-bench-{tag}-{uuid.uuid4().hex[:8]}"
    get_user_model().objects.create_user(username=username, password=PASSWORD)
    return username


def drop_users(usernames: list[str]) -> None:
    from django.contrib.auth import get_user_model

    from privacy.services import account_delete

    for user in get_user_model().objects.filter(username__in=usernames):
        account_delete(user=user)


def sign_in(context, base: str, username: str) -> None:
    page = context.new_page()
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("main.auth button[type=submit]")
    page.wait_for_url(f"{base}/")
    page.close()


def one_run(context, base: str, mode: str, timeout_s: float) -> dict:
    """Open a new chat, send :data:`QUESTION` with Enter, wait for the stored answer; return
    the page's measures."""
    page = context.new_page()
    try:
        page.goto(f"{base}/", wait_until="load")
        page.wait_for_function("typeof window.htmx === 'object'")
        if mode == "live":
            page.wait_for_function("typeof window.chatRender === 'object'")
        else:
            assert page.evaluate("typeof window.chatRender") == "undefined", "baseline renders"
        page.wait_for_timeout(300)  # load-time work (parsing the libraries) is over
        page.fill("#composer textarea", QUESTION)
        page.press("#composer textarea", "Enter")
        page.wait_for_function(
            "window.__bench.done !== null && window.__bench.painted !== null",
            timeout=timeout_s * 1000,
        )
        b = page.evaluate("window.__bench")
    finally:
        page.close()
    if b.get("longtasksUnsupported"):
        raise RuntimeError(f"this Chromium has no Long Tasks API: {b['longtasksUnsupported']}")
    tasks = [(start, d) for start, d in b["longtasks"] if b["t0"] <= start <= b["done"]]
    window = [d for _, d in tasks]
    return {
        "mode": mode,
        "first_paint_ms": round(b["painted"] - b["t0"], 2),
        "first_text_ms": round(b["text"] - b["t0"], 2),
        "stream_ms": round(b["done"] - b["t0"], 1),
        "longtasks": len(window),
        "longtask_ms": round(sum(window), 1),
        # When each long task started (ms after Enter) and how long it took, to tell a task
        # at the first token or at `done` from one mid-stream.
        "longtask_at_ms": [[round(start - b["t0"], 1), round(d, 1)] for start, d in tasks],
    }


def result_write(result: dict, out: str, *, failed: int, strict: bool) -> int:
    """Write ``result`` (its ``verdicts``: target -> met) as JSON to ``out`` and return the
    bench's exit status: 2 when a run failed, 1 with ``strict`` and a missed target, else 0.
    Shared with bench/browser_long.py."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2))
    print(f"written: {out}")
    if failed:
        return 2
    return 1 if strict and not all(result["verdicts"].values()) else 0


def scripted_server(tokens: int, token_ms: float, log_name: str) -> Spawned:
    """One uvicorn (not started) on a free port with the scripted engine double streaming the
    bench's Markdown-rich answer (``tokens`` tokens, one every ``token_ms`` ms) and the tier
    machinery off; its log in var/bench/``log_name``. Shared with bench/browser_long.py."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    env.update(tier_machinery_off_env())
    env.update(
        CHAT_ENGINE_CLASS=ENGINE_CLASS,
        CHAT_SCRIPTED_ENGINE_SCRIPT=json.dumps(answer_steps(tokens, token_ms / 1000)),
        DJANGO_SETTINGS_MODULE="chatsite.settings.base",
        PYTHONUNBUFFERED="1",
    )
    return Spawned("uvicorn", server_argv(port=port), port=port, env=env, log_path=VAR / "bench" / log_name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs per mode (alternating)")
    parser.add_argument("--tokens", type=int, default=500, help="tokens per answer")
    parser.add_argument("--token-ms", type=float, default=20, help="ms between tokens")
    parser.add_argument("--strict", action="store_true", help="exit 1 on a missed target")
    parser.add_argument("--out", default=str(VAR / "bench" / "browser_bench.json"))
    args = parser.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"{CHROMIUM} is missing: run `make browser`", file=sys.stderr)
        return 2

    setup_django()
    from playwright.sync_api import sync_playwright

    server = scripted_server(args.tokens, args.token_ms, "browser_bench.server.log")
    users = {mode: make_user(mode) for mode in ("live", "plain")}
    runs: list[dict] = []
    failed = 0
    log(f"browser bench: {args.runs} runs per mode, {args.tokens} tokens at {args.token_ms} ms")
    try:
        server.start()
        server.wait_ready("/healthz", 90, poll_s=0.2)
        timeout_s = 30 + args.tokens * args.token_ms / 1000 * 3
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            contexts = {}
            for mode in ("live", "plain"):
                context = browser.new_context(viewport={"width": 1280, "height": 800})
                context.add_init_script(PAGE_PROBE)
                if mode == "plain":
                    context.route(
                        lambda url: any(s in url for s in LIVE_RENDER_SCRIPTS),
                        lambda route: route.abort(),
                    )
                sign_in(context, server.url, users[mode])
                contexts[mode] = context
            one_run(contexts["live"], server.url, "live", timeout_s)  # warm-up, not counted
            one_run(contexts["plain"], server.url, "plain", timeout_s)
            for i in range(args.runs * 2):
                mode = ("live", "plain")[i % 2]
                try:
                    runs.append(one_run(contexts[mode], server.url, mode, timeout_s))
                except Exception as exc:  # noqa: BLE001  a failed run is counted and reported
                    failed += 1
                    log(f"run {i} ({mode}) failed: {exc}")
            browser.close()
    finally:
        server.stop()
        drop_users(list(users.values()))

    if not any(r["mode"] == "live" for r in runs) or not any(r["mode"] == "plain" for r in runs):
        print("no completed runs in one of the modes", file=sys.stderr)
        return 2
    summary = summarise(runs)
    verdict = verdicts(summary)
    print()
    print(f"== browser bench: Enter -> first token painted, long tasks (> 50 ms) while a "
          f"{args.tokens}-token answer streams at {args.token_ms:g} ms/token ==")  # fmt: skip
    print(f"{'mode':<22}{'runs':>5}{'p50 ms':>9}{'p99 ms':>9}{'long tasks':>12}{'long ms':>9}"
          f"{'stream p50 ms':>15}")  # fmt: skip
    for mode, label in (("live", "live Markdown"), ("plain", "plain text (baseline)")):
        s = summary[mode]
        print(f"{label:<22}{s['runs']:>5}{s['first_paint_p50_ms']:>9.1f}{s['first_paint_p99_ms']:>9.1f}"
              f"{s['longtasks']:>12}{s['longtask_ms']:>9.1f}{s['stream_ms_p50']:>15.1f}")  # fmt: skip
    d50 = summary["live"]["first_paint_p50_ms"] - summary["plain"]["first_paint_p50_ms"]
    d99 = summary["live"]["first_paint_p99_ms"] - summary["plain"]["first_paint_p99_ms"]
    print(f"live - baseline: p50 {d50:+.1f} ms, p99 {d99:+.1f} ms (target <= +{TARGET_DELTA_MS:g} ms); "
          f"long tasks {summary['live']['longtasks']} vs {summary['plain']['longtasks']} "
          f"(target: not more)")  # fmt: skip
    print("targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in verdict.items()))
    result = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "tokens": args.tokens,
        "token_ms": args.token_ms,
        "failed_runs": failed,
        "summary": summary,
        "verdicts": verdict,
        "runs": runs,
    }
    return result_write(result, args.out, failed=failed, strict=args.strict)


if __name__ == "__main__":
    sys.exit(main())
