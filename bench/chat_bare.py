"""bench/chat_bench.py's phase 1: the bare vLLM engine in this process, N concurrent chats (the
product's system prompt + one of the fixed prompts, greedy, MAX_TOKENS tokens)."""

from __future__ import annotations

import asyncio
import time

from bench.chat_batches import (
    MAX_TOKENS,
    BatchResult,
    ChatResult,
    fmt_batch,
    make_batch,
    model_path,
    system_prompt,
    warn_errors,
)
from bench.harness import PROMPTS, CpuMeter, log, tpot


async def bare_chat(engine, sys_prompt: str, prompt_index: int, request_id: str, t_batch: float):
    from inference.engine import GenerationOptions  # noqa: PLC0415

    prompt = PROMPTS[prompt_index % len(PROMPTS)]
    options = GenerationOptions(max_tokens=MAX_TOKENS, temperature=0.0)
    t0 = time.perf_counter()
    first = last = None
    parts: list[str] = []
    completion_tokens = 0
    error = None
    try:
        ids = engine.encode_chat(
            [{"role": "system", "content": sys_prompt}, {"role": "user", "content": prompt}]
        )
        async for delta in engine.generate(ids, options, request_id):
            if delta.text:
                now = time.perf_counter()
                if first is None:
                    first = now
                last = now
                parts.append(delta.text)
            completion_tokens = delta.completion_tokens
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        error = repr(exc)
    end = time.perf_counter()
    return ChatResult(
        prompt_index=prompt_index,
        ttft_s=None if first is None else first - t0,
        tpot_s=tpot(first, last, completion_tokens),
        completion_tokens=completion_tokens,
        text="".join(parts),
        end_s=end - t_batch,
        error=error,
    )


async def bare_batch(engine, sys_prompt: str, n: int, tag: str) -> tuple[float, list[ChatResult]]:
    t_batch = time.perf_counter()
    chats = await asyncio.gather(
        *(bare_chat(engine, sys_prompt, i, f"bench-{tag}-{i}", t_batch) for i in range(n))
    )
    return time.perf_counter() - t_batch, list(chats)


async def run_bare(args) -> dict[int, list[BatchResult]]:
    from inference.engine import VllmEngine  # noqa: PLC0415

    sys_prompt = system_prompt()
    engine = VllmEngine(
        model_path=model_path(), max_model_len=4096, kv_cache_bytes=1 << 30, max_num_seqs=64
    )
    log("bare: starting the vLLM engine in-process")
    t = time.perf_counter()
    await engine.ensure_started()
    log(f"bare: engine ready in {time.perf_counter() - t:.1f} s; warming up")
    results: dict[int, list[BatchResult]] = {n: [] for n in args.concurrency}
    try:
        for w in range(args.warmup):
            warn_errors("bare warm-up", (await bare_batch(engine, sys_prompt, 1, f"warm{w}"))[1])
        if args.warmup_batch:
            _, chats = await bare_batch(engine, sys_prompt, args.warmup_batch, "warmb")
            warn_errors("bare warm-up", chats)
        for rep in range(args.reps):
            for n in args.concurrency:
                meter = CpuMeter()
                meter.start()
                wall, chats = await bare_batch(engine, sys_prompt, n, f"r{rep}n{n}")
                batch = make_batch(n, rep, wall, chats)
                batch.cpu = meter.stop()
                results[n].append(batch)
                log(f"bare  N={n:<3} rep {rep}: {fmt_batch(batch)}")
    finally:
        engine.shutdown()
    return results
