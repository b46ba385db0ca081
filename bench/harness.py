"""What every bench shares: statistics, the CPU meter, the load wait, the settings that take the
tier machinery out of a measurement, the servers under test, and the fixed prompts; the clients
that drive the stack are in bench/clients.py.

- **Statistics.** :func:`percentile` is the one percentile of the benches (linear interpolation,
  numpy's default); :func:`tpot` the one time per output token.
- **Machine.** :class:`CpuMeter` (CPU seconds per process between two points), :func:`disturbed`
  (more than 5% of the machine used outside the bench's stack), :func:`wait_for_quiet` (wait for
  a low load average), :func:`free_port`.
- **Settings.** :func:`tier_machinery_off` / :func:`tier_machinery_off_env`: no rate limits,
  reserved slots or shedding, in this process or in a server process's environment.
- **Servers.** :class:`InProcessServer` (uvicorn in a thread of this process, the real engine in
  its event loop, as tests/conftest.py's ``chat_server`` does) and :class:`Spawned` (a server
  process in its own process group: uvicorn via :func:`server_argv`, ``make run``'s stack,
  llama.cpp).

Benches run under the dev stack (``python -m chatsite.devstack exec -- ...``), which provides
PostgreSQL and Redis.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))
HOST = "127.0.0.1"

# Fixed user prompts; chat i of a batch asks PROMPTS[i % len(PROMPTS)].
PROMPTS = [
    "Write three sentences about the ocean.",
    "Explain what a hash table is.",
    "Give me a short recipe for pancakes.",
    "What are the main causes of climate change?",
    "Describe the water cycle in simple terms.",
    "List five tips for writing clean code.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet.",
    "How does a bicycle stay upright?",
    "What is the difference between a virus and a bacterium?",
    "Write a short poem about autumn leaves.",
    "Explain recursion to a ten year old.",
    "What should I pack for a weekend hiking trip?",
    "How do vaccines work?",
    "Give three reasons to learn a second language.",
    "What is photosynthesis?",
]

# Harmless prose for long messages: a long text someone pastes with a question.
SENTENCES = [
    "Could you help me tidy up the notes below before I send them to the team?",
    "The quarterly planning meeting moved to Thursday at ten in the large room.",
    "We agreed to migrate the billing reports to the new warehouse by the end of March.",
    "Anna will draft the onboarding guide and Tom will review the security checklist.",
    "The customer survey showed that most people want faster search and clearer invoices.",
    "Please bring your laptop charger, because the room has only a few sockets.",
    "Last week the deployment took forty minutes; the goal is to bring it under ten.",
    "The garden club meets on the first Sunday of each month near the old library.",
    "Tomatoes need at least six hours of sun a day and regular, deep watering.",
    "Our hiking route follows the river for eight kilometres and then climbs to the ridge.",
    "The recipe calls for two cups of flour, one egg, a pinch of salt and some milk.",
    "If the printer jams again, open the back panel and remove the paper gently.",
    "The museum is free on Wednesdays, but the special exhibition needs a ticket.",
    "I am not sure whether the train on Saturday stops at the airport station.",
    "The library extended its opening hours during the exam period until midnight.",
    "Remember to water the plants on the balcony while we are away in August.",
    "The new bicycle lanes on the main road made my commute a lot calmer.",
    "She explained the difference between weather and climate with a simple example.",
    "Can you suggest a clearer title for the third section of the report?",
    "The invoice from the caterer arrived late, so the payment will go out next week.",
    "Our team retrospective found that code reviews wait too long before someone starts.",
    "The children built a small bird house and painted it bright yellow.",
    "Please check whether the budget table adds up; the totals look slightly off.",
    "During the workshop we compared three ways to summarise long documents.",
]


# --------------------------------------------------------------------------------------------
# Statistics and formatting

_REQUIRED = object()


def percentile(values: Iterable[float], q: float, *, default=_REQUIRED):
    """The ``q``-th percentile (``q`` in 0..100) of ``values``, by linear interpolation between
    the closest ranks: numpy's default method (``"linear"``, Hyndman and Fan's definition 7).

    With the values sorted as x[0] <= ... <= x[n-1], the rank is r = (n - 1) * q / 100 and the
    result x[floor(r)] + (x[floor(r) + 1] - x[floor(r)]) * (r - floor(r)): p0 is the minimum,
    p100 the maximum, p50 the median (statistics.median's value); one sample is every
    percentile. Every bench reports its percentiles through this function.

    Raises ValueError for ``q`` outside 0..100, and for no values unless ``default`` is given
    (returned then, as ``max(..., default=...)`` does). Values must be numbers (None is a
    TypeError: filter missing samples out first).
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in 0..100, got {q!r}")
    ordered = sorted(values)
    if not ordered:
        if default is _REQUIRED:
            raise ValueError("percentile of no values")
        return default
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def tpot(first: float | None, last: float | None, completion_tokens: int) -> float | None:
    """Time per output token, seconds: (last token - first token) / (completion_tokens - 1);
    None without two tokens (``first``/``last``: perf_counter seconds of the first and last
    token event with text)."""
    if first is None or last is None or completion_tokens < 2:
        return None
    return (last - first) / (completion_tokens - 1)


def ms(x: float | None, digits: int = 1) -> str:
    """Seconds as milliseconds with ``digits`` decimals; "-" for None."""
    return "-" if x is None else f"{x * 1000:.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b; None when either is missing or b is zero."""
    return None if a is None or not b else a / b


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# The machine: ports, CPU used per process, load


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, utime+stime ticks) for every process we can read."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return table


def _role(pid: int) -> str:
    """A short name for a process of the stack (for the CPU breakdown)."""
    if pid == os.getpid():
        return "bench"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return "gone"
    for needle, name in (
        (b"VLLM::Worker", "vllm-worker"),
        (b"VLLM::EngineCore", "vllm-enginecore"),
        (b"chatsite.serve", "server"),
        (b"postgres", "postgres"),
        (b"redis", "redis"),
    ):
        if needle in cmd:
            return name
    return "other-stack"


def _system_busy_ticks() -> int:
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal
    return sum(parts[:3]) + sum(parts[5:8])


def _stack_pids(table: dict[int, tuple[int, int]]) -> set[int]:
    """This bench's process tree plus the dev stack's (devstack exec, Redis, PostgreSQL)."""
    roots = {os.getpid(), os.getppid()}
    for pid in table:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(VAR / "pgdata").encode() in f.read():
                    roots.add(pid)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


class CpuMeter:
    """CPU seconds used between start() and stop(): by this process (the benchmark client and,
    with an in-process engine, the engine's front end), by the whole stack, and by anything
    else (so numbers disturbed by background load on a small machine can be spotted)."""

    def start(self) -> None:
        self._t = time.perf_counter()
        self._self = time.process_time()
        self._busy = _system_busy_ticks()
        table = _proc_table()
        self._stack = {pid: table[pid][1] for pid in _stack_pids(table)}
        self._all = {pid: ticks for pid, (_, ticks) in table.items()}

    def stop(self) -> dict:
        """-> wall_s, bench_process_cpu_s, stack_cpu_s, other_cpu_s (CPU seconds outside the
        stack), stack_cpu_by_role_s, other_top (the 3 busiest other processes, >= 0.5 CPU-s)
        and machine_busy_frac (busy CPU time / (wall * CPUs))."""
        wall = time.perf_counter() - self._t
        own = time.process_time() - self._self
        busy = (_system_busy_ticks() - self._busy) / _CLK_TCK
        table = _proc_table()
        stack = 0
        by_role: dict[str, float] = {}
        for pid in _stack_pids(table):
            used = table[pid][1] - self._stack.get(pid, 0)
            stack += used
            role = _role(pid)
            by_role[role] = by_role.get(role, 0.0) + used / _CLK_TCK
        stack_s = stack / _CLK_TCK
        stack_pids = _stack_pids(table)
        others = sorted(
            (
                (ticks - self._all.get(pid, ticks), pid)
                for pid, (_, ticks) in table.items()
                if pid not in stack_pids and pid in self._all
            ),
            reverse=True,
        )
        top_others = []
        for ticks, pid in others[:3]:
            if ticks / _CLK_TCK < 0.5:
                break
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                top_others.append({"pid": pid, "cpu_s": ticks / _CLK_TCK, "cmd": cmd[:120]})
        return {
            "stack_cpu_by_role_s": {k: round(v, 2) for k, v in sorted(by_role.items())},
            "other_top": top_others,
            "wall_s": wall,
            "bench_process_cpu_s": own,
            "stack_cpu_s": stack_s,
            "other_cpu_s": max(busy - stack_s, 0.0),
            "machine_busy_frac": busy / (wall * (os.cpu_count() or 1)) if wall > 0 else None,
        }


def disturbed(cpu: dict, wall_s: float | None = None) -> bool:
    """More than 5% of the machine used by processes outside this bench's stack, from a
    :meth:`CpuMeter.stop` result (``wall_s``: the measured span, default the meter's own)."""
    if not cpu:
        return False
    wall = cpu["wall_s"] if wall_s is None else wall_s
    return cpu["other_cpu_s"] > 0.05 * wall * (os.cpu_count() or 1)


def wait_for_quiet(threshold: float | None, max_s: float) -> float:
    """Wait (polling every 60 s, at most ``max_s``) until the 1-minute load average is below
    ``threshold`` (None: don't wait); -> the load average when measuring starts."""
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
# Settings: none of the tier machinery in a measurement of something else

_UNLIMITED = {t: {"rpm": None, "tpm": None} for t in ("free", "paid", "enterprise")}
# No RPM / TPM limits (inference/ratelimit.py: a null limit is unlimited), no reserved slots, no
# shedding or degrading (bench/priority_bench.py measures those).
TIER_MACHINERY_OFF = {
    "CHAT_RATE_LIMITS_BY_TIER": _UNLIMITED,
    "CHAT_ORG_RATE_LIMITS_BY_TIER": _UNLIMITED,
    "CHAT_RESERVED_SLOTS": 0,
    "CHAT_SHED_FREE_WAITING": 100_000,
    "CHAT_DEGRADE_PAID_WAITING": 100_000,
    "CHAT_REASONING_LAST_WAITING": 100_000,
    "CHAT_SHED_FREE_WAIT_S": 0.0,
    "CHAT_ADMISSION_ADAPTIVE": False,  # the cap is the slots (engine_bench's mixed part compares)
}


def tier_machinery_off(settings) -> None:
    """Apply :data:`TIER_MACHINERY_OFF` to this process's Django ``settings`` (read per
    request, so an in-process server sees it)."""
    for name, value in TIER_MACHINERY_OFF.items():
        setattr(settings, name, copy.deepcopy(value))  # a copy of its own


def tier_machinery_off_env() -> dict[str, str]:
    """:data:`TIER_MACHINERY_OFF` as environment variables, for a server process."""
    return {
        name: json.dumps(value) if isinstance(value, dict) else str(value)
        for name, value in TIER_MACHINERY_OFF.items()
    }


# --------------------------------------------------------------------------------------------
# Servers under test


def server_argv(app: str = "chatsite.asgi:application", port: int | None = None) -> list[str]:
    """The product's server (``python -m chatsite.serve``: uvicorn with the product's options)
    on 127.0.0.1:``port`` serving ``app``."""
    from chatsite.serve import serve_argv  # noqa: PLC0415

    return serve_argv(host=HOST, port=port or 0, app=app)


class Spawned:
    """A server process of the bench's, in its own process group (so :meth:`stop` ends its
    children too), its output in ``log_path`` (``append``: after a header line, keeping what
    earlier servers wrote; :attr:`log_offset` is where this one's output starts)."""

    def __init__(self, name: str, argv: list[str], *, port: int, env: dict | None = None,
                 log_path: Path, append: bool = False) -> None:  # fmt: skip
        self.name, self.argv, self.port, self.env = name, argv, port, env
        self.log_path, self.append = log_path, append
        self.url = f"http://{HOST}:{port}"
        self.proc: subprocess.Popen | None = None
        self.log_offset = 0
        self.started = 0.0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.append:
            self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab" if self.append else "wb") as out:
            if self.append:
                out.write(f"\n===== {self.name} on port {self.port} =====\n".encode())
                out.flush()
            self.started = time.monotonic()
            self.proc = subprocess.Popen(
                self.argv, env=self.env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def wait_ready(self, path: str, timeout_s: float, poll_s: float = 0.5) -> float:
        """Poll ``GET path`` until it answers 200; -> seconds since :meth:`start`. Raises
        RuntimeError (naming the log) when the process exits or ``timeout_s`` passes first."""
        while True:
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                with urllib.request.urlopen(self.url + path, timeout=5) as response:
                    if response.status == 200:
                        return time.monotonic() - self.started
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.returncode}); see {self.log_path}"
                )
            if time.monotonic() - self.started > timeout_s:
                raise RuntimeError(
                    f"{self.name} not ready in {timeout_s:.0f} s; see {self.log_path}"
                )
            time.sleep(poll_s)

    def stop(self, grace_s: float = 15) -> str:
        """SIGTERM the process group, SIGKILL after ``grace_s``; -> what it took."""
        if self.proc is None or self.proc.poll() is not None:
            return "not running"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
            return f"SIGTERM, exit {self.proc.returncode}"
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return f"SIGKILL after {grace_s:g} s"


class InProcessServer:
    """uvicorn (chatsite/serve.py ``serve_in_thread``) on 127.0.0.1 (a free port) in a
    background thread of this process, serving ``chatsite.asgi.application`` with the real
    engine (``VllmEngine.from_settings()``) as the process's engine; :meth:`call` runs a
    coroutine on the server's event loop (as tests/conftest.py's ``chat_server`` does)."""

    def __init__(self) -> None:
        import inference.engine as engine_module  # noqa: PLC0415

        self.engine_module = engine_module
        self.engine = engine_module.VllmEngine.from_settings()
        engine_module._engine = self.engine
        self.server = None
        self.url = ""

    def start(self) -> None:
        """Listen, then start the engine (minutes at most: RuntimeError after 30 s / 600 s)."""
        from chatsite.asgi import application  # noqa: PLC0415
        from chatsite.serve import serve_in_thread  # noqa: PLC0415

        self.server = serve_in_thread(application, host=HOST)
        self.url = f"http://{HOST}:{self.server.port}"
        log(f"uvicorn listening on {self.url}; starting the vLLM engine")
        started = time.perf_counter()
        self.call(self.engine.ensure_started(), timeout=600)
        log(f"engine ready in {time.perf_counter() - started:.1f} s")

    def call(self, coro, timeout: float = 600):
        return self.server.call(coro, timeout)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.engine.shutdown()
        self.engine_module._engine = None
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop()
