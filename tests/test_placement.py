"""Where the stack's processes run (chatsite/placement.py, issue 19 part 2): off the model's CPUs,
background work at a lower priority."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from chatsite.placement import Placement, engine_cpus, parse_cpu_list, placed, postmaster_pid


def test_cpu_lists_parse_and_bad_ones_name_the_text():
    assert parse_cpu_list("0-2,5") == {0, 1, 2, 5}
    assert parse_cpu_list(" 3 ") == {3}
    with pytest.raises(ValueError, match="'0-a'"):
        parse_cpu_list("0-a")


def test_auto_binding_gives_the_model_all_but_the_reserved_cpus():
    # Given: vLLM's automatic binding on 2 CPUs (one reserved for its scheduler, x86 default)
    # Then: the model's thread is on CPU 0, as vLLM logs it ("core ids=[0], reserved_cpus=[1]")
    assert engine_cpus({0, 1}, {}) == {0}
    assert engine_cpus(range(8), {"CHAT_ENGINE_RESERVED_CPUS": "2"}) == set(range(6))
    assert engine_cpus({0, 1}, {"CHAT_ENGINE_THREADS_BIND": "0-1"}) == {0, 1}
    assert engine_cpus({0, 1}, {"CHAT_ENGINE_THREADS_BIND": "nobind"}) == set()


def test_services_go_to_the_cpus_the_model_does_not_use():
    # Given / When: the defaults on a 2-CPU machine
    placement = Placement.from_env({}, available={0, 1})
    # Then
    assert placement.service_cpus == {1}
    assert placement.background_nice == 10


def test_nothing_is_pinned_when_no_cpu_is_left_over_or_when_asked():
    # A model bound to both CPUs leaves none for services: pin nothing rather than everything
    # onto the model's CPUs
    both = Placement.from_env({"CHAT_ENGINE_THREADS_BIND": "0-1"}, available={0, 1})
    assert both.service_cpus == frozenset()
    assert Placement.from_env({"CHAT_SERVICE_CPUS": "all"}, available={0, 1}).service_cpus == frozenset()
    assert Placement.from_env({}, available={0}).service_cpus == frozenset()


def test_an_explicit_service_list_outside_the_machine_is_refused():
    with pytest.raises(ValueError, match="CHAT_SERVICE_CPUS='7'"):
        Placement.from_env({"CHAT_SERVICE_CPUS": "7"}, available={0, 1})


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to place anything")
def test_a_background_child_runs_on_the_service_cpus_at_lower_priority():
    # Given: the placement on this machine's CPUs, services on the last one
    cpus = sorted(os.sched_getaffinity(0))
    placement = Placement.from_env({}, available=cpus)
    probe = "import os; print(sorted(os.sched_getaffinity(0)), os.nice(0))"
    # When: a background and a foreground child start with its preexec
    background = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                preexec_fn=placement.preexec(background=True), check=True)  # fmt: skip
    foreground = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                preexec_fn=placement.preexec(), check=True)  # fmt: skip
    # Then: both off the model's CPUs; only the background one niced
    base = os.nice(0)
    assert background.stdout.split("]")[0] + "]" == str(cpus[-1:])
    assert int(background.stdout.split()[-1]) == min(19, base + 10)
    assert foreground.stdout.split("]")[0] + "]" == str(cpus[-1:])
    assert int(foreground.stdout.split()[-1]) == base


def test_postmaster_pid_is_read_from_its_file(tmp_path):
    assert postmaster_pid(tmp_path) is None
    (tmp_path / "postmaster.pid").write_text("4242\n/var/pgdata\n")
    assert postmaster_pid(tmp_path) == 4242


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to place anything")
def test_placed_pins_this_process_and_puts_it_back():
    # Given: this process may use every CPU
    before = os.sched_getaffinity(0)
    placement = Placement.from_env({}, available=before)
    # When / Then: inside the block only the service CPUs; afterwards all of them again
    with placed(placement):
        assert os.sched_getaffinity(0) == set(placement.service_cpus)
    assert os.sched_getaffinity(0) == before
