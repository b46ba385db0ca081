"""A bare-engine decode probe: one vLLM ``AsyncLLM`` on the shipped model, no gateway, to see a
lever's effect on prefill and decode alone (issue 19 part 2; the full-stack numbers are
bench/engine_bench.py's).

    python -m bench.decode_probe [--rounds 6] [--concurrency 1] [--kernels on|off] [--compile]

Each round sends ``--concurrency`` requests at once, each a 200-token prompt (the chat template
included) and 128 greedy tokens (ignore_eos), and prints the median TTFT and TPOT of the round;
the first round includes the engine's first-generation cost. ``--kernels`` switches the CPU
RMSNorm kernels (inference/vllm_plugin.py) on or off; ``--compile`` starts the engine without
``enforce_eager`` (torch.compile; its cold start is printed). No Django, no database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "var", "models",
                     "SmolLM2-135M-Instruct")  # fmt: skip
TEXT = ("Explain in detail how a bicycle works, covering the frame, wheels, gears, brakes and how "
        "the rider balances. ") * 8  # fmt: skip


async def probe(args) -> None:
    from vllm import AsyncEngineArgs, SamplingParams  # noqa: PLC0415
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: PLC0415

    extra = {}
    if args.kernels == "on":
        from inference import vllm_plugin  # noqa: PLC0415

        vllm_plugin.register()
        extra["ir_op_priority"] = {op: [vllm_plugin.PROVIDER] for op in vllm_plugin.OPS}
    engine_args = AsyncEngineArgs(
        model=args.model, tokenizer=args.model, dtype="bfloat16", enforce_eager=not args.compile,
        max_model_len=4096, max_num_seqs=24, kv_cache_memory_bytes=1 << 30, disable_log_stats=True,
        scheduling_policy="priority", enable_prefix_caching=True, **extra,
    )  # fmt: skip
    started = time.perf_counter()
    llm = AsyncLLM.from_engine_args(engine_args)
    print(f"engine start {time.perf_counter() - started:.1f} s (kernels {args.kernels}, "
          f"{'compiled' if args.compile else 'eager'})", flush=True)  # fmt: skip
    tokenizer = llm.get_tokenizer()
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": TEXT}],
                                             add_generation_prompt=True, tokenize=False)  # fmt: skip
    ids = tokenizer(rendered)["input_ids"][:200]

    async def one(salt: int) -> tuple[float, float]:
        # A different token near the end of each prompt: no request reuses another's prefill.
        prompt = ids[:-5] + [ids[-5] + salt] + ids[-4:]
        params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
        sent, times = time.perf_counter(), []
        async for _ in llm.generate({"prompt_token_ids": prompt}, params, request_id=str(uuid.uuid4())):
            times.append(time.perf_counter())
        return times[0] - sent, (times[-1] - times[0]) / (len(times) - 1)

    try:
        for round_ in range(args.rounds):
            results = await asyncio.gather(*[one(round_ * 100 + i) for i in range(args.concurrency)])
            ttft = statistics.median(r[0] for r in results) * 1000
            tpot = statistics.median(r[1] for r in results) * 1000
            print(f"round {round_}: TTFT {ttft:.1f} ms, TPOT {tpot:.2f} ms "
                  f"(load {os.getloadavg()[0]:.2f})", flush=True)  # fmt: skip
    finally:
        llm.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.decode_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--kernels", choices=("on", "off"), default="on")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--model", default=MODEL)
    asyncio.run(probe(parser.parse_args()))


if __name__ == "__main__":  # vLLM spawns its engine processes: nothing may run on import
    main()
