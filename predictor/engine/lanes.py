"""One engine call's work spread over lanes: the calling thread and helpers, each running a one-thread
copy of the graph, so that the CPUs run a call's sentences (and a long sentence's decoder chunks) side
by side instead of splitting each operator between them.

Why: two threads on one sentence run its text encoder and durations (2,400 small operators) only
1.2-1.3x as fast as one thread, its flow 1.6x and its decoder 1.8x, so three sentences cost 701
CPU-ms one thread at a time against 2 x 408 ms on two threads at once (docs/benchmarks.md, "Lanes").
A lone sentence's text encoder, flow and first decoder stage, one task with nothing beside it, run
on the copy with every thread instead (the engine's choice, made from the call's shape alone, so the
same call always runs on the same copies and gives the same samples).

A call is a list of start tasks (one per sentence, in reading order); each task returns the tasks
that may run after it (a sentence's decoder chunks). A free lane takes the next start first, so the
sentences' serial parts overlap the chunks, then the oldest waiting task. A streamed call's lanes
take the waiting task earliest in reading order instead (a task's followers, in their order, come
right after it and before every later start), so the audio the listener needs next is made first.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

# A task returns the tasks that may run once it is done.
Task = Callable[[], Sequence["Task"]]


class Lanes:
    """``n`` lanes: the thread that calls ``run`` and n - 1 helper threads, kept for the engine's life."""

    def __init__(self, n: int, name: str = "engine-lane"):
        if n < 2:
            raise ValueError(f"lanes need at least 2 lanes, got {n}")
        self.n = n
        self._helpers = ThreadPoolExecutor(n - 1, thread_name_prefix=name)
        self._name = name
        self._runner: ThreadPoolExecutor | None = None  # start's thread, made on its first call

    def start(self, starts: Sequence[Task], reading_order: bool = False) -> Future[None]:
        """``run`` on a thread of the lanes' own, for a caller that goes on meanwhile (a stream handing
        out the audio as its tasks make it): that thread is the lane the caller would have been."""
        if self._runner is None:
            self._runner = ThreadPoolExecutor(1, thread_name_prefix=f"{self._name}-runner")
        return self._runner.submit(self.run, starts, reading_order)

    def run(self, starts: Sequence[Task], reading_order: bool = False) -> None:
        """Run ``starts`` and every task they return, then return; the first error raised by a task is
        raised here once the running tasks have finished (no new task starts after it). A free lane
        takes the next start, else the oldest follower; with ``reading_order``, the task earliest in
        reading order."""
        call = _Call(starts, reading_order)
        helpers = [self._helpers.submit(call.lane) for _ in range(min(self.n, len(starts) + 1) - 1)]
        call.lane()
        for helper in helpers:
            helper.result()
        if call.error is not None:
            raise call.error


class _Call:
    """One ``Lanes.run``: what waits, how many lanes are busy, the first error."""

    def __init__(self, starts: Sequence[Task], reading_order: bool):
        # Waiting starts by their index; waiting followers by key, least first: in reading order their
        # task's key and their own index (a start's key is (i,)), else the order they were returned in.
        self._starts: list[tuple[tuple[int, ...], Task]] = [((i,), task) for i, task in enumerate(starts)]
        self._followers: list[tuple[tuple[int, ...], Task]] = []
        self._reading_order = reading_order
        self._returned = itertools.count()
        self._starts_running = 0
        self._busy = 0
        self._changed = threading.Condition()
        self.error: BaseException | None = None

    def _take(self) -> tuple[tuple[int, ...], Task, bool] | None:
        """The next task, its key and whether it is a start, waiting while others run; None when the
        call is over (nothing waits, nothing runs) or failed. The next start before any follower;
        in reading order only while no other start runs or when it comes first: one lane readies the
        next sentence while the others make the audio the listener needs next."""
        with self._changed:
            while True:
                if self.error is not None:
                    return None
                starts, followers = self._starts, self._followers
                if starts and (
                    not self._reading_order
                    or self._starts_running == 0
                    or not followers
                    or starts[0][0] < followers[0][0]
                ):
                    self._busy += 1
                    self._starts_running += 1
                    return (*heapq.heappop(starts), True)
                if followers:
                    self._busy += 1
                    return (*heapq.heappop(followers), False)
                if self._busy == 0:
                    return None
                self._changed.wait()

    def lane(self) -> None:
        while (taken := self._take()) is not None:
            key, task, start = taken
            after: Sequence[Task] = ()
            error: BaseException | None = None
            try:
                after = task()
            except BaseException as exc:  # raised to the caller of run, after the other lanes stop
                error = exc
            with self._changed:
                self._busy -= 1
                self._starts_running -= start
                if error is not None and self.error is None:
                    self.error = error
                for j, follower in enumerate(after):
                    follows = (*key, j) if self._reading_order else (next(self._returned),)
                    heapq.heappush(self._followers, (follows, follower))
                self._changed.notify_all()
