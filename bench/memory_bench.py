"""User memory: retrieval for a user with 1,000 facts among 100,000, and turn TTFT with memory
on vs off for a user's later conversations and turns (issue 19 part 3: "memory on/off TTFT, a
user's second and later conversations and every later turn: <= 1.05x, medians of >= 8
alternating rounds, the off/off spread printed"; "memory retrieval p99, query embedding
included, 1,000 facts for the user among 100,000: < 20 ms").

Run through the dev stack (``make bench`` runs it)::

    python -m chatsite.devstack exec -- python -m bench.memory_bench [--facts 100000] [--queries 200]

1. **Retrieval** (the overflow path: users whose facts exceed the memory block's budget). A
   scratch set of users gets ``--facts`` facts in ``user_memory``: one target user with 1,000
   facts (50 real ones embedded by the real all-MiniLM-L6-v2, the rest random unit vectors) and
   filler users with 100 facts each of random unit vectors (embedding 100,000 texts would take
   the bench minutes; only the table's size, the user's row count and the index matter to the
   query). Then ``--queries`` calls of ``memory.selectors.memory_search`` for the target user
   (query embedding + top-k by cosine in PostgreSQL), timed end to end: p50 / p99.
2. **Turn TTFT** (the default path: the stored memory block). Through the full stack (uvicorn in
   this process, ``POST /v1/conversations/{id}/turns``, the real engine; bench/harness.py's
   server): a user with 20 real facts (their block within ``CHAT_MEMORY_MAX_TOKENS``, rebuilt
   and warmed into the prefix cache as a Celery task would, through this server's own
   endpoint). After a warm-up conversation each way, ``--rounds`` rounds alternate memory off
   and on (``CHAT_MEMORY_ENABLED``, read per turn): off, on, off, on, ...; each round is a new
   conversation of the user (their second and later ones) with ``--turns`` turns, 16 answer
   tokens each. Medians of every turn's TTFT per side, the on/off ratio, and the same for the
   conversations' first turns alone; the off/off spread (the off rounds split into two halves,
   odd and even, their medians' ratio) is the run's noise floor.

3. **Extraction** (issue 28 part 4): the labelled conversations of bench/memory_sets/ (a tuning
   part and a held-out part, reported apart) stored as real turns and run through
   ``memory.extraction.conversation_memory_extract`` (bench/memory_extraction.py): precision,
   recall, facts not grounded in a user message, and conversations that must yield nothing
   but stored something. Targets: precision >= 0.9, recall >= 0.7, ungrounded 0.
4. **Memory on an irrelevant turn**: prompt tokens memory adds to "Say the word yes." for a
   user with the 20 facts above and a name and diet (target <= 40).

``--parts`` picks some (default all). The scratch users and their facts are deleted at the end. Results: stdout and
``var/bench/memory_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from bench.harness import percentile

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))

FACTS = [
    "prefers metric units",
    "is learning Rust",
    "lives in Lyon",
    "has a grey cat called Pixel",
    "works as a beekeeper",
    "is vegetarian",
    "plays the cello",
    "is training for a marathon",
    "has two daughters",
    "drives a red bicycle to work",
    "is allergic to peanuts",
    "speaks Portuguese and French",
    "reads science fiction",
    "grows tomatoes and basil",
    "uses Linux at home",
    "is saving for a trip to Japan",
    "prefers short answers",
    "studies astronomy at night school",
    "likes baroque organ music",
    "is afraid of flying",
]
QUESTIONS = [
    "How far is a 10k run in miles?",
    "How do I keep my garden healthy?",
    "Any tips for my next holiday?",
    "How do I keep my garden healthy?",
    "Recommend me a book for the weekend.",
    "How do I write a loop in my new language?",
]


TARGET_FACTS = 1_000  # the target user's facts (issue 19's row), of them 50 real ones


def seed(facts: int) -> tuple[object, list]:
    """Create the target user (``TARGET_FACTS`` facts: 50 real, the rest random unit vectors)
    and filler users up to ``facts`` rows."""
    import numpy as np  # noqa: PLC0415
    from django.contrib.auth import get_user_model  # noqa: PLC0415

    from inference.embeddings import embed, embedding_dimension  # noqa: PLC0415
    from memory.models import UserMemory  # noqa: PLC0415

    users = get_user_model().objects
    tag = uuid.uuid4().hex[:8]
    target = users.create_user(username=f"memory-bench-{tag}")
    texts = [f"The user {f}." for f in FACTS] + [
        f"The user mentioned item {i} of a long list." for i in range(30)
    ]
    vectors = embed(texts)
    UserMemory.objects.bulk_create(
        UserMemory(user=target, text=t, embedding=v, source="manual")
        for t, v in zip(texts, vectors)
    )
    dim = embedding_dimension()
    rng = np.random.default_rng(7)
    extra = rng.standard_normal((TARGET_FACTS - len(texts), dim)).astype("float32")
    extra /= np.linalg.norm(extra, axis=1, keepdims=True)
    UserMemory.objects.bulk_create(
        UserMemory(
            user=target,
            text=f"target filler fact {j}",
            embedding=extra[j].tolist(),
            source="manual",
        )
        for j in range(len(extra))
    )
    remaining = facts - TARGET_FACTS
    # Filler accounts in one statement (create_user would hash a password per account).
    model = get_user_model()
    fillers = model.objects.bulk_create(
        model(username=f"memory-bench-{tag}-{i}", password="!")
        for i in range((remaining + 99) // 100)
    )
    # Building the HNSW index once over the loaded table is far cheaper than inserting 100,000
    # rows into it one by one (minutes on 2 cores): drop it for the load, build it after.
    from django.db import connection  # noqa: PLC0415

    hnsw = next(i for i in UserMemory._meta.indexes if i.name == "user_memory_embedding_hnsw")
    with connection.schema_editor() as editor:
        editor.remove_index(UserMemory, hnsw)
    batch: list = []
    for filler in fillers:
        count = min(100, remaining)
        raw = rng.standard_normal((count, dim)).astype("float32")
        raw /= np.linalg.norm(raw, axis=1, keepdims=True)
        batch.extend(
            UserMemory(
                user=filler, text=f"filler fact {j}", embedding=raw[j].tolist(), source="manual"
            )
            for j in range(count)
        )
        remaining -= count
        if len(batch) >= 5000:
            UserMemory.objects.bulk_create(batch)
            batch = []
    if batch:
        UserMemory.objects.bulk_create(batch)
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '512MB'")
    with connection.schema_editor() as editor:
        editor.add_index(UserMemory, hnsw)
    return target, [target, *fillers]


def retrieval(target, queries: int) -> dict:
    from inference.embeddings import embed_one  # noqa: PLC0415
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
        "p50_ms": percentile(times, 50) * 1000,
        "p99_ms": percentile(times, 99) * 1000,
        "max_ms": max(times) * 1000,
        "answered": first_hits,
    }


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")


def ttft(rounds: int, turns: int) -> dict:
    """Turn TTFT through the full stack (uvicorn, the /v1 turn endpoint, the real engine) with
    memory on vs off (settings.CHAT_MEMORY_ENABLED, read per turn), in alternating rounds of a
    new conversation with ``turns`` turns each; the bench user has the 20 real facts in a stored,
    warmed memory block. The harness's in-process server and API client (bench/harness.py,
    bench/clients.py)."""
    from django.conf import settings  # noqa: PLC0415

    from bench.clients import Api  # noqa: PLC0415
    from bench.harness import InProcessServer  # noqa: PLC0415
    from chatsite.celery import app  # noqa: PLC0415
    from memory import services as memory_services  # noqa: PLC0415
    from memory.blocks import memory_block_current  # noqa: PLC0415

    server = InProcessServer()
    server.start()
    api = Api(server.url, prefix="memorybench", key_name="memory bench")
    saved = settings.CHAT_MEMORY_ENABLED, settings.CHAT_INTERNAL_API_URL, app.conf.task_always_eager
    # mode -> round -> [(turn index in its conversation, TTFT s)]
    samples: dict[str, dict[int, list[tuple[int, float]]]] = {"on": {}, "off": {}}
    errors = 0
    try:
        # The rebuild and its warm-up run here, as a worker would run them after the commit,
        # and reach the model through this server (the service credential, background priority).
        settings.CHAT_INTERNAL_API_URL = server.url
        app.conf.task_always_eager = True
        memory_services.memory_add(user=api.user, texts=[f"The user {f}." for f in FACTS])
        block = memory_block_current(user_id=api.user.pk)
        for i, mode in enumerate(("off", "on")):  # the user's first conversations, one each way
            settings.CHAT_MEMORY_ENABLED = mode == "on"
            api.turn(QUESTIONS[i], 16, "warm", -1, i)
        for r in range(rounds * 2):
            mode = ("off", "on")[r % 2]
            settings.CHAT_MEMORY_ENABLED = mode == "on"
            conversation_id = None
            for k in range(turns):
                index = (r // 2 * turns + k) % len(QUESTIONS)
                sample = api.turn(
                    QUESTIONS[index], 16, mode, r, index, conversation_id=conversation_id
                )
                conversation_id = api.last_conversation
                if sample.error is None and sample.ttft_s is not None:
                    samples[mode].setdefault(r // 2, []).append((k, sample.ttft_s))
                else:
                    errors += 1
    finally:
        settings.CHAT_MEMORY_ENABLED, settings.CHAT_INTERNAL_API_URL, app.conf.task_always_eager = (
            saved
        )
        api.close()
        server.stop()

    def pick(mode: str, rounds_of=lambda r: True, first_only: bool = False) -> list[float]:
        return [t for r, values in samples[mode].items() if rounds_of(r)
                for k, t in values if not first_only or k == 0]  # fmt: skip

    on, off = _median_ms(pick("on")), _median_ms(pick("off"))
    on_first, off_first = (
        _median_ms(pick("on", first_only=True)),
        _median_ms(pick("off", first_only=True)),
    )
    off_a, off_b = (
        _median_ms(pick("off", lambda r: r % 2 == 0)),
        _median_ms(pick("off", lambda r: r % 2 == 1)),
    )
    return {
        "rounds": rounds,
        "turns_per_conversation": turns,
        "errors": errors,
        "turns": sum(len(v) for mode in samples.values() for v in mode.values()),
        "on_p50_ms": on,
        "off_p50_ms": off,
        "ratio": on / off,
        "on_first_turn_p50_ms": on_first,
        "off_first_turn_p50_ms": off_first,
        "first_turn_ratio": on_first / off_first,
        "off_halves_p50_ms": [off_a, off_b],
        "off_off_spread": max(off_a, off_b) / min(off_a, off_b) - 1,
        "block_tokens": block.token_count,
        "block_overflow": block.overflow,
        "block_budget": block.budget,
    }


def extraction_part() -> dict:
    """Part 3: both labelled sets through the real extraction path; printed and returned."""
    from django.contrib.auth import get_user_model  # noqa: PLC0415

    from bench.memory_extraction import run_real, score  # noqa: PLC0415
    from bench.memory_sets import dev, heldout  # noqa: PLC0415

    users = get_user_model().objects
    out = {}
    print("\nMemory extraction (issue 28), the real extraction path, labelled conversations:")
    for name, conversations in (("tuning", dev.CONVERSATIONS), ("held-out", heldout.CONVERSATIONS)):
        started = time.perf_counter()
        result = score(conversations, run_real(conversations, user_factory=lambda u: users.create_user(username=u)))
        elapsed = time.perf_counter() - started
        verdict = "PASS" if result.precision >= 0.9 and result.recall >= 0.7 and result.ungrounded == 0 else "MISS"
        print(
            f"  {name}: {len(conversations)} conversations, {result.stored} facts stored, "
            f"{result.expected} expected  precision {result.precision:.2f}  recall {result.recall:.2f}  "
            f"ungrounded {result.ungrounded}  none-sets storing {result.none_sets_storing}/{result.none_sets}  "
            f"{verdict} (targets P >= 0.9, R >= 0.7, ungrounded 0; {elapsed:.1f} s)"
        )
        for cid, text in result.wrong:
            print(f"    not accepted: [{cid}] {text}")
        for cid, keys in result.missed:
            print(f"    missed: [{cid}] {' '.join(keys)}")
        out[name] = {
            "conversations": len(conversations), "stored": result.stored, "expected": result.expected,
            "precision": result.precision, "recall": result.recall, "ungrounded": result.ungrounded,
            "none_sets": result.none_sets, "none_sets_storing": result.none_sets_storing,
        }  # fmt: skip
    return out


def irrelevant_turn_part() -> dict:
    """Part 4: prompt tokens memory adds to an irrelevant turn, through the turn's own prompt
    assembly (conversations.plan: memory block, alignment, relevant facts), with the tokenizer
    only (no engine started). Printed and returned."""
    from django.contrib.auth import get_user_model  # noqa: PLC0415

    from bench.memory_prompt import memory_prompt_tokens  # noqa: PLC0415
    from memory.services import FactIn, memory_facts_store  # noqa: PLC0415

    user = get_user_model().objects.create_user(username=f"memory-bench-irr-{uuid.uuid4().hex[:8]}")
    try:
        memory_facts_store(user=user, facts=[FactIn(f"The user {f}.") for f in FACTS])
        memory_facts_store(user=user, facts=[
            FactIn("The user's name is Ada.", slot="name"), FactIn("The user is vegetarian.", slot="diet"),
        ])  # fmt: skip
        measured = {q: memory_prompt_tokens(user=user, question=q) for q in (
            "Say the word yes.", "What is 17 times 23?", "Explain the causes of World War I.",
            "How do I keep my garden healthy?",
        )}  # fmt: skip
    finally:
        user.delete()
    print("\nMemory in the prompt (issue 28): tokens memory adds to a turn (20 facts + name + diet):")
    worst = 0
    for question, (text_tokens, filler, relevant) in measured.items():
        irrelevant = question != "How do I keep my garden healthy?"
        if irrelevant:
            worst = max(worst, text_tokens + filler)  # the user pays for the filler too
        print(
            f"  {question!r}: {text_tokens + filler} tokens of memory (of them {filler} of KV-block "
            f"alignment filler){'' if irrelevant else f'; relevant facts: {relevant}'}"
        )
    print(f"  irrelevant turns: at most {worst} tokens, filler included   "
          f"{'PASS' if worst <= 40 else 'MISS'} (target <= 40)")
    return {"per_question": {q: list(v[:2]) for q, v in measured.items()}, "irrelevant_max": worst}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--facts", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--rounds", type=int, default=8, help="rounds each way (off, on, off, on, ...)"
    )
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument(
        "--parts", default="retrieval,ttft,extraction,prompt",
        help="comma-separated parts to run: retrieval, ttft, extraction, prompt",
    )
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    import django  # noqa: PLC0415

    django.setup()
    from django.core.management import call_command  # noqa: PLC0415

    call_command("migrate", verbosity=0)
    results: dict = {}
    if "extraction" in parts:
        results["extraction"] = extraction_part()
    if "prompt" in parts:
        results["prompt"] = irrelevant_turn_part()
    if not parts & {"retrieval", "ttft"}:
        out = VAR / "bench" / "memory_bench_judgement.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2))
        print(f"results: {out}")
        return 0
    started = time.perf_counter()
    target, created = seed(args.facts)
    print(f"seeded {args.facts:,} facts in {time.perf_counter() - started:.1f} s")
    try:
        found = retrieval(target, args.queries)
        timing = ttft(args.rounds, args.turns)
    finally:
        from django.contrib.auth import get_user_model  # noqa: PLC0415

        get_user_model().objects.filter(pk__in=[u.pk for u in created]).delete()
    print("\nUser memory (issues 7 and 19)")
    print(
        f"  retrieval for a user with {TARGET_FACTS:,} facts among {args.facts:,} (embedding the query "
        f"included), {found['queries']} queries:"
    )
    print(
        f"    p50 {found['p50_ms']:.2f} ms   p99 {found['p99_ms']:.2f} ms   max {found['max_ms']:.2f} ms"
        f"   {'PASS' if found['p99_ms'] < 20 else 'MISS'} (target p99 < 20 ms)"
    )
    state = (
        "OVER the budget: retrieval"
        if timing["block_overflow"]
        else "within the budget: stored block"
    )
    print(f"  memory block: {timing['block_tokens']} tokens of {timing['block_budget']} ({state})")
    print(
        f"  turn TTFT medians through the full stack, memory on vs off, the user's later conversations"
        f" and turns ({timing['turns']} turns, {timing['rounds']} rounds each way alternating, "
        f"{timing['turns_per_conversation']} turns per conversation, {timing['errors']} errors):"
    )
    print(
        f"    every turn:  on {timing['on_p50_ms']:.1f} ms   off {timing['off_p50_ms']:.1f} ms   "
        f"ratio {timing['ratio']:.3f}x   {'PASS' if timing['ratio'] <= 1.05 else 'MISS'} (target <= 1.05x)"
    )
    print(
        f"    first turns of new conversations:  on {timing['on_first_turn_p50_ms']:.1f} ms   "
        f"off {timing['off_first_turn_p50_ms']:.1f} ms   ratio {timing['first_turn_ratio']:.3f}x"
    )
    a, b = timing["off_halves_p50_ms"]
    print(
        f"    off/off spread (noise floor): {timing['off_off_spread'] * 100:.1f}% "
        f"(odd off rounds {a:.1f} ms, even {b:.1f} ms)"
    )
    out = VAR / "bench" / "memory_bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"retrieval": found, "ttft": timing, "facts": args.facts, **results}, indent=2))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
