"""The admission queue (inference/admission.py): slots, reserved slots, order, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from core import metrics
from inference.admission import Admission, admission_for
from tests.fakes import ScriptedEngine


async def settle() -> None:
    """Let every ready task run until it blocks again."""
    for _ in range(10):
        await asyncio.sleep(0)


class Requests:
    """Requests that take a slot, note their name when they get it, and hold it until told."""

    def __init__(self, admission: Admission):
        self.admission = admission
        self.order: list[str] = []
        self.tasks: dict[str, asyncio.Task] = {}
        self.release: dict[str, asyncio.Event] = {}

    def start(self, name: str, *, priority: int = 0, reserved_ok: bool = True) -> asyncio.Task:
        self.release[name] = asyncio.Event()

        async def run():
            async with self.admission.slot(priority=priority, reserved_ok=reserved_ok):
                self.order.append(name)
                await self.release[name].wait()

        self.tasks[name] = asyncio.get_running_loop().create_task(run())
        return self.tasks[name]

    async def finish(self, name: str) -> None:
        self.release[name].set()
        await self.tasks[name]

    async def finish_all(self) -> None:
        for name in self.tasks:
            self.release[name].set()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


@pytest.fixture
def scheduling(settings):
    """Priority mode, 4 slots, 2 of them reserved (tests change these as they need)."""
    settings.CHAT_SCHEDULING = "priority"
    settings.CHAT_MAX_NUM_SEQS = 4
    settings.CHAT_RESERVED_SLOTS = 2
    return settings


async def test_no_more_requests_run_than_there_are_slots(scheduling):
    scheduling.CHAT_RESERVED_SLOTS = 0
    admission = Admission(label="t-slots")
    reqs = Requests(admission)
    for name in "abcdef":
        reqs.start(name)
    await settle()

    assert reqs.order == ["a", "b", "c", "d"]
    assert (admission.running(), admission.waiting()) == (4, 2)

    await reqs.finish("b")
    await settle()
    assert reqs.order == ["a", "b", "c", "d", "e"]
    assert (admission.running(), admission.waiting()) == (4, 1)
    await reqs.finish_all()
    assert (admission.running(), admission.waiting()) == (0, 0)


async def test_priority_mode_serves_lower_priority_first_then_by_arrival(scheduling):
    scheduling.CHAT_MAX_NUM_SEQS = 1
    scheduling.CHAT_RESERVED_SLOTS = 0
    admission = Admission(label="t-priority")
    reqs = Requests(admission)
    reqs.start("holder")
    await settle()
    for name, priority in (("free1", 1), ("paid1", 0), ("free2", 1), ("paid2", 0), ("bg", 10)):
        reqs.start(name, priority=priority)
    await settle()

    for name in ("holder", "paid1", "paid2", "free1", "free2"):
        await reqs.finish(name)
        await settle()

    assert reqs.order == ["holder", "paid1", "paid2", "free1", "free2", "bg"]
    await reqs.finish_all()


async def test_the_grant_log_orders_arrivals_and_grants_in_one_sequence(scheduling):
    """Grant.arrival / .granted place every arrival and grant in one order: a request that
    overtook others is granted before them although it arrived after them."""
    scheduling.CHAT_MAX_NUM_SEQS = 1
    scheduling.CHAT_RESERVED_SLOTS = 0
    admission = Admission(label="t-grant-log")
    reqs = Requests(admission)

    async def tagged(name: str, priority: int):
        async with admission.slot(priority=priority, reserved_ok=True, tag=name):
            await reqs.release[name].wait()

    for name, priority in (("holder", 1), ("free", 1), ("paid", 0)):
        reqs.release[name] = asyncio.Event()
        reqs.tasks[name] = asyncio.get_running_loop().create_task(tagged(name, priority))
        await settle()
    for name in ("holder", "paid", "free"):
        await reqs.finish(name)
        await settle()

    grants = {grant.tag: grant for grant in admission.grants}
    assert [grant.tag for grant in admission.grants] == ["holder", "paid", "free"]
    holder, free, paid = grants["holder"], grants["free"], grants["paid"]
    assert holder.arrival < holder.granted < free.arrival < paid.arrival  # holder ran at once
    assert free.arrival < paid.arrival < paid.granted < free.granted  # paid overtook free
    assert (paid.priority, free.priority) == (0, 1)


async def test_fcfs_mode_serves_by_arrival_whatever_the_priority(scheduling):
    scheduling.CHAT_SCHEDULING = "fcfs"
    scheduling.CHAT_MAX_NUM_SEQS = 1
    admission = Admission(label="t-fcfs")
    reqs = Requests(admission)
    reqs.start("holder")
    await settle()
    for name, priority in (("free1", 1), ("paid1", 0), ("free2", 1), ("paid2", 0)):
        reqs.start(name, priority=priority)
    await settle()

    for name in ("holder", "free1", "paid1", "free2"):
        await reqs.finish(name)
        await settle()

    assert reqs.order == ["holder", "free1", "paid1", "free2", "paid2"]
    await reqs.finish_all()


async def test_free_requests_never_take_the_reserved_slots_so_paid_ones_start_at_once(
    scheduling,
):
    """4 slots, 2 reserved: free traffic fills 2 and queues; a paid turn still runs at once."""
    admission = Admission(label="t-reserved")
    reqs = Requests(admission)
    for name in ("f1", "f2", "f3", "f4"):
        reqs.start(name, priority=1, reserved_ok=False)
    await settle()
    assert reqs.order == ["f1", "f2"]
    assert (admission.running(), admission.waiting()) == (2, 2)

    reqs.start("paid", priority=0, reserved_ok=True)
    await settle()

    assert reqs.order == ["f1", "f2", "paid"]
    assert (admission.running(), admission.waiting()) == (3, 2)
    await reqs.finish_all()


async def test_the_reserved_slots_stay_free_while_paid_turns_hold_others(scheduling):
    """The reserve is headroom: with a paid turn running, a finished free request is not
    replaced until 2 slots would still be free, so the next paid turn also starts at once."""
    admission = Admission(label="t-headroom")
    reqs = Requests(admission)
    for name in ("f1", "f2", "f3"):
        reqs.start(name, priority=1, reserved_ok=False)
    await settle()
    reqs.start("paid1", priority=0, reserved_ok=True)
    await settle()

    await reqs.finish("f1")
    await settle()
    assert reqs.order == ["f1", "f2", "paid1"]  # f3 still waits: 2 of 4 slots stay free
    reqs.start("paid2", priority=0, reserved_ok=True)
    await settle()
    assert reqs.order[-1] == "paid2"

    await reqs.finish("paid1")
    await reqs.finish("paid2")
    await settle()
    assert reqs.order[-1] == "f3"  # paid traffic gone: free requests use the 2 slots again
    await reqs.finish_all()


async def test_a_free_request_held_back_by_the_reserve_does_not_block_paid_ones_behind_it(
    scheduling,
):
    """Even in arrival order (equal priorities) a waiting free request that may not take a
    reserved slot is skipped, not a barrier. Once no free request runs, one may run even if
    that dips into the reserve (free traffic is never stopped outright)."""
    scheduling.CHAT_MAX_NUM_SEQS = 2
    scheduling.CHAT_RESERVED_SLOTS = 1
    admission = Admission(label="t-skip")
    reqs = Requests(admission)
    reqs.start("f1", reserved_ok=False)
    reqs.start("f2", reserved_ok=False)  # queued: taking the 2nd slot would empty the reserve
    reqs.start("paid", reserved_ok=True)  # same priority, later arrival
    await settle()

    assert reqs.order == ["f1", "paid"]
    assert admission.waiting() == 1
    await reqs.finish("f1")
    await settle()
    assert reqs.order == ["f1", "paid", "f2"]
    await reqs.finish_all()


async def test_fcfs_mode_has_no_reserved_slots(scheduling):
    """The baseline: free requests may fill every slot."""
    scheduling.CHAT_SCHEDULING = "fcfs"
    admission = Admission(label="t-fcfs-reserved")
    reqs = Requests(admission)
    for name in ("f1", "f2", "f3", "f4"):
        reqs.start(name, priority=1, reserved_ok=False)
    await settle()

    assert reqs.order == ["f1", "f2", "f3", "f4"]
    assert admission.waiting() == 0
    await reqs.finish_all()


async def test_cancelled_while_waiting_leaves_the_queue_and_blocks_nobody(scheduling):
    scheduling.CHAT_MAX_NUM_SEQS = 1
    scheduling.CHAT_RESERVED_SLOTS = 0
    admission = Admission(label="t-cancel")
    reqs = Requests(admission)
    reqs.start("holder")
    await settle()
    gone = reqs.start("gone", priority=0)
    reqs.start("next", priority=1)
    await settle()
    assert admission.waiting() == 2

    gone.cancel()
    await settle()

    assert gone.cancelled()
    assert admission.waiting() == 1
    await reqs.finish("holder")
    await settle()
    assert reqs.order == ["holder", "next"]  # the slot went past the cancelled waiter
    await reqs.finish("next")
    assert (admission.running(), admission.waiting()) == (0, 0)


async def test_cancelled_right_after_being_granted_gives_the_slot_back(scheduling):
    """The slot is handed over and the waiter cancelled before it resumes: no slot leaks."""
    scheduling.CHAT_MAX_NUM_SEQS = 1
    scheduling.CHAT_RESERVED_SLOTS = 0
    admission = Admission(label="t-cancel-granted")
    reqs = Requests(admission)
    holder = admission.slot(priority=0, reserved_ok=True)
    await holder.__aenter__()
    unlucky = reqs.start("unlucky")
    await settle()
    assert admission.waiting() == 1

    await holder.__aexit__(None, None, None)  # hands the slot to "unlucky" (not resumed yet)
    assert (admission.running(), admission.waiting()) == (1, 0)
    unlucky.cancel()
    await settle()

    assert unlucky.cancelled() and reqs.order == []
    assert (admission.running(), admission.waiting()) == (0, 0)
    reqs.start("later")
    await settle()
    assert reqs.order == ["later"]
    await reqs.finish_all()


async def test_many_cancellations_under_load_leave_no_slot_or_waiter_behind(scheduling):
    scheduling.CHAT_MAX_NUM_SEQS = 3
    scheduling.CHAT_RESERVED_SLOTS = 1
    admission = Admission(label="t-churn")

    async def one(i: int):
        async with admission.slot(priority=i % 3, reserved_ok=i % 2 == 0):
            await asyncio.sleep(0.001 * (i % 5))

    tasks = [asyncio.get_running_loop().create_task(one(i)) for i in range(200)]
    await asyncio.sleep(0.005)
    for task in tasks[::3]:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    assert (admission.running(), admission.waiting()) == (0, 0)
    assert admission._running_unreserved == 0


async def test_an_exception_in_the_body_releases_the_slot(scheduling):
    admission = Admission(label="t-error")
    with pytest.raises(RuntimeError):
        async with admission.slot(priority=0, reserved_ok=True):
            assert admission.running() == 1
            raise RuntimeError("engine died")
    assert admission.running() == 0


async def test_the_waiting_gauge_follows_the_queue(scheduling):
    scheduling.CHAT_MAX_NUM_SEQS = 1
    admission = Admission(label="t-gauge")
    reqs = Requests(admission)
    for name in ("a", "b", "c"):
        reqs.start(name)
    await settle()

    assert metrics.value("chat_admission_waiting", engine="t-gauge") == 2
    assert metrics.value("chat_admission_running", engine="t-gauge") == 1
    await reqs.finish_all()
    assert metrics.value("chat_admission_waiting", engine="t-gauge") == 0


def test_an_unknown_scheduling_mode_is_refused(scheduling):
    scheduling.CHAT_SCHEDULING = "priorty"
    with pytest.raises(ValueError, match="CHAT_SCHEDULING"):
        Admission.mode()


def test_one_admission_queue_per_engine_sized_by_its_batch_width(scheduling):
    first, second = ScriptedEngine(), ScriptedEngine()
    wide = ScriptedEngine()
    wide.max_num_seqs = 16  # an engine started with its own max_num_seqs

    assert admission_for(first) is admission_for(first)
    assert admission_for(first) is not admission_for(second)
    assert admission_for(first).slots == 4  # settings.CHAT_MAX_NUM_SEQS
    assert admission_for(wide).slots == 16
