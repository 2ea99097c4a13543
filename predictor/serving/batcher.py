"""A bounded queue in front of the engine, drained by the threads that own its copies (ENGINE_WORKERS:
one by default, each with a copy of the engine of its own and its share of CPU_THREADS).

With several workers there can be a solo worker too: a copy with every CPU thread, which takes a call
only when it would run alone (nothing running, nothing else queued), while the workers take calls
only when another is running or waiting, at most as many at once as there are workers. One request at
a time runs on all the CPUs; under load each CPU runs its own call, no CPU shared by two pools.

Requests are admitted or refused at once: when MAX_QUEUE requests already wait, the next gets
Overloaded (503 + Retry-After over REST, UNAVAILABLE over gRPC) instead of a place in an unbounded
queue that ends in timeouts or OOM. A request still waiting after REQUEST_TIMEOUT_S is dropped before
it costs engine time, busy engine or not; one whose caller went away (its future was cancelled) leaves
the queue at once. A caller that goes away once its batch is running has its result dropped.

Compatible requests (same synthesis parameters, no seed) are merged into one engine call of up to
MAX_BATCH_SIZE texts; the first waits at most MAX_BATCH_DELAY_MS for companions. Seeded requests run
alone, so a seed always sees the same sentence positions.

A streamed request (submit_stream) runs alone too: the engine thread hands each decoder window to the
event loop as it is decoded and, before decoding the next, checks whether the caller went away; if
so it stops there, so a hang-up costs at most one window of engine time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from predictor.engine.base import SynthesisParams
from predictor.engine.words import Word
from predictor.errors import Overloaded
from predictor.observability import memory, metrics

log = logging.getLogger("predictor.batcher")

# How long the service stays idle before freed heap is given back (MEMORY_TRIM). Done
# at once, every request after any pause faulted its pages in again: a 26-character sentence alone
# took 71.4 ms against 68.4 with no trim, 99 characters 247.5 against 241.9 (medians of 15,
# alternated, 2 CPUs). A second keeps requests that follow each other from paying for it, and an
# idle pod still returns its memory within a second.
IDLE_TRIM_DELAY_S = 1.0
# How much resident memory must have grown since the last trim for the next to run. After short
# requests on onnxruntime a trim gave back 8 of 452 MiB (onnxruntime keeps its working memory in its
# own arena, which no trim reaches), and the next 26-character sentence faulted 318 pages in again:
# 60.6 against 57.2 ms after 3 s of quiet (in process, medians of 6). After long requests the torch
# engine frees hundreds of MiB of heap (docs/reliability.md, "Memory").
TRIM_MIN_GROWTH_BYTES = 64 * 1024 * 1024

RunBatch = Callable[[Sequence[str], SynthesisParams], list[np.ndarray]]
# (text, params, following): following, the text continues a stream whose earlier audio is playing.
RunStream = Callable[[str, SynthesisParams, bool], Iterator[tuple[np.ndarray, bool]]]
RunAligned = Callable[[list[str], SynthesisParams], list[tuple[np.ndarray, list[Word]]]]
OnPiece = Callable[[np.ndarray, bool], None]


@dataclass(frozen=True)
class Worker:
    """What one engine thread runs: the calls of its own copy of the engine."""

    run_batch: RunBatch
    run_stream: RunStream | None = None
    run_aligned: RunAligned | None = None


@dataclass(eq=False)
class _Job:
    texts: list[str]
    params: SynthesisParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.monotonic)
    on_piece: OnPiece | None = None  # set for a streamed request: called on the loop per window
    aligned: bool = False  # answered with each text's words' times too (word timestamps): runs alone
    following: bool = False  # a later call of a request being served: neither refused nor dropped

    def mergeable_with(self, other: _Job) -> bool:
        alone = self.on_piece is not None or other.on_piece is not None or self.aligned or other.aligned
        return not alone and self.params.seed is None and self.params == other.params

    def resolve(
        self, result: tuple[list[Any], float] | None = None, error: BaseException | None = None
    ) -> None:
        def settle() -> None:
            if self.future.done():  # cancelled by a caller that went away
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        _post(self.loop, settle)


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: object) -> bool:
    """Hand `callback` to the event loop from the engine thread; False once that loop has closed.

    A drain that timed out (DRAIN_TIMEOUT_S) ends the loop while the engine may still be inside the
    request it cut off: that request's caller is gone, so what it would have been handed is dropped.
    """
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        if not loop.is_closed():
            raise
        return False
    return True


class Batcher:
    def __init__(
        self,
        run_batch: RunBatch,
        *,
        max_batch_size: int,
        max_delay_s: float,
        max_queue: int,
        timeout_s: float,
        trim_when_idle: bool = True,
        run_stream: RunStream | None = None,
        run_aligned: RunAligned | None = None,
        more_workers: Sequence[Worker] = (),
    ):
        # Every worker can run every kind of job: the first one's calls say which kinds there are.
        self._workers = [Worker(run_batch, run_stream, run_aligned), *more_workers]
        self._solo: Worker | None = None  # add_workers makes the first worker the solo one
        self._busy = 0  # workers (the solo one included) running a job: an idle trim waits until none is
        self._max_batch_size = max_batch_size
        self._max_delay_s = max_delay_s
        self._max_queue = max_queue
        self._timeout_s = timeout_s
        self._trim_when_idle = trim_when_idle
        self._trim_due = False
        self._trim_at = 0.0  # monotonic time the due trim runs, if nothing comes before it
        self._queue: deque[_Job] = deque()
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        # The idle trim's thread waits on its own condition of the same lock: notified only when a trim
        # may be due, so an engine thread is never woken for it (_trim_when_due says why).
        self._trim_cond = threading.Condition(lock)
        self._job_seconds = 1.0  # moving average of engine time per call: sizes Retry-After
        self._threads = [
            threading.Thread(
                target=self._serve, args=(w,), name=f"engine-{n}" if n else "engine", daemon=True
            )
            for n, w in enumerate(self._workers)
        ]
        for thread in self._threads:
            thread.start()
        if trim_when_idle:
            threading.Thread(target=self._trim_when_due, name="memory-trim", daemon=True).start()

    def add_workers(self, workers: Sequence[Worker]) -> None:
        """Make the one worker so far the solo one and serve the overlapping calls on ``workers``
        (their copies made after ready: until now the first worker ran every call)."""
        with self._cond:
            assert self._solo is None and len(self._workers) == 1, "workers are added once, to one"
            self._solo = self._workers[0]
            self._workers = list(workers)
            threads = [
                threading.Thread(target=self._serve, args=(w,), name=f"engine-{n + 1}", daemon=True)
                for n, w in enumerate(workers)
            ]
            self._threads += threads
            self._cond.notify_all()
        for thread in threads:
            thread.start()

    def trim_when_idle(self) -> None:
        """Every request has been answered: once nothing has run or waited for IDLE_TRIM_DELAY_S, the
        memory they freed goes back to the kernel (observability/memory.py says why)."""
        if not self._trim_when_idle:
            return
        with self._cond:
            self._trim_due = True
            self._trim_at = time.monotonic() + IDLE_TRIM_DELAY_S
            self._trim_cond.notify()

    def hold_trim(self) -> None:
        """A request came in: the service is not idle, so no trim is due (trim_when_idle asks again)."""
        with self._cond:
            self._trim_due = False

    def submit(
        self,
        texts: list[str],
        params: SynthesisParams,
        on_piece: OnPiece | None = None,
        aligned: bool = False,
        following: bool = False,
    ) -> asyncio.Future:
        """Queue a request (called on the event loop).

        The future resolves to (one array per text, engine seconds of the call that made them). With
        on_piece, the one text is streamed instead: on_piece(audio, last) is called on the event loop
        for each window, all before the future resolves to ([], engine seconds); cancelling the
        future stops the stream at the next window. ``aligned``: the texts run alone (no other job's
        texts in the call) and resolve to ([(audio, its words' samples)] per text, engine seconds).
        ``following``: a later engine call of a request whose first one ran (its next segments): it
        queues at the back as any call does, but is never refused for a full queue nor dropped for its
        wait, since refusing it would throw away the engine time the request already had.
        """
        kinds = self._workers[0]
        if on_piece is not None and (kinds.run_stream is None or len(texts) != 1):
            raise ValueError("a streamed request needs run_stream and exactly one text")
        if aligned and (kinds.run_aligned is None or on_piece is not None):
            raise ValueError("an aligned request needs run_aligned, and is not streamed")
        loop = asyncio.get_running_loop()
        with self._cond:
            if len(self._queue) >= self._max_queue and not following:
                metrics.REJECTED.labels("queue_full").inc()
                retry = max(1, math.ceil(len(self._queue) * self._job_seconds))
                raise Overloaded(
                    f"the queue is full ({self._max_queue} requests waiting); retry later", retry
                )
            job = _Job(
                texts=texts,
                params=params,
                future=loop.create_future(),
                loop=loop,
                on_piece=on_piece,
                aligned=aligned,
                following=following,
            )
            self._queue.append(job)
            metrics.QUEUE_DEPTH.set(len(self._queue))
            # All: which thread may take it depends on the thread (the solo one or a worker).
            self._cond.notify_all()
        # The engine thread only checks the timeout when it reaches a job; behind a long or stuck engine
        # call that can be long after REQUEST_TIMEOUT_S, so the loop drops a job still queued by then.
        expiry = None if following else loop.call_later(self._timeout_s, self._expire, job)
        job.future.add_done_callback(lambda future: self._settled(job, future, expiry))
        return job.future

    def _withdraw(self, job: _Job) -> bool:
        """Take `job` out of the queue if the engine thread has not taken it yet (on the event loop)."""
        with self._cond:
            if job not in self._queue:
                return False
            self._queue.remove(job)
            metrics.QUEUE_DEPTH.set(len(self._queue))
            self._cond.notify_all()  # one call fewer waiting: the solo thread may take the one left
            return True

    def _expire(self, job: _Job) -> None:
        if job.future.done():  # cancelled, its callback not run yet: that one withdraws it
            return
        if self._withdraw(job):
            metrics.REJECTED.labels("timeout").inc()
            job.future.set_exception(
                Overloaded(f"dropped after {self._timeout_s:.1f} s in the queue (REQUEST_TIMEOUT_S)", 1)
            )

    def _settled(self, job: _Job, future: asyncio.Future, expiry: asyncio.TimerHandle | None) -> None:
        if expiry is not None:
            expiry.cancel()
        # A caller that went away gives its place back at once, not when the engine thread reaches it:
        # otherwise abandoned requests fill MAX_QUEUE and live ones are refused.
        if future.cancelled() and self._withdraw(job):
            metrics.REJECTED.labels("cancelled").inc()

    # --- the engine thread -----------------------------------------------------------------
    def _serve(self, worker: Worker) -> None:
        while True:
            batch = self._next_batch(worker)
            settle: Sequence[Callable[[], None]] = ()
            try:
                settle = self._run(worker, batch)
            finally:
                del batch  # this thread's references: an idle trim must find them freed
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()  # the solo thread may take the next call now
                    if self._busy == 0 and self._trim_due:
                        self._trim_cond.notify()  # a trim put off while this ran may be due now
            # Answered only now, once this worker counts as free: a caller's next request, sent the
            # moment this one is answered, finds nothing running (the solo worker's lone call).
            for answer in settle:
                answer()
            del settle

    def _run(self, worker: Worker, batch: list[_Job]) -> Sequence[Callable[[], None]]:
        """Run one batch; returns how to answer its jobs (called once the worker counts as free)."""
        texts = [t for job in batch for t in job.texts]
        metrics.BATCH_SIZE.observe(len(texts))
        start = time.monotonic()
        if batch[0].on_piece is not None:
            return self._stream(worker, batch[0], start)
        try:
            if batch[0].aligned:
                assert worker.run_aligned is not None  # submit checked
                audio: list[Any] = worker.run_aligned(texts, batch[0].params)
            else:
                audio = worker.run_batch(texts, batch[0].params)
        except BaseException as exc:  # the engine's error belongs to the requests that ran
            return [partial(job.resolve, error=exc) for job in batch]
        elapsed = time.monotonic() - start
        self._job_seconds = 0.8 * self._job_seconds + 0.2 * elapsed
        answers: list[Callable[[], None]] = []
        offset = 0
        for job in batch:
            answers.append(partial(job.resolve, result=(audio[offset : offset + len(job.texts)], elapsed)))
            offset += len(job.texts)
        return answers

    def _stream(self, worker: Worker, job: _Job, start: float) -> Sequence[Callable[[], None]]:
        assert worker.run_stream is not None and job.on_piece is not None
        on_piece = job.on_piece
        try:
            for audio, last in worker.run_stream(job.texts[0], job.params, job.following):
                if not _post(job.loop, on_piece, audio, last):
                    break  # the server stopped: nobody is left to hand the rest to
                if job.future.cancelled():  # the caller went away: stop before the next window
                    metrics.REJECTED.labels("cancelled").inc()
                    break
        except BaseException as exc:  # the engine's error belongs to the request that ran
            return [partial(job.resolve, error=exc)]
        elapsed = time.monotonic() - start
        self._job_seconds = 0.8 * self._job_seconds + 0.2 * elapsed
        return [partial(job.resolve, result=([], elapsed))]

    def _next_batch(self, worker: Worker) -> list[_Job]:
        with self._cond:
            first = self._take(worker)
            batch, size = [first], len(first.texts)
            deadline = time.monotonic() + self._max_delay_s
            while size < self._max_batch_size and first.params.seed is None and first.on_piece is None:
                companion = next(
                    (
                        j
                        for j in self._queue
                        if j.mergeable_with(first) and size + len(j.texts) <= self._max_batch_size
                    ),
                    None,
                )
                if companion is not None:
                    self._queue.remove(companion)
                    metrics.QUEUE_DEPTH.set(len(self._queue))
                    if self._admit(companion):
                        batch.append(companion)
                        size += len(companion.texts)
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return batch

    def _may_take(self, worker: Worker) -> bool:
        """Whether this thread takes the next job now (under the lock): any thread when there is no
        solo worker; else the solo thread a call that would run alone, the workers the others, up to
        one running call per worker."""
        if not self._queue:
            return False
        if self._solo is None:
            return True
        if worker is self._solo:  # read each time: add_workers makes the first worker the solo one
            return self._busy == 0 and len(self._queue) == 1
        return self._busy < len(self._workers) and (self._busy > 0 or len(self._queue) > 1)

    def _take(self, worker: Worker) -> _Job:
        """The oldest live job; expired and abandoned ones are resolved or skipped on the way."""
        while True:
            while not self._may_take(worker):
                self._cond.wait()
            job = self._queue.popleft()
            metrics.QUEUE_DEPTH.set(len(self._queue))
            if self._admit(job):
                self._busy += 1
                return job
            self._cond.notify_all()  # as in _withdraw

    def _trim_when_due(self) -> None:
        """The idle trim's own thread, on its own condition: an engine thread woken while idle (by the
        trim's timer, or by a notify of the queue's condition, as when it trimmed) often ran the next
        request slower. In process, a 26-character sentence on lanes every 1.5 s: 57.6-60.8 ms on an
        engine thread that slept until the request, 69.3-76.9 ms on one a timer had woken a second
        after the last (medians of 16, three runs each); two batchers side by side, trim on against
        off, 65.4-84.4 against 58.4-60.5 ms with the engine thread woken, 59.2-62.2 against 60.8-62.9
        ms (a third run 75.7 against 73.7) since. A lone predictor showed no difference either way."""
        with self._cond:
            while True:
                if not (self._trim_due and not self._queue and self._busy == 0):
                    self._trim_cond.wait()
                    continue
                wait = self._trim_at - time.monotonic()
                if wait > 0:
                    self._trim_cond.wait(wait)
                    continue
                self._trim_due = False
                # Outside the lock: a request arriving meanwhile is queued, and waits for the trim
                # (milliseconds) rather than for the lock.
                self._cond.release()
                try:
                    memory.release_grown(TRIM_MIN_GROWTH_BYTES)
                finally:
                    self._cond.acquire()

    def _admit(self, job: _Job) -> bool:
        waited = time.monotonic() - job.enqueued
        if job.future.cancelled():
            metrics.REJECTED.labels("cancelled").inc()
            return False
        if waited > self._timeout_s and not job.following:
            metrics.REJECTED.labels("timeout").inc()
            job.resolve(error=Overloaded(f"dropped after {waited:.1f} s in the queue (REQUEST_TIMEOUT_S)", 1))
            return False
        metrics.QUEUE_WAIT_SECONDS.observe(waited)
        return True
