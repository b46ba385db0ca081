"""A ``remote`` model pool served by a real ``vllm serve`` (vLLM's OpenAI-compatible server) on
loopback: streaming, cancel and usage behave as with the local backend (issue 5, "Remote
backend").

The server is started once for this module (about 50 s on the CPU) with priority scheduling and
prompt-token details, and killed (its whole process group) at the end. The ``vllm`` console
script does not work in this environment, so it runs as ``python -m
vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from django.conf import settings

from inference.engine import GenerationOptions
from inference.pools import Pool, pool_engine, pool_set_reset, pools_load
from inference.remote import OpenAIRemoteEngine
from tests.processes import free_port

pytestmark = pytest.mark.real_engine

SERVED_NAME = "smol-remote"
LONG_PROMPT = "Write a very long story about a lighthouse keeper and a storm, in many chapters."


@dataclass
class RemoteServer:
    """A running ``vllm serve`` subprocess."""

    url: str
    proc: subprocess.Popen
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def metric(self, name: str) -> float:
        """The sum of a Prometheus sample family from the server's /metrics (0 if absent)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
            if match:
                total += float(match.group(2))
        return total


@contextlib.contextmanager
def vllm_server(tmp_dir) -> Iterator[RemoteServer]:
    """Start vLLM's OpenAI server for the shipped model on a free loopback port; yield once
    ``/v1/models`` answers; stop the whole process group afterwards (the API server and its
    EngineCore child)."""
    port = free_port()
    log_path = os.path.join(tmp_dir, "vllm-serve.log")
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
         "--model", str(settings.CHAT_MODEL_PATH), "--served-model-name", SERVED_NAME,
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--enforce-eager",
         "--max-model-len", "2048", "--max-num-seqs", "8", "--scheduling-policy", "priority",
         "--enable-prompt-tokens-details", "--enable-prefix-caching"],
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"},
        cwd=settings.BASE_DIR, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    server = RemoteServer(url=f"http://127.0.0.1:{port}", proc=proc, log_path=log_path)
    deadline = time.monotonic() + 240
    try:
        while True:
            try:
                if httpx.get(f"{server.url}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "vllm serve exited:\n" + server.log()[-4000:]
            assert time.monotonic() < deadline, "vllm serve did not become ready:\n" + server.log()[-4000:]
            time.sleep(1)
        yield server
    finally:
        _stop_group(proc)
        log.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, give it 20 s (the EngineCore and its worker exit a
    few seconds after the API server), then SIGKILL whatever is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(20)
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 10
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)


@pytest.fixture(scope="module")
def remote_server(tmp_path_factory) -> Iterator[RemoteServer]:
    with vllm_server(str(tmp_path_factory.mktemp("vllm"))) as server:
        yield server
    # Nothing of the server (API process, EngineCore, worker) outlives the module.
    assert not _group_alive(server.proc.pid)


def remote_pool_entries(url: str) -> list[dict]:
    """The default pools plus ``remote-smol``, served by the vLLM server at ``url``."""
    return [
        *settings.CHAT_POOLS,
        {
            "name": "remote-smol",
            "label": "SmolLM2 on a remote vLLM server",
            "version": "1",
            "backend": "remote",
            "url": url,
            "model": SERVED_NAME,
            "priority": 0,
            "max_context": 2048,
            "max_tokens": 512,
            "price_input_per_m": "1.00",
            "price_cached_input_per_m": "0.10",
            "price_output_per_m": "2.00",
            "tiers": ["paid", "enterprise"],
        },
    ]


@pytest.fixture
def remote_pool(remote_server) -> Iterator[Pool]:
    pool_set_reset()
    yield pools_load(remote_pool_entries(remote_server.url)).get("remote-smol")
    pool_set_reset()


async def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await asyncio.to_thread(predicate):
            return True
        await asyncio.sleep(0.05)
    return await asyncio.to_thread(predicate)


# --- engine level ---


async def test_remote_pool_streams_with_exact_usage(remote_pool):
    """The pool's engine is a remote client; text arrives in many deltas, and the final delta
    carries the server's usage: the prompt we sent, and max_tokens completion tokens."""
    engine = pool_engine(remote_pool)
    assert isinstance(engine, OpenAIRemoteEngine) and engine.model == SERVED_NAME
    await engine.ensure_started()
    prompt = engine.encode_chat([{"role": "user", "content": LONG_PROMPT}])

    deltas = [
        d async for d in engine.generate(
            prompt, GenerationOptions(max_tokens=40, temperature=0.0, priority=3), "remote-usage"
        )
    ]  # fmt: skip

    texts = [d.text for d in deltas if d.text]
    assert len(texts) >= 10
    final = deltas[-1]
    assert final.finish_reason == "length"
    assert final.prompt_tokens == len(prompt)
    assert final.completion_tokens == 40
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert engine.num_unfinished_requests() == 0


async def test_remote_pool_reports_cached_prompt_tokens(remote_pool):
    """A repeated prompt is served from the server's prefix cache; the final delta says how many
    prompt tokens were cached (usage.prompt_tokens_details.cached_tokens)."""
    engine = pool_engine(remote_pool)
    # Several KV blocks long (the CPU backend's blocks hold 128 tokens; only full blocks are cached).
    context = "The keeper climbs the tower, trims the wick and watches the sea. " * 40
    prompt = engine.encode_chat([{"role": "user", "content": context + LONG_PROMPT}])
    options = GenerationOptions(max_tokens=4, temperature=0.0)

    first = [d async for d in engine.generate(prompt, options, "remote-cache-1")][-1]
    second = [d async for d in engine.generate(prompt, options, "remote-cache-2")][-1]

    assert first.prompt_tokens == second.prompt_tokens == len(prompt) > 512
    assert second.cached_tokens >= len(prompt) // 2  # the full blocks of the prompt reused
    assert second.cached_tokens <= len(prompt)
    assert remote_pool.cost(
        prompt_tokens=second.prompt_tokens, cached_tokens=second.cached_tokens,
        completion_tokens=second.completion_tokens,
    ) < remote_pool.cost(
        prompt_tokens=second.prompt_tokens, cached_tokens=0, completion_tokens=second.completion_tokens
    )  # fmt: skip


async def test_cancelling_the_reader_stops_the_remote_request(remote_pool, remote_server):
    """PF-C1 for a remote pool: cancel the task reading a long generation; the vLLM server's
    running count returns to 0 within 1 s and it generates no further tokens."""
    engine = pool_engine(remote_pool)
    prompt = engine.encode_chat([{"role": "user", "content": LONG_PROMPT}])
    first_text = asyncio.Event()
    received: list = []

    async def read():
        async for delta in engine.generate(prompt, GenerationOptions(max_tokens=1500), "remote-cancel"):
            received.append(delta)
            first_text.set()

    reader = asyncio.create_task(read())
    await asyncio.wait_for(first_text.wait(), 60)
    await asyncio.sleep(0.5)
    assert remote_server.metric("vllm:num_requests_running") == 1

    reader.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reader

    assert await wait_until(lambda: remote_server.metric("vllm:num_requests_running") == 0, 1.0)
    generated = remote_server.metric("vllm:generation_tokens_total")
    await asyncio.sleep(1.0)
    assert remote_server.metric("vllm:generation_tokens_total") == generated
    assert engine.num_unfinished_requests() == 0
    assert 0 < len(received) < 1500


async def test_engine_abort_from_another_task_stops_the_remote_request(remote_pool, remote_server):
    """The Stop button's path: ``engine.abort(request_id)`` from another task ends the
    generation and the remote request, within 1 s."""
    engine = pool_engine(remote_pool)
    prompt = engine.encode_chat([{"role": "user", "content": LONG_PROMPT}])
    started = asyncio.Event()

    async def read():
        async for _ in engine.generate(prompt, GenerationOptions(max_tokens=1500), "remote-abort"):
            started.set()

    reader = asyncio.create_task(read())
    await asyncio.wait_for(started.wait(), 60)
    assert engine.num_unfinished_requests() == 1

    await engine.abort("remote-abort")
    done, _ = await asyncio.wait({reader}, timeout=1.0)

    assert reader in done
    assert await wait_until(lambda: remote_server.metric("vllm:num_requests_running") == 0, 1.0)
    assert engine.num_unfinished_requests() == 0
