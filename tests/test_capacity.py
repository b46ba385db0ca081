"""Fleet sizing (inference/capacity.py, ``python manage.py capacity``) and the engine bench's
sweep workload it reads (bench/engine_workload.py, bench/engine_runs.py)."""

from __future__ import annotations

import json
import struct
import uuid
import zlib
from fractions import Fraction
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from bench.engine_runs import sweep_row
from bench.engine_workload import sweep_plans
from conversations import held, turnlog
from core import redis_guard
from inference import capacity
from inference.capacity import CapacityError, EngineNode, Workload

DESIGN_ARGS = [
    "--users", "1000000", "--turns-per-minute", "1", "--prompt-tokens", "500",
    "--completion-tokens", "800", "--decode-tokens-per-s", "50", "--slots-per-node", "8",
]  # fmt: skip


def row(
    concurrency: int, tokens_per_s: float, tpot_p99_ms: float, ttft_p99_ms: float, errors: int = 0
) -> dict:
    return {"concurrency": concurrency, "tokens_per_s": tokens_per_s, "tpot_p50_ms": tpot_p99_ms,
            "tpot_p99_ms": tpot_p99_ms, "ttft_p50_ms": ttft_p99_ms, "ttft_p99_ms": ttft_p99_ms,
            "turns": 2 * concurrency, "errors": errors, "prompt_tokens_mean": 200}  # fmt: skip


# Shaped like this machine's run: the targets hold up to 4 streams (TTFT) in one, and 8 breaks
# TPOT; 16 holds TPOT in this made-up row but failed a turn, so it does not count.
SWEEP = [row(1, 18.0, 51, 270), row(2, 35.0, 55, 310), row(4, 60.0, 61, 730),
         row(8, 114.0, 90, 900), row(16, 200.0, 70, 700, errors=1)]  # fmt: skip


def run_command(*args, **kwargs) -> str:
    out = StringIO()
    call_command("capacity", *args, stdout=out, **kwargs)
    return out.getvalue()


@pytest.fixture
def bench_files(tmp_path):
    """An engine bench JSON with SWEEP and a stream bench JSON whose largest passing N is 1,500."""
    engine = tmp_path / "engine_bench.json"
    engine.write_text(json.dumps({"created": "2026-12-02T17:55:33", "sweep": SWEEP}))
    stream = tmp_path / "stream_bench.json"
    stream.write_text(json.dumps({"largest_n_passing": 1500, "trials": []}))
    return engine, stream


# --- the arithmetic -----------------------------------------------------------------------------


def test_the_design_briefs_example_needs_33334_decode_nodes():
    """Given 10^6 users x 1 turn/min, 800-token answers, 50 tokens/s per slot, 8 slots; then
    10^6/60 turns/s x 16 s / 8 = 33,333.3 rounds up to 33,334 nodes."""
    sizing = capacity.size(
        Workload(users=1_000_000, turns_per_minute=Fraction(1), prompt_tokens=500,
                 completion_tokens=800),
        EngineNode(slots=8, stream_tokens_per_s=Fraction(50), source="given"),
        streams_per_gateway=None, stream_ttl_s=3600,
    )  # fmt: skip
    assert sizing.turns_per_s == Fraction(1_000_000, 60)
    assert sizing.decode_s_per_turn == 16
    assert sizing.engine_nodes == 33_334


def test_a_whole_number_of_nodes_is_not_rounded_up_and_any_fraction_is():
    """60 users x 1 turn/min = 1 turn/s; 100 tokens at 50 tokens/s = 2 s -> 2 streams: exactly
    1 node of 2 slots; one more user needs a second node; 0.1-turn steps stay exact."""
    node = EngineNode(slots=2, stream_tokens_per_s=Fraction(50), source="given")

    def nodes(users: int, turns_per_minute="1") -> int:
        workload = Workload(users=users, turns_per_minute=Fraction(turns_per_minute),
                            prompt_tokens=0, completion_tokens=100)  # fmt: skip
        return capacity.size(workload, node, streams_per_gateway=None, stream_ttl_s=0).engine_nodes

    assert nodes(60) == 1
    assert nodes(61) == 2
    assert nodes(600, "0.1") == 1  # 0.1 x 600 = 60 turns/min, exactly


def test_slots_are_the_largest_concurrency_where_both_targets_hold():
    """4 holds both (8 breaks TPOT, 16 failed a turn); with a 2 s TTFT target nothing changes
    (8 still breaks TPOT); with a 100 ms TPOT target 8 holds."""
    assert capacity.slots_where_targets_hold(SWEEP)["concurrency"] == 4
    assert capacity.slots_where_targets_hold(SWEEP, ttft_p99_ms=2000)["concurrency"] == 4
    assert capacity.slots_where_targets_hold(SWEEP, tpot_p99_ms=100)["concurrency"] == 4
    assert (
        capacity.slots_where_targets_hold(SWEEP, tpot_p99_ms=100, ttft_p99_ms=1000)["concurrency"]
        == 8
    )
    assert capacity.slots_where_targets_hold(SWEEP, ttft_p99_ms=200) is None


def test_the_measured_machine_gives_slots_and_the_per_stream_rate_there():
    node = capacity.node_from_sweep(SWEEP, source="fixture")
    assert node.slots == 4
    assert node.stream_tokens_per_s == Fraction(15)  # 60 tokens/s over 4 streams
    sizing = capacity.size(
        Workload(users=600, turns_per_minute=Fraction(1), prompt_tokens=200,
                 completion_tokens=150),
        node, streams_per_gateway=None, stream_ttl_s=60,
    )  # fmt: skip
    # 10 turns/s x (150 / 15 = 10 s) = 100 streams / 4 slots = 25 nodes.
    assert sizing.engine_nodes == 25


def test_gateways_postgres_and_redis_follow_the_turn_rate():
    """1 turn/s, 100-token answers at 50 tokens/s (2 s) + 1 s to the first token = 3 open
    streams; 2 per gateway -> 2 gateways; 5 rows and 3 commits a turn; logs kept 2 s decode +
    10 s TTL = 12 turns' logs; held answers 4 s x 1 turn/s."""
    sizing = capacity.size(
        Workload(users=60, turns_per_minute=Fraction(1), prompt_tokens=0, completion_tokens=100),
        EngineNode(slots=1, stream_tokens_per_s=Fraction(50), source="given"),
        streams_per_gateway=2, stream_ttl_s=10, ttft_allowance_s=1, writeback_s=4,
    )  # fmt: skip
    assert sizing.sse_streams == 3
    assert sizing.gateways == 2
    assert sizing.postgres_writes_per_s == 5
    assert sizing.postgres_commits_per_s == 3
    assert sizing.logs_retained == 12
    per_log = 101 * capacity.LOG_BYTES_PER_EVENT + capacity.LOG_BYTES_PER_TURN
    assert sizing.log_bytes == 12 * per_log
    assert sizing.held_bytes == 4 * (capacity.HELD_BYTES_PER_ANSWER
                                     + 100 * capacity.TEXT_BYTES_PER_TOKEN)  # fmt: skip


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"users": 0}, "--users"),
        ({"users": -5}, "--users"),
        ({"turns_per_minute": Fraction(0)}, "--turns-per-minute"),
        ({"completion_tokens": 0}, "--completion-tokens"),
        ({"prompt_tokens": -1}, "--prompt-tokens"),
    ],
)
def test_a_workload_that_cannot_be_sized_says_which_input(fields, message):
    good = {"users": 10, "turns_per_minute": Fraction(1), "prompt_tokens": 10,
            "completion_tokens": 10}  # fmt: skip
    with pytest.raises(CapacityError, match=message):
        Workload(**{**good, **fields})


# --- the sweep workload ---------------------------------------------------------------------------


def test_a_sweep_level_keeps_that_many_users_in_flight_with_distinct_prompts():
    plans = sweep_plans(4, 2, [f"prompt {i}" for i in range(8)], 64)
    assert [p.arrival_s for p in plans] == [0.0] * 4
    contents = [t.content for p in plans for t in p.turns]
    assert len(set(contents)) == 8
    assert {t.max_tokens for p in plans for t in p.turns} == {64}
    assert {t.think_s for p in plans for t in p.turns} == {0.0}


def test_a_sweep_row_is_in_ms_and_keeps_missing_values_missing():
    summary = {"tokens_per_s": 42.0, "tpot_p50_s": 0.05, "tpot_p99_s": 0.0612, "ttft_p50_s": 0.2,
               "ttft_p99_s": None, "turns": 4, "errors": 0, "completion_tokens": 256,
               "wall_s": 6.1, "prompt_tokens_mean": 199.0}  # fmt: skip
    got = sweep_row(2, summary)
    assert got["concurrency"] == 2
    assert got["tpot_p99_ms"] == 61.2
    assert got["ttft_p99_ms"] is None
    assert capacity.slots_where_targets_hold([got]) is None  # no TTFT: cannot say it holds


# --- the command --------------------------------------------------------------------------------


def test_the_command_prints_the_design_example_with_its_steps(bench_files):
    engine, stream = bench_files
    out = run_command(*DESIGN_ARGS, "--engine-bench", str(engine), "--stream-bench", str(stream))
    assert "33,334 decode nodes" in out
    assert "1,000,000 users x 1 / 60 s" in out
    assert "800 tokens / 50 tokens/s = 16 s" in out
    assert "ceil(266,666.7 / 8 slots) = 33,334" in out
    # 16,666.7 turns/s x 16.8 s = 280,000 streams / 1,500 per process -> 187 gateways.
    assert "= 187  (measured:" in out
    assert "83,333.3 rows/s" in out


def test_the_command_sizes_the_measured_machine_from_the_bench_json(bench_files):
    engine, stream = bench_files
    out = json.loads(run_command(
        "--users", "600", "--turns-per-minute", "1", "--prompt-tokens", "200",
        "--completion-tokens", "150", "--engine-bench", str(engine), "--stream-bench", str(stream),
        "--json",
    ))  # fmt: skip
    assert out["node"]["slots"] == 4
    assert out["node"]["stream_tokens_per_s"] == 15.0
    assert out["engine_nodes"] == 25
    assert out["streams_per_gateway"] == 1500
    assert out["sources"]["node"].startswith("measured:")


def test_without_engine_inputs_or_a_bench_json_the_command_says_what_to_run(tmp_path):
    with pytest.raises(CommandError, match="bench.engine_bench --parts sweep"):
        run_command(
            "--users",
            "10",
            "--turns-per-minute",
            "1",
            "--prompt-tokens",
            "10",
            "--completion-tokens",
            "10",
            "--engine-bench",
            str(tmp_path / "none.json"),
        )


def test_half_a_node_description_is_refused(bench_files):
    engine, _ = bench_files
    with pytest.raises(CommandError, match="both --decode-tokens-per-s and --slots-per-node"):
        run_command("--users", "10", "--turns-per-minute", "1", "--prompt-tokens", "10",
                    "--completion-tokens", "10", "--decode-tokens-per-s", "50",
                    "--engine-bench", str(engine))  # fmt: skip


def test_zero_users_is_a_command_error(bench_files):
    engine, _ = bench_files
    with pytest.raises(CommandError, match="--users must be a positive"):
        run_command(
            "--users",
            "0",
            "--turns-per-minute",
            "1",
            "--prompt-tokens",
            "10",
            "--completion-tokens",
            "10",
            "--engine-bench",
            str(engine),
        )


def test_a_machine_where_no_level_holds_the_targets_is_a_command_error(tmp_path):
    engine = tmp_path / "slow.json"
    engine.write_text(json.dumps({"sweep": [row(1, 5.0, 200, 3000)]}))
    with pytest.raises(CommandError, match="cannot serve the targets"):
        run_command(
            "--users",
            "10",
            "--turns-per-minute",
            "1",
            "--prompt-tokens",
            "10",
            "--completion-tokens",
            "10",
            "--engine-bench",
            str(engine),
        )


@pytest.mark.parametrize(
    "content, message",
    [
        ({"sweep": [{"tokens_per_s": 10}]}, "positive integer concurrency"),
        ({"sweep": {"1": {}}}, "positive integer concurrency"),
        ("not json", "not readable JSON"),
    ],
)
def test_a_malformed_engine_bench_json_is_a_command_error(tmp_path, content, message):
    engine = tmp_path / "odd.json"
    engine.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(CommandError, match=message):
        run_command(
            "--users",
            "10",
            "--turns-per-minute",
            "1",
            "--prompt-tokens",
            "10",
            "--completion-tokens",
            "10",
            "--engine-bench",
            str(engine),
        )


def test_a_turn_rate_that_is_not_a_number_is_a_command_error(bench_files):
    engine, _ = bench_files
    with pytest.raises(CommandError, match="is not a number"):
        run_command(
            "--users",
            "10",
            "--turns-per-minute",
            "1/0",
            "--prompt-tokens",
            "10",
            "--completion-tokens",
            "10",
            "--engine-bench",
            str(engine),
        )


def test_the_plot_is_a_png_of_the_sweep(bench_files, tmp_path):
    engine, stream = bench_files
    path = tmp_path / "plots" / "sweep.png"
    out = run_command(*DESIGN_ARGS, "--engine-bench", str(engine), "--stream-bench",
                      str(stream), "--plot", str(path))  # fmt: skip
    assert f"plot: {path}" in out
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (840, 504)  # 7 x 4.2 in at 120 dpi
    # A real image: its compressed pixel data inflates, and is not one flat colour.
    idat = b""
    pos = 8
    while pos < len(data):
        length = struct.unpack(">I", data[pos : pos + 4])[0]
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    pixels = zlib.decompress(idat)
    assert len(set(pixels)) > 10


def test_plotting_without_a_sweep_is_a_command_error(tmp_path):
    engine = tmp_path / "nosweep.json"
    engine.write_text(json.dumps({"created": "x"}))
    with pytest.raises(CommandError, match="--plot needs a measured sweep"):
        run_command(*DESIGN_ARGS, "--engine-bench", str(engine), "--plot",
                    str(tmp_path / "p.png"))  # fmt: skip


# --- the Redis bytes the sizing uses, measured on the real writers ---------------------------------

TOKENS = [" the", " cat", " sat", " on", " a", " warm", " mat", " and", " slept", "."]


async def _log_bytes(events: int) -> int:
    """MEMORY USAGE of a real TurnLogWriter's keys after ``events`` token events and a done."""
    answer_id, question_id = uuid.uuid4(), uuid.uuid4()
    writer = turnlog.TurnLogWriter(answer_id, question_id, uuid.uuid4())
    for i in range(1, events + 1):
        writer.append(i, "token", {"text": TOKENS[i % len(TOKENS)]})
    writer.append(events + 1, "done", {"status": "complete", "turn_id": str(answer_id),
                                       "usage": {"prompt_tokens": 500,
                                                 "completion_tokens": events}})  # fmt: skip
    writer.close()
    await writer.wait_flushed()
    client = redis_guard.sync_client()
    keys = (turnlog.stream_key(answer_id), turnlog.question_key(question_id),
            turnlog.owner_key(answer_id))  # fmt: skip
    try:
        assert client.xlen(keys[0]) == events + 1
        return sum(client.memory_usage(k, samples=0) for k in keys)
    finally:
        client.delete(*keys)


async def test_redis_bytes_per_event_match_a_real_turn_log():
    """The constants the Redis sizing uses are within 25% of a real turn log's MEMORY USAGE,
    for a short and a long answer."""
    got = {}
    for events in (100, 800):
        measured = await _log_bytes(events)
        modelled = (
            events + capacity.LOG_EXTRA_EVENTS_PER_TURN
        ) * capacity.LOG_BYTES_PER_EVENT + capacity.LOG_BYTES_PER_TURN
        print(f"turn log of {events} token events: measured {measured} B, modelled {modelled} B")
        got[events] = (measured, modelled)
    for events, (measured, modelled) in got.items():
        assert 0.75 <= modelled / measured <= 1.25, (events, measured, modelled)


def test_held_answer_bytes_match_real_held_records():
    """100 held answers (conversations/held.py, as the write-back holds them) of 800 and of 10
    tokens of ~4-byte text: Redis's used_memory grows by what the sizing says, within 25%."""
    client = redis_guard.sync_client()
    for tokens in (10, 800):
        content = "".join(TOKENS[i % len(TOKENS)] for i in range(tokens))
        conversation_id = uuid.uuid4()
        records = [held.answer_record(
            conversation_id=conversation_id, turn_id=uuid.uuid4(), reply_to_id=uuid.uuid4(),
            content=content, status="complete", prompt_tokens=500, completion_tokens=tokens,
            pool="default", model_version="smollm2-360m", finish_reason="stop",
        ) for _ in range(100)]  # fmt: skip
        before = client.info("memory")["used_memory"]
        for record in records:
            held.hold(record, ttl_s=600, due=True)
        grown = client.info("memory")["used_memory"] - before
        try:
            measured = grown / len(records)
            modelled = capacity.HELD_BYTES_PER_ANSWER + tokens * capacity.TEXT_BYTES_PER_TOKEN
            print(
                f"held answer of {tokens} tokens ({len(content)} B of text): measured "
                f"{measured:.0f} B, modelled {modelled} B"
            )
            assert 0.75 <= modelled / measured <= 1.25, (tokens, measured, modelled)
        finally:
            for record in records:
                held.release(turn_id=record["turn_id"], conversation_id=conversation_id)
