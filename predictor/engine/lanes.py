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
sentences' serial parts overlap the chunks, then the oldest waiting task.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

# A task returns the tasks that may run once it is done.
Task = Callable[[], Sequence["Task"]]


class Lanes:
    """``n`` lanes: the thread that calls ``run`` and n - 1 helper threads, kept for the engine's life."""

    def __init__(self, n: int, name: str = "engine-lane"):
        if n < 2:
            raise ValueError(f"lanes need at least 2 lanes, got {n}")
        self.n = n
        self._helpers = ThreadPoolExecutor(n - 1, thread_name_prefix=name)

    def run(self, starts: Sequence[Task]) -> None:
        """Run ``starts`` and every task they return, then return; the first error raised by a task is
        raised here once the running tasks have finished (no new task starts after it)."""
        call = _Call(starts)
        helpers = [self._helpers.submit(call.lane) for _ in range(min(self.n, len(starts) + 1) - 1)]
        call.lane()
        for helper in helpers:
            helper.result()
        if call.error is not None:
            raise call.error


class _Call:
    """One ``Lanes.run``: what waits, how many lanes are busy, the first error."""

    def __init__(self, starts: Sequence[Task]):
        self._starts: deque[Task] = deque(starts)
        self._after: deque[Task] = deque()
        self._busy = 0
        self._changed = threading.Condition()
        self.error: BaseException | None = None

    def _take(self) -> Task | None:
        """The next task, waiting while others run; None when the call is over (nothing waits, nothing
        runs) or failed."""
        with self._changed:
            while True:
                if self.error is not None:
                    return None
                if self._starts or self._after:
                    self._busy += 1
                    return self._starts.popleft() if self._starts else self._after.popleft()
                if self._busy == 0:
                    return None
                self._changed.wait()

    def lane(self) -> None:
        while (task := self._take()) is not None:
            after: Sequence[Task] = ()
            error: BaseException | None = None
            try:
                after = task()
            except BaseException as exc:  # raised to the caller of run, after the other lanes stop
                error = exc
            with self._changed:
                self._busy -= 1
                if error is not None and self.error is None:
                    self.error = error
                self._after.extend(after)
                self._changed.notify_all()
