"""engine/lanes.py: a call's tasks over several threads, starts first, errors raised to the caller."""

from __future__ import annotations

import threading

import pytest

from predictor.engine.lanes import Lanes

WAIT_S = 5.0  # a lane waiting this long for another means they did not run side by side


def test_two_lanes_run_two_starts_at_the_same_time():
    both = threading.Barrier(2, timeout=WAIT_S)
    threads: set[int] = set()

    def start():
        threads.add(threading.get_ident())
        both.wait()  # breaks (BrokenBarrierError) unless the other start runs meanwhile
        return ()

    Lanes(2).run([start, start])

    assert len(threads) == 2


def test_a_free_lane_takes_the_next_start_before_an_earlier_starts_follow_ups():
    order: list[str] = []
    c_started = threading.Event()
    lock = threading.Lock()

    def record(name):
        with lock:
            order.append(name)

    def follow_up():
        record("a's follow-up")
        return ()

    def a():
        record("a")
        return (follow_up,)

    def b():
        record("b")
        assert c_started.wait(WAIT_S)  # holds its lane until c starts on the other
        return ()

    def c():
        record("c")
        c_started.set()
        return ()

    Lanes(2).run([a, b, c])

    assert order.index("c") < order.index("a's follow-up")
    assert sorted(order) == sorted(["a", "b", "c", "a's follow-up"])


def test_follow_ups_run_after_the_task_that_made_them_and_their_own_follow_ups_too():
    done: list[int] = []

    def task(depth):
        def run():
            done.append(depth)
            return [task(depth + 1), task(depth + 1)] if depth < 3 else ()

        return run

    Lanes(3).run([task(0)])

    assert sorted(done) == [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3]


def test_the_first_error_reaches_the_caller_and_no_task_starts_after_it():
    started: list[str] = []
    failed = threading.Event()

    def fails():
        started.append("fails")
        failed.set()
        raise ValueError("the encoder failed")

    def slow():
        started.append("slow")
        assert failed.wait(WAIT_S)  # still running when the other lane fails
        return ()

    def never():
        started.append("never")
        return ()

    lanes = Lanes(2)
    with pytest.raises(ValueError, match="the encoder failed"):
        lanes.run([slow, fails, never, never])

    assert sorted(started) == ["fails", "slow"]
    lanes.run([lambda: started.append("next call") or ()])  # the lanes serve the next call
    assert started[-1] == "next call"


def test_one_lane_is_no_lanes():
    with pytest.raises(ValueError, match="at least 2"):
        Lanes(1)
