"""``python manage.py capacity``: size a deployment from measurements (inference/capacity.py)."""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference import capacity
from inference.capacity import CapacityError, EngineNode, Workload


def _n(value, digits: int = 1) -> str:
    """A number with thousands separators; whole numbers without decimals."""
    value = float(value)
    return f"{value:,.0f}" if value == int(value) else f"{value:,.{digits}f}"


def _bytes(value) -> str:
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:,.1f} {unit}"
        value /= 1024
    return ""  # unreachable


def _read_json(path: Path, what: str) -> dict | None:
    """``path``'s JSON, None if there is no file; CommandError if it is not JSON."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CommandError(f"{what} {path} is not readable JSON ({exc}); run the bench again "
                           "or pass another path") from exc  # fmt: skip


def _fraction(text: str) -> Fraction:
    """An argparse type: a decimal or a ratio ("0.5", "1/3") as an exact fraction."""
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc


class Command(BaseCommand):
    help = (
        "Size a deployment (engine nodes, gateway processes, PostgreSQL writes/s, Redis memory) "
        "for U concurrent users x T turns per minute x P prompt and C completion tokens at the "
        "latency targets, from the measured machine (the engine bench's sweep) or a given node."
    )

    def add_arguments(self, parser):
        bench = Path(settings.VAR_DIR) / "bench"
        parser.add_argument("--users", type=int, required=True, help="concurrent users")
        parser.add_argument(
            "--turns-per-minute",
            type=_fraction,
            required=True,
            help="turns per user per minute (e.g. 1, 0.5)",
        )
        parser.add_argument("--prompt-tokens", type=int, required=True)
        parser.add_argument("--completion-tokens", type=int, required=True)
        parser.add_argument(
            "--decode-tokens-per-s",
            type=_fraction,
            default=None,
            help="per decode stream (slot); with --slots-per-node, instead of the measured machine",
        )
        parser.add_argument(
            "--slots-per-node",
            type=int,
            default=None,
            help="concurrent decode streams per node at the targets",
        )
        parser.add_argument(
            "--engine-bench",
            type=Path,
            default=bench / "engine_bench.json",
            help="the engine bench's JSON with a sweep (default: %(default)s)",
        )
        parser.add_argument(
            "--stream-bench",
            type=Path,
            default=bench / "stream_bench.json",
            help="the stream bench's JSON (default: %(default)s)",
        )
        parser.add_argument(
            "--streams-per-gateway",
            type=int,
            default=None,
            help="SSE streams one gateway process holds (default: the stream "
            "bench's largest_n_passing)",
        )
        parser.add_argument("--tpot-p99-ms", type=float, default=capacity.TPOT_P99_TARGET_MS)
        parser.add_argument(
            "--ttft-p99-ms",
            type=float,
            default=capacity.TTFT_P99_TARGET_MS,
            help="TTFT p99 target, ms (default: paid, %(default)s)",
        )
        parser.add_argument(
            "--ttft-allowance-s",
            type=float,
            default=None,
            help="seconds a stream is open before its first token (default: the TTFT p99 target)",
        )
        parser.add_argument(
            "--writeback-s",
            type=float,
            default=5.0,
            help="seconds an answer is held in Redis before its write-back "
            "commits (default: %(default)s)",
        )
        parser.add_argument(
            "--plot",
            type=Path,
            default=None,
            help="write a PNG of the sweep's TPOT p99 and tokens/s here",
        )
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle(self, *args, **o):
        try:
            workload = Workload(users=o["users"], turns_per_minute=o["turns_per_minute"],
                                prompt_tokens=o["prompt_tokens"],
                                completion_tokens=o["completion_tokens"])  # fmt: skip
            node, sweep = self._node(o)
            streams, streams_source = self._streams_per_gateway(o)
            allowance = o["ttft_allowance_s"]
            if allowance is None:
                allowance = o["ttft_p99_ms"] / 1000
            result = capacity.size(
                workload, node, streams_per_gateway=streams,
                stream_ttl_s=settings.CHAT_STREAM_TTL_S, ttft_allowance_s=allowance,
                writeback_s=o["writeback_s"],
            )  # fmt: skip
            plotted = None
            if o["plot"]:
                if not sweep:
                    raise CapacityError(
                        f"--plot needs a measured sweep; {o['engine_bench']} has "
                        "none (python -m bench.engine_bench --parts sweep)"
                    )
                plotted = capacity.plot_sweep(
                    sweep,
                    o["plot"],
                    tpot_p99_ms=o["tpot_p99_ms"],
                    slots=node.slots if node.measured else None,
                )
        except CapacityError as exc:
            raise CommandError(str(exc)) from exc
        if o["json"]:
            out = result.as_json()
            out["sources"] = {"node": node.source, "streams_per_gateway": streams_source}
            out["plot"] = str(plotted) if plotted else None
            self.stdout.write(json.dumps(out, indent=1))
            return
        self._show(result, o, streams_source, plotted)

    def _node(self, o) -> tuple[EngineNode, list[dict] | None]:
        """The engine node (given, or the measured machine) and the measured sweep if read."""
        rate, slots = o["decode_tokens_per_s"], o["slots_per_node"]
        path = o["engine_bench"]
        bench = _read_json(path, "The engine bench JSON")
        sweep = (bench or {}).get("sweep") or None
        if (rate is None) != (slots is None):
            raise CapacityError("give both --decode-tokens-per-s and --slots-per-node (a node), "
                                "or neither (the measured machine's sweep)")  # fmt: skip
        if rate is not None:
            return EngineNode(
                slots=slots,
                stream_tokens_per_s=rate,
                source="given: --decode-tokens-per-s, --slots-per-node",
            ), sweep
        if bench is None:
            raise CapacityError(
                f"no engine bench results at {path}: run `python -m chatsite.devstack exec -- "
                "python -m bench.engine_bench --parts sweep`, pass --engine-bench PATH, or give "
                "a node's --decode-tokens-per-s and --slots-per-node"
            )
        node = capacity.node_from_sweep(
            sweep or [], source=f"measured: {path} sweep ({bench.get('created', '?')})",
            tpot_p99_ms=o["tpot_p99_ms"], ttft_p99_ms=o["ttft_p99_ms"],
        )  # fmt: skip
        return node, sweep

    def _streams_per_gateway(self, o) -> tuple[int | None, str]:
        if o["streams_per_gateway"] is not None:
            return o["streams_per_gateway"], "given: --streams-per-gateway"
        bench = _read_json(o["stream_bench"], "The stream bench JSON")
        if bench is None:
            return None, (
                f"not sized: no stream bench results at {o['stream_bench']} (run "
                "python -m bench.stream_bench, or give --streams-per-gateway)"
            )
        streams = capacity.streams_per_gateway_from(bench)
        if streams is None:
            return None, f"not sized: no stream count passed in {o['stream_bench']}"
        tried = (bench.get("args") or {}).get("streams")
        floor = f", the most it tried ({tried:,}): a floor" if tried == streams else ""
        return streams, f"measured: {o['stream_bench']} largest_n_passing{floor}"

    def _show(self, r: capacity.Sizing, o, streams_source: str, plotted) -> None:
        w, node = r.workload, r.node
        say = self.stdout.write
        say(
            f"Workload: {_n(w.users)} concurrent users x {_n(w.turns_per_minute, 3)} turn(s) per "
            f"minute each, {_n(w.prompt_tokens)}-token prompts, {_n(w.completion_tokens)}-token "
            "answers (given)"
        )
        say(
            f"Targets: TPOT p99 <= {o['tpot_p99_ms']:g} ms, TTFT p99 <= {o['ttft_p99_ms']:g} ms "
            "(DESIGN.md, targets from the design brief)"
        )
        say(
            f"Engine node: {node.slots} slots x {_n(node.stream_tokens_per_s, 2)} tokens/s per "
            f"stream ({node.source})"
        )
        m = node.measured
        if m:
            say(
                f"  the largest measured concurrency holding both targets: {m['concurrency']} "
                f"(TPOT p99 {m['tpot_p99_ms']} ms, TTFT p99 {m['ttft_p99_ms']} ms, "
                f"{_n(m['tokens_per_s'], 1)} tokens/s over all streams = "
                f"{_n(node.stream_tokens_per_s, 2)} per stream)"
            )
            if m.get("disturbed"):
                say(
                    "  note: the bench flagged that level as disturbed (other processes used the "
                    "CPUs meanwhile): run it again on a quiet machine for a firmer number"
                )
            if m.get("prompt_tokens_mean") and abs(m["prompt_tokens_mean"] - w.prompt_tokens) > 100:
                say(
                    f"  note: the sweep's prompts were ~{m['prompt_tokens_mean']:.0f} tokens, not "
                    f"{w.prompt_tokens}: longer prompts take longer to prefill (TTFT)"
                )
        say("")
        say("Engines (Little's law: streams in flight = arrival rate x time in the system)")
        say(
            f"  turns/s           = {_n(w.users)} users x {_n(w.turns_per_minute, 3)} / 60 s"
            f" = {_n(r.turns_per_s)}"
        )
        say(
            f"  decode s per turn = {_n(w.completion_tokens)} tokens / "
            f"{_n(node.stream_tokens_per_s, 2)} tokens/s = {_n(r.decode_s_per_turn, 2)} s"
        )
        say(
            f"  decoding streams  = {_n(r.turns_per_s)} turns/s x {_n(r.decode_s_per_turn, 2)} s"
            f" = {_n(r.decoding_streams)}"
        )
        say(
            f"  decode nodes      = ceil({_n(r.decoding_streams)} / {node.slots} slots)"
            f" = {r.engine_nodes:,}"
        )
        say("")
        say("Gateways (one SSE stream per turn, open from the request to the last token)")
        say(
            f"  open streams      = {_n(r.turns_per_s)} turns/s x ({_n(r.decode_s_per_turn, 2)} s"
            f" decode + {_n(r.ttft_allowance_s, 2)} s to the first token) = {_n(r.sse_streams)}"
        )
        if r.gateways is None:
            say(f"  gateway processes: {streams_source}")
        else:
            say(
                f"  gateway processes = ceil({_n(r.sse_streams)} / {r.streams_per_gateway:,} "
                f"streams per process) = {r.gateways:,}  ({streams_source})"
            )
        say("")
        say("PostgreSQL (rows written per answered turn, read from the code)")
        for what, count, where in capacity.POSTGRES_WRITES_PER_TURN:
            say(f"  {count} x {what}  ({where})")
        per_turn = sum(n for _, n, _ in capacity.POSTGRES_WRITES_PER_TURN)
        say(
            f"  writes/s          = {_n(r.turns_per_s)} turns/s x {per_turn} rows"
            f" = {_n(r.postgres_writes_per_s)} rows/s in {_n(r.postgres_commits_per_s)} "
            f"commits/s ({capacity.POSTGRES_COMMITS_PER_TURN} transactions per turn)"
        )
        say("")
        say(
            "Redis (turn event logs, conversations/turnlog.py; held answers, conversations/held.py)"
        )
        say(
            f"  log per turn      = ({_n(w.completion_tokens)} token + "
            f"{capacity.LOG_EXTRA_EVENTS_PER_TURN} done) entries x "
            f"{capacity.LOG_BYTES_PER_EVENT} B + {capacity.LOG_BYTES_PER_TURN} B keys"
            f" = {_bytes(r.log_bytes_per_turn)}  (bytes measured: tests/test_capacity.py)"
        )
        say(
            f"  logs retained     = {_n(r.turns_per_s)} turns/s x ({_n(r.decode_s_per_turn, 2)} s"
            f" + CHAT_STREAM_TTL_S {_n(r.stream_ttl_s)} s) = {_n(r.logs_retained)}"
        )
        say(
            f"  event logs        = {_n(r.logs_retained)} x {_bytes(r.log_bytes_per_turn)}"
            f" = {_bytes(r.log_bytes)}"
        )
        say(
            f"  held answers      = {_n(r.turns_per_s)} turns/s x {_n(r.writeback_s, 2)} s "
            f"write-back lag x ({capacity.HELD_BYTES_PER_ANSWER} B + {_n(w.completion_tokens)}"
            f" tokens x {capacity.TEXT_BYTES_PER_TOKEN} B) = {_bytes(r.held_bytes)}"
        )
        say(
            f"  Redis memory      = {_bytes(r.redis_bytes)} (before Redis's own overhead and "
            "replicas)"
        )
        say("")
        gateways = (
            "gateways not sized"
            if r.gateways is None
            else f"{r.gateways:,} gateway process{'es' if r.gateways != 1 else ''}"
        )
        say(
            f"=> {r.engine_nodes:,} decode nodes, {gateways}, "
            f"{_n(r.postgres_writes_per_s)} PostgreSQL rows/s, {_bytes(r.redis_bytes)} of Redis"
        )
        if plotted:
            say(f"plot: {plotted}")
