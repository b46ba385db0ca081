"""Moderation gates (issue 6): prompt-injection precision and recall on the labelled set, the
input gate's latency while the engine is busy, and what the output gate costs a streamed answer.

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.moderation_bench [--rounds 8]

One real vLLM engine (:meth:`inference.engine.VllmEngine.from_settings`, the shipped model) runs
in this process behind daphne (``chatsite.serve.FlowControlServer`` in a thread, serving
``chatsite.asgi.application``, as tests/conftest.py's ``chat_server`` does), with the
moderator the deployment is configured with (``settings.CHAT_MODERATOR``; default: the local
classifiers). Three parts, one run:

- **a. Prompt injection**: ``moderation.local.injection_eval_scores()``: the classifier, trained
  on ``moderation/data/injection_train.jsonl``, judged on the separate labelled evaluation set
  ``moderation/data/injection_eval.jsonl`` (attacks and harmless look-alikes) at the deployment's
  ``prompt_injection`` threshold. Target: precision and recall >= 0.9.
- **b. Input gate latency**: ``moderation.base.acheck("input", ...)`` on a 4,000-character
  message (harmless prose, shuffled differently each call, checked against a policy with 100
  blocked terms), ``--checks`` sequential calls (0-10 ms apart) awaited on the server's event
  loop, first with the engine idle (the baseline), then while ``--streams`` generations stream
  from the same engine (each restarts when it ends, so they never drop below that number).
  Latency is what a turn waits: from the ``await`` to the verdict (thread hand-off included).
  Target: p99 < 50 ms under load.
- **c. Output gate cost**: turns through the full stack over HTTP (``POST
  /v1/conversations/{id}/turns``, SSE, an API key, ``--max-tokens`` per answer, greedy, a fresh
  conversation per turn so every turn's prompt is the same length), one at a time, in
  alternating phases with ``settings.CHAT_MODERATION_OUTPUT`` on and off (read per turn by
  conversations/streaming.py): ``--rounds`` rounds, ordered on/off, off/on, ..., each phase
  ``--turns`` sequential turns on the same prompts as the other phase of its round (the rounds
  cycle through ``PROMPT_SET`` prompts), so short bursts of load on the shared machine land on
  both sides of a round alike. The prompts are played once before (warm-up: prefix cache,
  moderator). Also printed: the median over rounds of each round's on/off ratio (robust to
  one disturbed round). TTFT = request sent -> first
  ``token`` event with text; TPOT = (last token event - first) / (completion tokens - 1); both
  as bench/chat_bench.py measures them. Target: on / off <= 1.05 for TTFT p50 and TPOT p50.
  The input gate is on in both phases. Skipped (said so) when the output gate never runs.

The dev database is migrated first (part c creates a user, an API key and conversations in it
and deletes them at the end). Rate limits, load shedding and reserved slots are off (this
bench measures moderation, not them). Results: tables on stdout and
``var/bench/moderation_bench.json``. Each measured phase records the CPU used by other
processes (the machine is small and shared); a disturbed phase is flagged. Exit status 0 when
the run completed (``--strict``: 1 on a missed target), 2 when requests failed.
"""

# daphne installs Twisted's asyncio reactor at import; it must come before anything imports
# twisted (as in tests/conftest.py).
import daphne.server  # noqa: F401, I001  isort:skip

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.chat_bench import PROMPTS, CpuMeter, log, percentile, tpot

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))

INPUT_CHARS = 4000
BLOCKED_TERMS = 100
INPUT_P99_TARGET_S = 0.050
OUTPUT_RATIO_TARGET = 1.05
PR_TARGET = 0.9
LOAD_MAX_TOKENS = 512
PROMPT_SET = 4  # part c's prompts (PROMPTS[:4]), cycled through by the rounds

# Harmless prose for the 4,000-character input: a long message someone pastes with a question.
SENTENCES = [
    "Could you help me tidy up the notes below before I send them to the team?",
    "The quarterly planning meeting moved to Thursday at ten in the large room.",
    "We agreed to migrate the billing reports to the new warehouse by the end of March.",
    "Anna will draft the onboarding guide and Tom will review the security checklist.",
    "The customer survey showed that most people want faster search and clearer invoices.",
    "Please bring your laptop charger, because the room has only a few sockets.",
    "Last week the deployment took forty minutes; the goal is to bring it under ten.",
    "The garden club meets on the first Sunday of each month near the old library.",
    "Tomatoes need at least six hours of sun a day and regular, deep watering.",
    "Our hiking route follows the river for eight kilometres and then climbs to the ridge.",
    "The recipe calls for two cups of flour, one egg, a pinch of salt and some milk.",
    "If the printer jams again, open the back panel and remove the paper gently.",
    "The museum is free on Wednesdays, but the special exhibition needs a ticket.",
    "I am not sure whether the train on Saturday stops at the airport station.",
    "The library extended its opening hours during the exam period until midnight.",
    "Remember to water the plants on the balcony while we are away in August.",
    "The new bicycle lanes on the main road made my commute a lot calmer.",
    "She explained the difference between weather and climate with a simple example.",
    "Can you suggest a clearer title for the third section of the report?",
    "The invoice from the caterer arrived late, so the payment will go out next week.",
    "Our team retrospective found that code reviews wait too long before someone starts.",
    "The children built a small bird house and painted it bright yellow.",
    "Please check whether the budget table adds up; the totals look slightly off.",
    "During the workshop we compared three ways to summarise long documents.",
]


@dataclass
class CheckPhase:
    name: str
    latencies_s: list[float] = field(default_factory=list)
    streams_seen: list[int] = field(default_factory=list)
    flagged: int = 0
    failed: int = 0
    engine_tokens: int = 0
    wall_s: float = 0.0
    cpu: dict = field(default_factory=dict)

    def summary(self) -> dict:
        lat = self.latencies_s
        return {
            "phase": self.name,
            "checks": len(lat),
            "p50_s": percentile(lat, 50),
            "p99_s": percentile(lat, 99),
            "max_s": max(lat) if lat else None,
            "streams_min": min(self.streams_seen) if self.streams_seen else None,
            "streams_mean": (sum(self.streams_seen) / len(self.streams_seen))
            if self.streams_seen else None,
            "flagged": self.flagged,
            "failed": self.failed,
            "engine_tokens_per_s": self.engine_tokens / self.wall_s if self.wall_s else 0.0,
            "wall_s": self.wall_s,
            "other_cpu_s": self.cpu.get("other_cpu_s"),
            "disturbed": disturbed(self.cpu),
        }


@dataclass
class TurnSample:
    gate: str  # "on" | "off"
    round: int
    prompt_index: int
    ttft_s: float | None
    tpot_s: float | None
    done_after_last_token_s: float | None
    completion_tokens: int
    status: str
    error: str | None = None


def disturbed(cpu: dict) -> bool:
    """More than 5% of the machine used by processes outside this bench's stack."""
    if not cpu:
        return False
    return cpu["other_cpu_s"] > 0.05 * cpu["wall_s"] * (os.cpu_count() or 1)


def ms(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x * 1000:.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def long_message(i: int) -> str:
    """A harmless message of exactly INPUT_CHARS characters, different for each ``i``."""
    rng = random.Random(i)
    parts: list[str] = []
    size = 0
    while size < INPUT_CHARS:
        sentence = rng.choice(SENTENCES)
        parts.append(sentence)
        size += len(sentence) + 1
    return " ".join(parts)[:INPUT_CHARS]


# --------------------------------------------------------------------------------------------
# The server: daphne in a thread, the real engine in its event loop


class Server:
    """daphne on 127.0.0.1 (a free port) in a background thread, with the real engine as the
    process's engine; :meth:`call` runs a coroutine on the server's event loop."""

    def __init__(self) -> None:
        from chatsite.asgi import application  # noqa: PLC0415
        from chatsite.serve import FlowControlServer  # noqa: PLC0415
        import inference.engine as engine_module  # noqa: PLC0415

        self.engine_module = engine_module
        self.engine = engine_module.VllmEngine.from_settings()
        engine_module._engine = self.engine
        self.server = FlowControlServer(
            application,
            endpoints=["tcp:port=0:interface=127.0.0.1"],
            signal_handlers=False,
            verbosity=0,
        )
        self.thread = threading.Thread(target=self.server.run, name="daphne", daemon=True)
        self.url = ""

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.listening_addresses:
            if time.monotonic() > deadline:
                raise RuntimeError("daphne did not start listening")
            time.sleep(0.05)
        _, port = self.server.listening_addresses[0]
        self.url = f"http://127.0.0.1:{port}"
        log(f"daphne listening on {self.url}; starting the vLLM engine")
        started = time.perf_counter()
        self.call(self.engine.ensure_started(), timeout=600)
        log(f"engine ready in {time.perf_counter() - started:.1f} s")

    def call(self, coro, timeout: float = 600):
        return asyncio.run_coroutine_threadsafe(coro, daphne.server.twisted_loop).result(timeout)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.engine.shutdown()
        self.engine_module._engine = None
        with contextlib.suppress(Exception):
            self.server.stop()


# --------------------------------------------------------------------------------------------
# a. Prompt injection on the labelled evaluation set


def injection_part() -> dict:
    from moderation.local import injection_eval_scores  # noqa: PLC0415

    started = time.perf_counter()
    scores = injection_eval_scores()
    scores["seconds"] = time.perf_counter() - started  # includes training at first use
    log(
        f"injection eval: precision {scores['precision']:.3f}, recall {scores['recall']:.3f} "
        f"({scores['n_attacks']} attacks, {scores['n_benign']} look-alikes)"
    )
    return scores


# --------------------------------------------------------------------------------------------
# b. Input gate latency, engine idle vs busy


def bench_policy():
    """The deployment's thresholds and 100 blocked terms (a large organisation list)."""
    from moderation.verdicts import Policy, policy_for  # noqa: PLC0415

    base = policy_for(None)
    terms = tuple(f"codename orchid {i}" for i in range(BLOCKED_TERMS))
    return Policy(thresholds=dict(base.thresholds), blocked_terms=terms)


async def time_checks(engine, phase: CheckPhase, checks: int, policy, offset: int) -> None:
    from moderation.base import acheck  # noqa: PLC0415

    rng = random.Random(offset)
    meter = CpuMeter()
    meter.start()
    started = time.perf_counter()
    for i in range(checks):
        text = long_message(offset + i)
        phase.streams_seen.append(engine.num_unfinished_requests())
        t0 = time.perf_counter()
        verdict = await acheck("input", text, policy)
        phase.latencies_s.append(time.perf_counter() - t0)
        if verdict.error:
            phase.failed += 1
        elif verdict.flagged:
            phase.flagged += 1
        await asyncio.sleep(rng.uniform(0, 0.01))
    phase.wall_s = time.perf_counter() - started
    phase.cpu = meter.stop()


async def load_stream(engine, i: int, counter: dict, ids: list[int]) -> None:
    """One generation after another until cancelled (the engine aborts a cancelled one)."""
    from inference.engine import GenerationOptions  # noqa: PLC0415

    n = 0
    while True:
        n += 1
        options = GenerationOptions(max_tokens=LOAD_MAX_TOKENS, temperature=0.8)
        async for delta in engine.generate(ids, options, f"modbench-load-{i}-{n}"):
            if delta.text:
                counter["tokens"] += 1
                counter["first"] = True


async def input_part(engine, checks: int, streams: int) -> dict[str, CheckPhase]:
    from django.conf import settings  # noqa: PLC0415

    from moderation.base import acheck, moderator_warm  # noqa: PLC0415

    policy = bench_policy()
    await asyncio.get_running_loop().run_in_executor(None, moderator_warm)
    for i in range(20):  # warm the worker threads and the classifiers' caches
        await acheck("input", long_message(10_000 + i), policy)

    idle = CheckPhase("idle")
    log(f"input gate: {checks} checks, engine idle")
    await time_checks(engine, idle, checks, policy, offset=0)

    loaded = CheckPhase(f"{streams} streams")
    counter = {"tokens": 0, "first": False}
    prompts = [
        engine.encode_chat([
            {"role": "system", "content": settings.CHAT_SYSTEM_PROMPT},
            {"role": "user", "content": PROMPTS[i % len(PROMPTS)]},
        ])
        for i in range(streams)
    ]  # fmt: skip
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(load_stream(engine, i, counter, prompts[i])) for i in range(streams)]
    try:
        deadline = time.monotonic() + 120
        while not (counter["first"] and engine.num_unfinished_requests() >= streams):
            if time.monotonic() > deadline:
                raise RuntimeError("the load streams did not start within 120 s")
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # past the first prefills: steady decoding
        log(f"input gate: {checks} checks, {streams} streams decoding")
        before = counter["tokens"]
        await time_checks(engine, loaded, checks, policy, offset=checks)
        loaded.engine_tokens = counter["tokens"] - before
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        deadline = time.monotonic() + 30
        while engine.num_unfinished_requests() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    for phase in (idle, loaded):
        s = phase.summary()
        log(
            f"input gate, {phase.name}: p50 {ms(s['p50_s'])} ms, p99 {ms(s['p99_s'])} ms, "
            f"max {ms(s['max_s'])} ms, {s['failed']} failed, {s['flagged']} flagged"
        )
    return {"idle": idle, "loaded": loaded}


# --------------------------------------------------------------------------------------------
# c. Output gate on vs off through the full stack


class Api:
    """A bench user with an API key; deleted (with its conversations) at the end."""

    def __init__(self, url: str) -> None:
        import httpx  # noqa: PLC0415

        from accounts.models import User  # noqa: PLC0415
        from accounts.services import api_key_create  # noqa: PLC0415

        # Leftovers of an interrupted earlier run (their conversations were deleted with them
        # or are the user's to cascade).
        User.objects.filter(username__startswith="modbench-").delete()
        self.user = User.objects.create_user(
            username=f"modbench-{secrets.token_hex(4)}", password=secrets.token_urlsafe(16),
            tier="paid",
        )  # fmt: skip
        key = api_key_create(user=self.user, name="moderation bench").raw
        self.client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(300, connect=30),
        )  # fmt: skip
        self.conversations: list[str] = []

    def turn(
        self, prompt: str, max_tokens: int, gate: str, round_: int, index: int, system_prompt: str = ""
    ) -> TurnSample:
        """One fresh conversation (``system_prompt``: its instructions; "" for the default) and
        one streamed turn of ``prompt``, timed."""
        created = self.client.post(
            "/v1/conversations", json={"system_prompt": system_prompt} if system_prompt else {}
        )
        created.raise_for_status()
        conversation_id = created.json()["conversation_id"]
        self.conversations.append(conversation_id)
        first = last = None
        completion = 0
        status = ""
        error = None
        body = {"role": "user", "content": prompt, "max_tokens": max_tokens}
        t0 = time.perf_counter()
        end = None
        try:
            with self.client.stream(
                "POST", f"/v1/conversations/{conversation_id}/turns", json=body
            ) as response:
                if response.status_code != 200:
                    response.read()
                    raise RuntimeError(
                        f"POST turns -> {response.status_code}: {response.text[:300]}"
                    )
                buf = b""
                for chunk in response.iter_raw():
                    now = time.perf_counter()
                    buf += chunk
                    while (cut := buf.find(b"\n\n")) >= 0:
                        block, buf = buf[:cut], buf[cut + 2:]
                        name = data = None
                        for line in block.split(b"\n"):
                            if line.startswith(b"event: "):
                                name = line[7:].decode()
                            elif line.startswith(b"data: "):
                                data = json.loads(line[6:])
                        if name == "token" and data and data.get("text"):
                            first = first or now
                            last = now
                        elif name == "done":
                            completion = data["usage"]["completion_tokens"]
                            status = data.get("status", "")
                            end = now
                        elif name == "moderation":
                            status = "blocked"
                            end = now
                        elif name == "error":
                            raise RuntimeError(f"error event: {data}")
                    if end is not None:
                        break
            if end is None:
                raise RuntimeError("the event stream ended without done")
        except Exception as exc:  # noqa: BLE001 - counted and shown
            error = repr(exc)
        return TurnSample(
            gate=gate, round=round_, prompt_index=index,
            ttft_s=None if first is None else first - t0,
            tpot_s=tpot(first, last, completion),
            done_after_last_token_s=None if end is None or last is None else end - last,
            completion_tokens=completion, status=status, error=error,
        )  # fmt: skip

    def close(self) -> None:
        for conversation_id in self.conversations:
            with contextlib.suppress(Exception):
                self.client.delete(f"/v1/conversations/{conversation_id}")
        self.client.close()
        for attempt in (1, 2):
            connections_close_all()  # this thread's connection may be minutes old
            try:
                self.user.delete()
                return
            except Exception as exc:  # noqa: BLE001 - a leftover bench user is harmless
                if attempt == 2:
                    log(f"could not delete bench user {self.user.username}: {exc!r}")


def output_checks() -> float:
    from chatsite import metrics  # noqa: PLC0415

    return sum(
        metrics.value("chat_moderation_checks_total", gate="output", result=r)
        for r in ("clean", "flagged", "failed")
    )


def output_seconds() -> tuple[float, float]:
    """(sum of seconds, number) of output checks so far (chat_moderation_seconds{gate=output})."""
    from chatsite import metrics  # noqa: PLC0415

    return (
        metrics.value("chat_moderation_seconds_sum", gate="output"),
        metrics.value("chat_moderation_seconds_count", gate="output"),
    )


def connections_close_all() -> None:
    from django.db import connections  # noqa: PLC0415

    connections.close_all()


def output_part(server: Server, args) -> dict:
    from django.conf import settings  # noqa: PLC0415

    from django.db import OperationalError  # noqa: PLC0415

    prompts = PROMPTS[:PROMPT_SET]
    connections_close_all()  # this thread's connection is minutes old: start afresh
    try:
        api = Api(server.url)
    except OperationalError as exc:  # a connection the shared dev PostgreSQL dropped meanwhile
        log(f"database connection lost ({exc}); reconnecting")
        connections_close_all()
        api = Api(server.url)
    samples: list[TurnSample] = []
    meters: dict[str, list[dict]] = {"on": [], "off": []}
    checks = {"on": 0.0, "off": 0.0}
    check_time = {"on": [0.0, 0.0], "off": [0.0, 0.0]}
    saved = settings.CHAT_MODERATION_OUTPUT
    try:
        settings.CHAT_MODERATION_OUTPUT = True
        before = output_checks()
        log(f"output gate: warm-up, {len(prompts)} turns")
        warm = [api.turn(p, args.max_tokens, "on", -1, i) for i, p in enumerate(prompts)]
        if output_checks() == before:
            errors = [t.error for t in warm if t.error]
            log("output gate: no output check ran with CHAT_MODERATION_OUTPUT on: part c skipped"
                + (f" ({errors[0]})" if errors else ""))
            return {"skipped": "the output gate did not run (not wired into the request path?)",
                    "warm_up": [asdict(t) for t in warm]}
        for r in range(args.rounds):
            for gate in (("on", "off") if r % 2 == 0 else ("off", "on")):
                settings.CHAT_MODERATION_OUTPUT = gate == "on"
                n_before = output_checks()
                s_before = output_seconds()
                meter = CpuMeter()
                meter.start()
                phase = []
                for k in range(args.turns):
                    index = (r * args.turns + k) % len(prompts)
                    phase.append(api.turn(prompts[index], args.max_tokens, gate, r, index))
                meters[gate].append(meter.stop())
                checks[gate] += output_checks() - n_before
                s_after = output_seconds()
                check_time[gate][0] += s_after[0] - s_before[0]
                check_time[gate][1] += s_after[1] - s_before[1]
                samples.extend(phase)
                ttft = percentile([t.ttft_s for t in phase if t.ttft_s is not None], 50)
                tp = percentile([t.tpot_s for t in phase if t.tpot_s is not None], 50)
                log(f"output gate {gate:>3}, round {r + 1}: TTFT p50 {ms(ttft)} ms, "
                    f"TPOT p50 {ms(tp, 2)} ms")
    finally:
        settings.CHAT_MODERATION_OUTPUT = saved
        api.close()
    sides = {}
    for gate in ("on", "off"):
        rows = [t for t in samples if t.gate == gate]
        ok = [t for t in rows if t.error is None]
        sides[gate] = {
            "turns": len(rows),
            "errors": len(rows) - len(ok),
            "blocked": sum(1 for t in ok if t.status == "blocked"),
            "ttft_p50_s": percentile([t.ttft_s for t in ok if t.ttft_s is not None], 50),
            "tpot_p50_s": percentile([t.tpot_s for t in ok if t.tpot_s is not None], 50),
            "done_lag_p50_s": percentile(
                [t.done_after_last_token_s for t in ok if t.done_after_last_token_s is not None], 50
            ),
            "completion_tokens_mean": (
                sum(t.completion_tokens for t in ok) / len(ok) if ok else None
            ),
            "output_checks": checks[gate],
            "output_check_mean_s": (check_time[gate][0] / check_time[gate][1])
            if check_time[gate][1] else None,
            "other_cpu_s": sum(m["other_cpu_s"] for m in meters[gate]),
            "disturbed": any(disturbed(m) for m in meters[gate]),
        }
    per_round = []
    for r in range(args.rounds):
        on = [t for t in samples if t.round == r and t.gate == "on" and t.error is None]
        off = [t for t in samples if t.round == r and t.gate == "off" and t.error is None]
        per_round.append({
            "round": r + 1,
            "ttft_ratio": ratio(percentile([t.ttft_s for t in on], 50),
                                percentile([t.ttft_s for t in off], 50)),
            "tpot_ratio": ratio(percentile([t.tpot_s for t in on], 50),
                                percentile([t.tpot_s for t in off], 50)),
        })  # fmt: skip
    def median_ratio(key: str) -> float | None:
        return percentile([r[key] for r in per_round if r[key] is not None], 50)

    return {
        "sides": sides,
        "ttft_ratio": ratio(sides["on"]["ttft_p50_s"], sides["off"]["ttft_p50_s"]),
        "tpot_ratio": ratio(sides["on"]["tpot_p50_s"], sides["off"]["tpot_p50_s"]),
        "ttft_ratio_median_of_rounds": median_ratio("ttft_ratio"),
        "tpot_ratio_median_of_rounds": median_ratio("tpot_ratio"),
        "per_round": per_round,
        "samples": [asdict(t) for t in samples],
    }


# --------------------------------------------------------------------------------------------
# Report


def report(result: dict, args, settings) -> dict:
    checks: list[dict] = []
    inj = result["injection"]
    print()
    print(
        f"a. Prompt injection on the labelled evaluation set "
        f"(moderation/data/injection_eval.jsonl: {inj['n_attacks']} attacks, "
        f"{inj['n_benign']} harmless look-alikes; threshold {inj['threshold']}; classifier "
        f"trained on {inj['train_examples']} other examples)"
    )
    print(
        f"   precision {inj['precision']:.3f} ({inj['tp']} of {inj['tp'] + inj['fp']} flagged are "
        f"attacks)   recall {inj['recall']:.3f} ({inj['tp']} of {inj['n_attacks']} attacks caught)"
        f"   missed: {inj['fn']}, false alarms: {inj['fp']}"
    )
    for what in ("precision", "recall"):
        checks.append({"target": f"injection {what} >= {PR_TARGET}", "value": inj[what],
                       "shown": f"{inj[what]:.3f}", "pass": inj[what] >= PR_TARGET})

    phases = result["input"]
    print()
    moderator = settings.CHAT_MODERATOR.rsplit(".", 1)[-1]
    timeout_ms = settings.CHAT_MODERATION_TIMEOUT_S * 1000
    print(
        f"b. Input gate latency: moderation.base.acheck('input') on a {INPUT_CHARS:,}-character "
        f"harmless message, {args.checks} sequential checks per row, {moderator}, "
        f"{BLOCKED_TERMS} blocked terms, timeout {timeout_ms:.0f} ms"
    )
    header = (
        f"   {'engine':<12} | {'streams':>7} | {'p50 ms':>7} | {'p99 ms':>7} | {'max ms':>7} | "
        f"{'failed':>6} | {'flagged':>7} | {'engine tok/s':>12} | {'other CPU-s':>11}"
    )
    print(header)
    print("   " + "-" * (len(header) - 3))
    for phase in phases.values():
        s = phase.summary()
        streams = (
            "-" if s["streams_min"] is None else f"{s['streams_min']}-{max(phase.streams_seen)}"
        )
        print(
            f"   {s['phase']:<12} | {streams:>7} | {ms(s['p50_s']):>7} | {ms(s['p99_s']):>7} | "
            f"{ms(s['max_s']):>7} | {s['failed']:>6} | {s['flagged']:>7} | "
            f"{s['engine_tokens_per_s']:>12.0f} | {s['other_cpu_s'] or 0:>11.1f}"
            + ("  (disturbed)" if s["disturbed"] else "")
        )
    print("   flagged: harmless messages the check stopped (false alarms); failed: timeouts or "
          "errors (fail closed)")
    loaded = phases["loaded"].summary()
    checks.append({
        "target": f"input gate p99 < {INPUT_P99_TARGET_S * 1000:.0f} ms with {args.streams} "
                  "streams decoding",
        "value": loaded["p99_s"], "shown": f"{ms(loaded['p99_s'])} ms",
        "pass": loaded["p99_s"] is not None and loaded["p99_s"] < INPUT_P99_TARGET_S,
    })  # fmt: skip
    if loaded["failed"] or phases["idle"].failed:
        checks.append({"target": "no input check failed (timeout or error)", "pass": False,
                       "value": loaded["failed"] + phases["idle"].failed,
                       "shown": f"{loaded['failed'] + phases['idle'].failed} failed"})

    out = result["output"]
    print()
    print(
        f"c. Output gate cost through the full stack: POST /v1/conversations/{{id}}/turns (SSE), "
        f"{args.max_tokens}-token answers, greedy, one turn at a time; {args.rounds} rounds of "
        f"{args.turns} turns per side, alternating; window {settings.CHAT_MODERATION_WINDOW_CHARS} "
        f"chars every {settings.CHAT_MODERATION_STEP_CHARS}"
    )
    if "skipped" in out:
        print(f"   skipped: {out['skipped']}")
        checks.append({"target": "output gate measured", "value": None, "shown": out["skipped"],
                       "pass": False})
    else:
        header = (
            f"   {'output gate':<11} | {'turns':>5} | {'TTFT p50 ms':>11} | {'TPOT p50 ms':>11} | "
            f"{'done lag p50':>12} | {'tokens':>6} | {'checks/turn':>11} | {'check ms':>8} | "
            f"{'blocked':>7}"
        )
        print(header)
        print("   " + "-" * (len(header) - 3))
        for gate in ("off", "on"):
            s = out["sides"][gate]
            per_turn = s["output_checks"] / s["turns"] if s["turns"] else 0
            print(
                f"   {gate:<11} | {s['turns']:>5} | {ms(s['ttft_p50_s']):>11} | "
                f"{ms(s['tpot_p50_s'], 2):>11} | {ms(s['done_lag_p50_s']) + ' ms':>12} | "
                f"{s['completion_tokens_mean'] or 0:>6.0f} | {per_turn:>11.1f} | "
                f"{ms(s['output_check_mean_s'], 2):>8} | {s['blocked']:>7}"
                + ("  (disturbed)" if s["disturbed"] else "")
            )
        rounds = ", ".join(
            f"{r['ttft_ratio']:.2f}/{r['tpot_ratio']:.2f}" for r in out["per_round"]
            if r["ttft_ratio"] and r["tpot_ratio"]
        )
        print(
            f"   on / off: TTFT p50 {out['ttft_ratio']:.3f}x, TPOT p50 {out['tpot_ratio']:.3f}x; "
            f"median of the rounds' ratios: TTFT {out['ttft_ratio_median_of_rounds']:.3f}x, "
            f"TPOT {out['tpot_ratio_median_of_rounds']:.3f}x"
        )
        print(f"   per round TTFT/TPOT on/off: {rounds}")
        print("   done lag: last token -> done event (the gate's check of the answer's tail and "
              "storing the answer)")
        for what in ("ttft", "tpot"):
            value = out[f"{what}_ratio"]
            checks.append({
                "target": (
                    f"{what.upper()} p50 with the output gate / without <= {OUTPUT_RATIO_TARGET}"
                ),
                "value": value, "shown": "-" if value is None else f"{value:.3f}x",
                "pass": value is not None and value <= OUTPUT_RATIO_TARGET,
            })  # fmt: skip
        errors = out["sides"]["on"]["errors"] + out["sides"]["off"]["errors"]
        if errors:
            checks.append({"target": "no failed turns", "value": errors,
                           "shown": f"{errors} failed", "pass": False})
    print()
    for check in checks:
        print(f"  {'PASS' if check['pass'] else 'MISS'}  {check['target']}  ({check['shown']})")
    all_ok = all(check["pass"] for check in checks)
    print(f"\n  overall: {'PASS' if all_ok else 'MISS'}\n")
    return {"checks": checks, "overall_pass": all_ok}


def run(args) -> int:
    from django.conf import settings  # noqa: PLC0415
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connections  # noqa: PLC0415

    started = time.perf_counter()
    call_command("migrate", verbosity=0)  # the dev database: part c signs a user up in it
    connections.close_all()  # part c reconnects minutes later (a fresh connection then)
    # This bench measures moderation: none of the tier machinery that would get in the way.
    unlimited = {"rpm": None, "tpm": None}
    settings.CHAT_RATE_LIMITS_BY_TIER = {t: dict(unlimited) for t in ("free", "paid", "enterprise")}
    settings.CHAT_ORG_RATE_LIMITS_BY_TIER = {
        t: dict(unlimited) for t in ("free", "paid", "enterprise")
    }
    settings.CHAT_RESERVED_SLOTS = 0
    settings.CHAT_SHED_FREE_WAITING = settings.CHAT_DEGRADE_PAID_WAITING = 100_000
    settings.CHAT_REASONING_LAST_WAITING = 100_000
    settings.CHAT_TEMPERATURE = 0.0  # greedy: each prompt gets the same answer on both sides
    settings.CHAT_MODERATION_INPUT = True

    result: dict = {"injection": injection_part()}
    server = Server()
    try:
        server.start()
        result["input"] = server.call(input_part(server.engine, args.checks, args.streams))
        result["output"] = output_part(server, args)
    finally:
        server.stop()
    summary = report(result, args, settings)
    total_s = time.perf_counter() - started
    log(f"total bench time {total_s:.0f} s")
    payload = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {
            "moderator": settings.CHAT_MODERATOR,
            "timeout_s": settings.CHAT_MODERATION_TIMEOUT_S,
            "window_chars": settings.CHAT_MODERATION_WINDOW_CHARS,
            "step_chars": settings.CHAT_MODERATION_STEP_CHARS,
            "input_chars": INPUT_CHARS,
            "blocked_terms": BLOCKED_TERMS,
            "checks": args.checks,
            "streams": args.streams,
            "rounds": args.rounds,
            "turns": args.turns,
            "max_tokens": args.max_tokens,
            "model_path": str(settings.CHAT_MODEL_PATH),
            "cpu_count": os.cpu_count(),
            "loadavg_end": os.getloadavg(),
        },
        "total_s": total_s,
        "injection": result["injection"],
        "input": {
            name: {
                **phase.summary(),
                "latencies_ms": [round(x * 1000, 3) for x in phase.latencies_s],
            }
            for name, phase in result["input"].items()
        },
        "output": result["output"],
        **summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1, default=str))
    log(f"results written to {args.out}")
    output = result["output"]
    if "sides" in output and (output["sides"]["on"]["errors"] or output["sides"]["off"]["errors"]):
        return 2
    return 1 if args.strict and not summary["overall_pass"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.moderation_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--checks", type=int, default=200, help="input checks per row (>= 200)")
    parser.add_argument("--streams", type=int, default=8, help="engine streams under load")
    parser.add_argument("--rounds", type=int, default=8, help="output gate on/off rounds")
    parser.add_argument("--turns", type=int, default=2, help="turns per side per round")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--out", type=Path, default=VAR / "bench" / "moderation_bench.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    import django  # noqa: PLC0415

    django.setup()
    with contextlib.suppress(KeyboardInterrupt):
        return run(args)
    return 130


if __name__ == "__main__":
    sys.exit(main())
