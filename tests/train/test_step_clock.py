"""train.clock: time budgets on wall-clock or on this process's CPU time."""

import time

import pytest

from ember.errors import EmberError
from ember.train.clock import step_clock


def test_cpu_clock_does_not_advance_while_the_process_sleeps():
    wall, cpu = step_clock("wall"), step_clock("cpu")
    w0, c0 = wall(), cpu()
    time.sleep(0.3)
    assert wall() - w0 >= 0.29
    assert cpu() - c0 < 0.1  # sleeping costs no CPU: a busy machine does not eat a CPU budget


def test_cpu_clock_counts_single_threaded_work_never_more_than_wall_time():
    wall, cpu = step_clock("wall"), step_clock("cpu")
    w0, c0 = wall(), cpu()
    while cpu() - c0 < 0.2:  # spin until 0.2 CPU-seconds of work are done
        assert wall() - w0 < 60, "the CPU clock does not advance"
    # one thread cannot use more CPU time than wall time passed (a busy machine makes wall larger)
    assert wall() - w0 >= 0.2 - 0.01


def test_unknown_clock_is_a_clear_error():
    with pytest.raises(EmberError, match="train.clock"):
        step_clock("sundial")
