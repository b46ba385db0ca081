"""User-memory retrieval with 100,000 facts in the table, and turn TTFT with memory on vs off
(issue 7: "retrieval p99, embedding the query included, under 20 ms with 100,000 facts in the
table, and turn TTFT with memory on within 1.1x of memory off, both in the same run").

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.memory_bench [--facts 100000] [--queries 200]

1. **Retrieval.** A scratch set of users gets ``--facts`` facts in ``memory_usermemory``: one
   target user with 50 real facts embedded by the real all-MiniLM-L6-v2, and filler users whose
   100 facts each carry random unit vectors (embedding 100,000 texts would take the bench
   minutes, and only the table's size and the index matter to the query). Then ``--queries``
   calls of ``memory.selectors.memory_search`` for the target user (query embedding + top-k by
   cosine in PostgreSQL), timed end to end: p50 / p99.
2. **TTFT.** One real vLLM engine; the same questions are answered with the prompt assembled
   with the target user's memory block (retrieval included in the timing) and without it,
   alternating, greedy, 16 answer tokens: TTFT p50 and the ratio on/off.

The scratch users and their facts are deleted at the end. Results: stdout and
``var/bench/memory_bench.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))

FACTS = [
    "prefers metric units", "is learning Rust", "lives in Lyon", "has a grey cat called Pixel",
    "works as a beekeeper", "is vegetarian", "plays the cello", "is training for a marathon",
    "has two daughters", "drives a red bicycle to work", "is allergic to peanuts",
    "speaks Portuguese and French", "reads science fiction", "grows tomatoes and basil",
    "uses Linux at home", "is saving for a trip to Japan", "prefers short answers",
    "studies astronomy at night school", "likes baroque organ music", "is afraid of flying",
]
QUESTIONS = [
    "How far is a 10k run in miles?", "What should I cook tonight?",
    "Any tips for my next holiday?", "How do I keep my garden healthy?",
    "Recommend me a book for the weekend.", "How do I write a loop in my new language?",
]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def seed(facts: int) -> tuple[object, list]:
    """Create the target user (50 real facts) and filler users up to ``facts`` rows."""
    import numpy as np  # noqa: PLC0415
    from django.contrib.auth import get_user_model  # noqa: PLC0415

    from memory.embeddings import embed, embedding_dimension  # noqa: PLC0415
    from memory.models import UserMemory  # noqa: PLC0415

    users = get_user_model().objects
    tag = uuid.uuid4().hex[:8]
    target = users.create_user(username=f"memory-bench-{tag}")
    texts = [f"The user {f}." for f in FACTS] + [f"The user mentioned item {i} of a long list." for i in range(30)]
    vectors = embed(texts)
    UserMemory.objects.bulk_create(
        UserMemory(user=target, text=t, embedding=v, source="manual") for t, v in zip(texts, vectors)
    )
    dim = embedding_dimension()
    rng = np.random.default_rng(7)
    fillers = []
    remaining = facts - len(texts)
    batch: list = []
    index = 0
    while remaining > 0:
        filler = users.create_user(username=f"memory-bench-{tag}-{index}")
        fillers.append(filler)
        index += 1
        count = min(100, remaining)
        raw = rng.standard_normal((count, dim)).astype("float32")
        raw /= np.linalg.norm(raw, axis=1, keepdims=True)
        batch.extend(
            UserMemory(user=filler, text=f"filler fact {j}", embedding=raw[j].tolist(), source="manual")
            for j in range(count)
        )
        remaining -= count
        if len(batch) >= 5000:
            UserMemory.objects.bulk_create(batch)
            batch = []
    if batch:
        UserMemory.objects.bulk_create(batch)
    return target, [target, *fillers]


def retrieval(target, queries: int) -> dict:
    from memory.embeddings import embed_one  # noqa: PLC0415
    from memory.selectors import memory_search  # noqa: PLC0415

    embed_one("warm-up")
    memory_search(user=target, query="warm-up")
    times, first_hits = [], 0
    for i in range(queries):
        question = QUESTIONS[i % len(QUESTIONS)] + f" ({i})"
        started = time.perf_counter()
        found = memory_search(user=target, query=question)
        times.append(time.perf_counter() - started)
        first_hits += bool(found)
    return {
        "queries": queries,
        "p50_ms": statistics.median(times) * 1000,
        "p99_ms": pct(times, 99) * 1000,
        "max_ms": max(times) * 1000,
        "answered": first_hits,
    }


async def ttft(target, rounds: int) -> dict:
    from asgiref.sync import sync_to_async  # noqa: PLC0415
    from django.conf import settings  # noqa: PLC0415

    from inference.engine import GenerationOptions, VllmEngine  # noqa: PLC0415
    from inference.prompts import prompt_assemble  # noqa: PLC0415
    from memory.selectors import memory_block  # noqa: PLC0415

    engine = VllmEngine.from_settings()
    await engine.ensure_started()
    results = {"on": [], "off": []}
    try:
        for i in range(rounds):
            question = QUESTIONS[i % len(QUESTIONS)]
            order = ("on", "off") if i % 2 == 0 else ("off", "on")
            for mode in order:
                started = time.perf_counter()
                memory = ""
                if mode == "on":
                    memory = await sync_to_async(memory_block)(
                        user=target, query=question, encode_tokens=lambda t: len(engine.encode_text(t))
                    )
                ids = prompt_assemble(
                    system_prompt=settings.CHAT_SYSTEM_PROMPT, memory=memory, summary="", exchanges=[],
                    question=question, encode_chat=engine.encode_chat,
                    max_model_len=settings.CHAT_MAX_MODEL_LEN, max_tokens=16,
                ).token_ids  # fmt: skip
                first = None
                async for delta in engine.generate(ids, GenerationOptions(max_tokens=16, temperature=0.0), f"mb-{mode}-{i}"):
                    if delta.text and first is None:
                        first = time.perf_counter() - started
                results[mode].append(first or (time.perf_counter() - started))
    finally:
        engine.shutdown()
    on, off = statistics.median(results["on"]), statistics.median(results["off"])
    return {"rounds": rounds, "on_p50_ms": on * 1000, "off_p50_ms": off * 1000, "ratio": on / off}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    import django  # noqa: PLC0415

    django.setup()
    from django.core.management import call_command  # noqa: PLC0415

    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    target, created = seed(args.facts)
    print(f"seeded {args.facts:,} facts in {time.perf_counter() - started:.1f} s")
    try:
        found = retrieval(target, args.queries)
        timing = asyncio.run(ttft(target, args.rounds))
    finally:
        from django.contrib.auth import get_user_model  # noqa: PLC0415

        get_user_model().objects.filter(pk__in=[u.pk for u in created]).delete()
    print("\nUser memory (issue 7)")
    print(f"  retrieval with {args.facts:,} facts (embedding the query included), {found['queries']} queries:")
    print(f"    p50 {found['p50_ms']:.2f} ms   p99 {found['p99_ms']:.2f} ms   max {found['max_ms']:.2f} ms"
          f"   {'PASS' if found['p99_ms'] < 20 else 'MISS'} (target p99 < 20 ms)")
    print(f"  TTFT p50, memory on vs off ({timing['rounds']} rounds, retrieval included):")
    print(f"    on {timing['on_p50_ms']:.1f} ms   off {timing['off_p50_ms']:.1f} ms   ratio {timing['ratio']:.3f}x"
          f"   {'PASS' if timing['ratio'] <= 1.1 else 'MISS'} (target <= 1.1x)")
    out = VAR / "bench" / "memory_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"retrieval": found, "ttft": timing, "facts": args.facts}, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
