"""State-tier benchmark: the partitioned turn log and keyset history pages against the naive
baseline they replace (one unpartitioned table, OFFSET pagination), measured in the same run on
the same data.

Run through the dev stack (it provides PostgreSQL and Redis)::

    python -m chatsite.devstack exec -- python -m bench.state_bench [--appends 2000] [--pages 150]

Setup: a scratch database ``chat_bench_state_<pid>`` on the same PostgreSQL server (created and
migrated here, dropped at the end, also on Ctrl-C). In it, 1,000,000 turns over the 12 monthly
partitions before the current month (one ``INSERT ... SELECT generate_series``): 900
conversations of 1,000 turns each spread over the year, and one long conversation of 100,000
turns (a turn every ~5 minutes all year). The baseline, ``turn_flat``, is a plain copy of the
same rows with the same indexes (key ``turn_id``, as before migration 0004).

Sections (each a function ``section_*(bench) -> dict``, run in order by ``SECTIONS``):

1. Turn append, one transaction each, interleaved: the same INSERT into the partitioned log (the
   row goes to this month's partition) and into ``turn_flat``; and the real service path
   ``services.turn_append_user`` (lock the conversation, insert, update it) on the partitioned
   log.
2. History page of 50 turns deep in the long conversation (cursor at a random depth in its
   older half), interleaved: keyset SQL on the partitioned log (with turn_page's created_at
   bounds, so PostgreSQL prunes partitions); the real selector ``page_selectors.turn_page``; keyset on
   ``turn_flat`` (pagination without partitioning); OFFSET on ``turn_flat`` (the naive baseline).
3. The first history page (newest 50 turns) from the Redis hot cache ``conv:{id}`` vs the same
   page read from PostgreSQL, and the real selector on a warm entry vs right after eviction
   (``section_history_cache``).

The setup (the scratch database, the data) is bench/state_setup.py. Results: stdout and
``var/bench/state_bench.json``. Latencies are wall-clock per operation as
this client sees it (psycopg over the local socket), in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from bench.state_setup import (
    LONG_ID,
    LONG_TURNS,
    OUT_PATH,
    PAGE,
    TOTAL_TURNS,
    TURN_SELECT,
    Bench,
    data_build,
    database_create,
    database_drop,
    django_start,
    log,
    scratch_urls,
    summary,
)  # fmt: skip

# --- section 1: turn append ------------------------------------------------------------------


def section_append(bench: Bench) -> dict:
    """Turn append p50/p99: the same one-row INSERT (own transaction) into the partitioned log
    and into the flat copy, interleaved; then the service path on the partitioned log."""
    from django.db import connection  # noqa: PLC0415

    from conversations import services  # noqa: PLC0415
    from conversations.models import Conversation  # noqa: PLC0415

    rng = random.Random(1)
    sql = (
        "INSERT INTO {table} (turn_id, role, content, token_count, status, moderation_verdict, "
        "created_at, conversation_id, context_trimmed) "
        "VALUES (gen_random_uuid(), 'user', %s, 9, 'complete', '{{}}', now(), %s, 0)"
    )
    timings: dict[str, list[float]] = {"partitioned": [], "flat": []}
    with connection.cursor() as cursor:
        for i in range(bench.appends):
            conversation_id = rng.choice(bench.small_ids)
            order = ("partitioned", "flat") if i % 2 == 0 else ("flat", "partitioned")
            for kind in order:
                table = "conversations_turn" if kind == "partitioned" else "turn_flat"
                start = time.perf_counter()
                cursor.execute(sql.format(table=table), [f"appended {i}", conversation_id])
                timings[kind].append(time.perf_counter() - start)
    service: list[float] = []
    conversations = list(Conversation.objects.filter(pk__in=bench.small_ids[:50]))
    for i in range(max(bench.appends // 4, 50)):
        conversation = conversations[i % len(conversations)]
        start = time.perf_counter()
        services.turn_append_user(conversation=conversation, content=f"service append {i}")
        service.append(time.perf_counter() - start)
    result = {
        "append_insert_partitioned": summary(timings["partitioned"]),
        "append_insert_flat_baseline": summary(timings["flat"]),
        "append_service_partitioned": summary(service),
    }
    result["append_ratio_p50_flat_over_partitioned"] = round(
        result["append_insert_flat_baseline"]["p50_ms"]
        / result["append_insert_partitioned"]["p50_ms"], 2
    )  # fmt: skip
    result["append_ratio_p99_flat_over_partitioned"] = round(
        result["append_insert_flat_baseline"]["p99_ms"]
        / result["append_insert_partitioned"]["p99_ms"], 2
    )  # fmt: skip
    return result


# --- section 2: history page from PostgreSQL ---------------------------------------------------


def section_history_postgres(bench: Bench) -> dict:
    """History page of 50, deep in the long conversation: keyset (partitioned, pruned) vs
    OFFSET (flat), plus keyset on flat and the real selector; interleaved, random depths in the
    older half of the conversation (the same depths for every variant)."""
    from django.db import connection  # noqa: PLC0415
    from django.test.utils import CaptureQueriesContext  # noqa: PLC0415

    from conversations import page_selectors  # noqa: PLC0415
    from conversations.models import Conversation  # noqa: PLC0415

    rng = random.Random(2)
    conversation = Conversation.objects.get(pk=LONG_ID)
    lowest, highest = page_selectors._turn_time_range(conversation)
    keyset = (
        "SELECT {columns} FROM {table} WHERE conversation_id = %s {bounds} "
        "AND (created_at, turn_id) < (%s, %s) "
        "ORDER BY created_at DESC, turn_id DESC LIMIT 51"
    )
    offset = (
        f"SELECT {TURN_SELECT} FROM turn_flat WHERE conversation_id = %s "
        "ORDER BY created_at DESC, turn_id DESC OFFSET %s LIMIT 51"
    )
    variants = ("keyset_partitioned", "selector_partitioned", "keyset_flat", "offset_flat")
    timings: dict[str, list[float]] = {v: [] for v in variants}
    with connection.cursor() as cursor:
        for i in range(bench.pages):
            depth = rng.randrange(LONG_TURNS // 2, LONG_TURNS - PAGE)  # turns newer than the page
            cursor_at, cursor_id = bench.long_keys[depth - 1]
            order = list(variants)
            rng.shuffle(order)
            for variant in order:
                start = time.perf_counter()
                if variant == "keyset_partitioned":
                    cursor.execute(
                        keyset.format(
                            columns=TURN_SELECT, table="conversations_turn",
                            bounds="AND created_at >= %s AND created_at <= %s",
                        ),
                        [LONG_ID, lowest, min(highest, cursor_at), cursor_at, cursor_id],
                    )  # fmt: skip
                    rows = cursor.fetchall()
                    first = rows[0][0]
                elif variant == "selector_partitioned":
                    page, _ = page_selectors.turn_page(
                        conversation=conversation, before=(cursor_at, cursor_id), limit=PAGE
                    )
                    first = page[-1].turn_id
                elif variant == "keyset_flat":
                    cursor.execute(
                        keyset.format(columns=TURN_SELECT, table="turn_flat", bounds=""),
                        [LONG_ID, cursor_at, cursor_id],
                    )
                    rows = cursor.fetchall()
                    first = rows[0][0]
                else:
                    cursor.execute(offset, [LONG_ID, depth])
                    rows = cursor.fetchall()
                    first = rows[0][0]
                timings[variant].append(time.perf_counter() - start)
                # Every variant must return the same page (the newest turn below the cursor).
                if str(first) != bench.long_keys[depth][1]:
                    raise AssertionError(f"{variant} returned another page at depth {depth}")
        cursor.execute(
            "EXPLAIN (FORMAT JSON) "
            + keyset.format(
                columns=TURN_SELECT, table="conversations_turn",
                bounds="AND created_at >= %s AND created_at <= %s",
            ),
            [LONG_ID, lowest, min(highest, cursor_at), cursor_at, cursor_id],
        )  # fmt: skip
        (plan,) = cursor.fetchone()[0]
        # The selector's own SQL for that page, as it ran (client-side bound by psycopg).
        with CaptureQueriesContext(connection) as queries:
            page_selectors.turn_page(conversation=conversation, before=(cursor_at, cursor_id), limit=PAGE)
        (selector_sql,) = [q["sql"] for q in queries.captured_queries if '"conversations_turn"' in q["sql"]]
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + selector_sql)
        (selector_plan,) = cursor.fetchone()[0]
    result = {f"history_{v}": summary(t) for v, t in timings.items()}
    # The last page's plan: partitions left after plan-time pruning, and those the ordered
    # Append actually read (it stops once the LIMIT is met; the rest show "never executed").
    result["history_partitions_planned_last_page"] = sorted(_relations(plan["Plan"]))
    result["history_selector_partitions_planned_last_page"] = sorted(
        _relations(selector_plan["Plan"])
    )
    result["history_selector_partitions_read_last_page"] = sorted(
        _relations(selector_plan["Plan"], executed_only=True)
    )
    for q in ("p50_ms", "p99_ms"):
        result[f"history_ratio_{q[:3]}_offset_flat_over_keyset_partitioned"] = round(
            result["history_offset_flat"][q] / result["history_keyset_partitioned"][q], 1
        )
    return result


def _relations(node: dict, executed_only: bool = False) -> set[str]:
    """Tables an EXPLAIN (FORMAT JSON) plan scans (with ANALYZE and ``executed_only``: only
    those whose scan ran at least once)."""
    found = set()
    if "Relation Name" in node and (not executed_only or node.get("Actual Loops", 0) > 0):
        found.add(node["Relation Name"])
    for child in node.get("Plans", []):
        found |= _relations(child, executed_only)
    return found


# ---- section 3: history page from the Redis hot cache ---------------------------------------


def section_history_cache(bench: Bench) -> dict:
    """The first history page (newest 50 turns: what a conversation opens on, and what the hot
    cache holds) from Redis ``conv:{id}`` vs from PostgreSQL, interleaved in random order, over
    200 of the 1,000-turn conversations and the 100,000-turn one:

    - ``cache_hit``: ``cache.history`` on a warm entry (HGETALL + EXPIRE, 50 turns decoded);
    - ``postgres``: ``cache.history_load``, the same History read from PostgreSQL (the
      conversation row + its newest 51 turns from the partitioned log): the no-cache baseline;
    - ``selector_hit``: ``page_selectors.turn_page(before=None)`` with the entry warm (what
      ``GET /v1/conversations/{id}`` runs, held answers merged);
    - ``selector_miss``: the same right after ``DEL conv:{id}`` (PostgreSQL + refill).

    Every variant must return the same 50 turns. The entries are deleted at the end.
    """
    import redis  # noqa: PLC0415
    from django.conf import settings  # noqa: PLC0415

    from conversations import cache, page_selectors  # noqa: PLC0415
    from conversations.models import Conversation  # noqa: PLC0415

    rng = random.Random(3)
    ids = [LONG_ID, *rng.sample(bench.small_ids, 200)]
    conversations = {str(c.pk): c for c in Conversation.objects.filter(pk__in=ids)}
    client = redis.Redis.from_url(settings.REDIS_URL)
    for conversation_id in ids:  # warm every entry
        client.delete(cache.cache_key(conversation_id))
        cache.history(conversation_id)
    variants = ("cache_hit", "postgres", "selector_hit", "selector_miss")
    timings: dict[str, list[float]] = {v: [] for v in variants}
    try:
        for i in range(bench.pages):
            conversation_id = LONG_ID if i % 10 == 0 else rng.choice(ids[1:])
            conversation = conversations[conversation_id]
            order = list(variants)
            rng.shuffle(order)
            pages = {}
            for variant in order:
                if variant == "selector_miss":
                    client.delete(cache.cache_key(conversation_id))
                start = time.perf_counter()
                if variant == "cache_hit":
                    history = cache.history(conversation_id, last_turn_at=conversation.last_turn_at)
                    page = history.newest(PAGE)[0]
                    source = history.source
                elif variant == "postgres":
                    history = cache.history_load(conversation_id)
                    page = history.newest(PAGE)[0]
                    source = history.source
                else:
                    page = page_selectors.turn_page(conversation=conversation, before=None, limit=PAGE)[0]
                    page = page[::-1]
                    source = None
                timings[variant].append(time.perf_counter() - start)
                pages[variant] = [str(t.turn_id) for t in page]
                if variant == "cache_hit" and source != "cache":
                    raise AssertionError(f"cache_hit read {source} for {conversation_id}")
                if variant == "postgres" and source != "postgres":
                    raise AssertionError("postgres variant did not read PostgreSQL")
            if len({tuple(p) for p in pages.values()}) != 1 or len(pages["postgres"]) != PAGE:
                raise AssertionError(f"the variants returned different pages for {conversation_id}")
    finally:
        for conversation_id in ids:
            client.delete(cache.cache_key(conversation_id))
        client.close()
    result = {f"history_cache_{v}": summary(t) for v, t in timings.items()}
    for q in ("p50_ms", "p99_ms"):
        result[f"history_cache_ratio_{q[:3]}_postgres_over_cache"] = round(
            result["history_cache_postgres"][q] / result["history_cache_cache_hit"][q], 2
        )
        result[f"history_cache_ratio_{q[:3]}_selector_miss_over_hit"] = round(
            result["history_cache_selector_miss"][q] / result["history_cache_selector_hit"][q], 2
        )
    return result


SECTIONS = [section_append, section_history_postgres, section_history_cache]


# --- report ------------------------------------------------------------------------------------


def report(bench: Bench) -> str:
    r = bench.results
    lines = [
        f"state bench: {TOTAL_TURNS:,} turns over 12 monthly partitions "
        f"(from {bench.first_month:%Y-%m}); baseline: the same rows in one plain table",
        "",
        f"{'operation':58s} {'n':>6s} {'p50 ms':>9s} {'p99 ms':>9s}",
    ]
    for key, value in r.items():
        if isinstance(value, dict) and "p50_ms" in value:
            lines.append(f"{key:58s} {value['n']:6d} {value['p50_ms']:9.3f} {value['p99_ms']:9.3f}")
    lines.append("")
    for key, value in r.items():
        if not isinstance(value, dict):
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=2000, help="INSERTs per table (default 2000)")
    parser.add_argument("--pages", type=int, default=150, help="history pages per variant (150)")
    args = parser.parse_args(argv)
    bench = Bench(appends=args.appends, pages=args.pages)
    base_url, scratch_url = scratch_urls()
    started = time.monotonic()
    name = database_create(base_url, scratch_url)
    log(f"scratch database {name}")
    try:
        django_start(scratch_url)
        data_build(bench)
        for section in SECTIONS:
            t0 = time.monotonic()
            bench.results.update(section(bench))
            log(f"{section.__name__} in {time.monotonic() - t0:.1f} s")
    finally:
        try:
            from django.db import connections  # noqa: PLC0415

            connections.close_all()
        except Exception:  # noqa: BLE001 - Django may not have started
            pass
        database_drop(base_url, name)
        log(f"dropped {name}")
    bench.results["total_s"] = round(time.monotonic() - started, 1)
    print(report(bench))
    OUT_PATH.parent.mkdir(parents=True, exist_ok=True)
    OUT_PATH.write_text(json.dumps(bench.results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
