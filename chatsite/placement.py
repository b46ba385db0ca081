"""Where the stack's processes run relative to the engine's cores, and at what CPU priority
(issue 19 part 2).

vLLM's CPU backend binds the model's OpenMP threads to some CPUs and leaves the others
("reserved") for its scheduler (vllm/utils/ompmultiprocessing.py: on x86 with automatic binding,
the last ``VLLM_CPU_NUM_OF_RESERVED_CPU`` CPUs, default one per local rank; on a 2-CPU machine the
model runs on CPU 0 and CPU 1 is reserved). Nothing stops the gateway, PostgreSQL, Redis or a
Celery worker from being scheduled onto the model's CPU, where each time slice they take stalls
every running stream's decode step (a step is one synchronous pass over all weights). So the
stacks (chatsite/devstack.py ``make run``, chatsite/prodstack.py ``make run-prod``) start every
process of theirs on the *service CPUs* - the CPUs the model's threads are not bound to - and
the engine's worker rebinds only its OpenMP threads to the model's CPUs (it does so itself,
whatever mask it inherits). The engine's scheduler process (EngineCore), which busy-polls the
worker's shared-memory queue while a step runs, inherits the service CPUs too.

Background work (Celery worker and beat: summaries, memory extraction, write-back retries) also
runs at a lower CPU priority (``nice``), so a burst of it yields to the gateway on those CPUs.

Environment (read directly: the stacks run before Django's settings):

- ``CHAT_SERVICE_CPUS``: ``auto`` (default: every CPU this process may use minus the model's,
  :func:`engine_cpus`), ``all`` (no pinning: the scheduler places everything, the behaviour
  before this module), or CPU ids such as ``1`` or ``2-7,10``.
- ``CHAT_BACKGROUND_NICE``: niceness added to Celery processes (default 10; 0 = none).
- ``CHAT_ENGINE_THREADS_BIND`` / ``CHAT_ENGINE_RESERVED_CPUS``: the engine's binding
  (inference/tuning.py), read here to know which CPUs are the model's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)

DEFAULT_BACKGROUND_NICE = 10


def parse_cpu_list(text: str) -> set[int]:
    """``"0-2,5"`` -> ``{0, 1, 2, 5}``. Raises ValueError naming the text when it is not a list
    of CPU ids and ranges."""
    text = text.strip()
    if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", text):
        raise ValueError(f"{text!r} is not a CPU list such as 1 or 0-3,6")
    cpus: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def postmaster_pid(data_dir) -> int | None:
    """The PostgreSQL postmaster's pid from ``data_dir/postmaster.pid`` (its first line), or
    None when there is no running server's file."""
    try:
        with open(os.path.join(data_dir, "postmaster.pid")) as file:
            return int(file.readline().strip())
    except (OSError, ValueError):
        return None


def engine_cpus(available: Iterable[int], env: dict[str, str]) -> set[int]:
    """The CPUs the model's OpenMP threads are bound to, as vLLM will bind them:
    ``CHAT_ENGINE_THREADS_BIND`` when it lists CPUs; ``nobind``: none (the threads float, so no
    CPU is the model's alone); empty or ``auto``: vLLM's automatic binding, all ``available``
    CPUs but the last ``CHAT_ENGINE_RESERVED_CPUS`` (default 1, vLLM's reserve for one local
    rank on x86). An over-estimate on SMT machines, where vLLM uses one thread per core."""
    bind = env.get("CHAT_ENGINE_THREADS_BIND", "").strip()
    if bind == "nobind":
        return set()
    if bind and bind != "auto":
        return parse_cpu_list(bind)
    cpus = sorted(available)
    reserved = env.get("CHAT_ENGINE_RESERVED_CPUS", "").strip()
    keep = int(reserved) if reserved else 1
    return set(cpus[: max(0, len(cpus) - keep)]) if keep else set(cpus)


@dataclass(frozen=True)
class Placement:
    """Where the stack's own processes run: ``service_cpus`` (empty: anywhere) and
    ``background_nice`` (added niceness of background processes)."""

    service_cpus: frozenset[int]
    background_nice: int

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, available: Iterable[int] | None = None) -> Placement:
        """The placement from ``env`` (default ``os.environ``) on ``available`` CPUs (default
        this process's affinity). ``auto`` with no CPU left over (a 1-CPU machine, or the model
        bound to all of them) pins nothing. Raises ValueError for a malformed setting."""
        env = dict(os.environ if env is None else env)
        available = set(os.sched_getaffinity(0) if available is None else available)
        nice = int(env.get("CHAT_BACKGROUND_NICE", DEFAULT_BACKGROUND_NICE) or 0)
        choice = env.get("CHAT_SERVICE_CPUS", "auto").strip() or "auto"
        if choice == "all":
            service: set[int] = set()
        elif choice == "auto":
            model = engine_cpus(available, env)
            # No CPU of the model's alone (1 CPU, or its threads float): nothing to keep off.
            service = available - model if model else set()
        else:
            service = parse_cpu_list(choice) & available
            if not service:
                raise ValueError(f"CHAT_SERVICE_CPUS={choice!r} names none of the CPUs {sorted(available)}")
        return cls(service_cpus=frozenset(service), background_nice=max(0, nice))

    def describe(self) -> str:
        """One line for the stack's log."""
        where = f"CPUs {sorted(self.service_cpus)}" if self.service_cpus else "any CPU"
        return f"services on {where}, background work at nice +{self.background_nice}"

    def preexec(self, *, background: bool = False) -> Callable[[], None]:
        """A ``subprocess.Popen`` ``preexec_fn`` that puts the child on the service CPUs and,
        for ``background`` work, lowers its priority."""

        def apply() -> None:
            if self.service_cpus:
                os.sched_setaffinity(0, self.service_cpus)
            if background and self.background_nice:
                os.nice(self.background_nice)

        return apply

    def apply_here(self) -> None:
        """Put this process on the service CPUs (a stack's parent, before it starts anything:
        its children inherit the mask; the engine's worker rebinds its own threads)."""
        if self.service_cpus:
            os.sched_setaffinity(0, self.service_cpus)
            logger.info("placement: %s", self.describe())

    def apply_to_pid(self, pid: int) -> None:
        """Put a process started by someone else (the embedded PostgreSQL's postmaster) and its
        current children on the service CPUs; processes it forks later inherit it. A process
        that is gone, or not ours, is logged and skipped."""
        if not self.service_cpus:
            return
        import psutil  # noqa: PLC0415 - vLLM's dependency; only the stacks need it

        try:
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                process.cpu_affinity(sorted(self.service_cpus))
        except (psutil.Error, OSError) as exc:
            logger.warning("could not place process %d on CPUs %s: %s", pid, sorted(self.service_cpus), exc)


@contextlib.contextmanager
def placed(placement: Placement, *, postmaster: int | None = None) -> Iterator[Placement]:
    """Within the block, this process (and the PostgreSQL ``postmaster`` pid with its children,
    when given) run on ``placement``'s service CPUs; afterwards both may use every CPU this
    process could before (a benchmark measures the stack as ``make run`` places it, then runs
    its baselines unpinned)."""
    before = os.sched_getaffinity(0)
    placement.apply_here()
    if postmaster is not None:
        placement.apply_to_pid(postmaster)
    try:
        yield placement
    finally:
        os.sched_setaffinity(0, before)
        if postmaster is not None and placement.service_cpus:
            Placement(service_cpus=frozenset(before), background_nice=0).apply_to_pid(postmaster)
