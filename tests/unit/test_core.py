"""The core in one process: Batcher and TTSService driven by a fake engine, no sockets, no model.

The fake is honest about the engine interface (predictor/engine/__init__.py): one array per text,
its length set by the text and length_scale, calls serialized on the batcher's thread. It records
every call, can be held inside a call until released, and can be told to fail. Each test runs in a
fresh event loop; waits are bounded only to turn a hang into a failure, never to measure speed.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from prometheus_client import REGISTRY

from predictor.api.handlers import predictor_error_response
from predictor.config import Settings
from predictor.engine.base import Engine, SynthesisParams
from predictor.engine.words import Word
from predictor.errors import BadRequest, EngineError, NotReady, Overloaded

# The predictor imports, in one place (the issue-10 restructure rewrites these paths).
from predictor.serving import pipeline
from predictor.serving.batcher import Batcher, Worker
from predictor.serving.service import TTSService

T = TypeVar("T")

HANG_GUARD_S = 5.0  # a wait that passes in milliseconds; this long only when the behaviour is broken


class FakeEngine(Engine):
    """Speaks 100 samples per letter or digit (times length_scale); punctuation alone says nothing."""

    name = "fake"
    supports_seed = True
    SAMPLES_PER_CHAR = 100

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], SynthesisParams]] = []
        self.loaded_from: Path | None = None
        self.failure: BaseException | None = None
        self._gate = threading.Condition()
        self._held = False
        self._passes = 0  # calls let through while held

    # --- test controls ---------------------------------------------------------------------
    def hold(self) -> None:
        """Calls from now on stay inside synthesize until release() or let_one_through()."""
        with self._gate:
            self._held = True

    def release(self) -> None:
        with self._gate:
            self._held = False
            self._gate.notify_all()

    def let_one_through(self) -> None:
        """Finish the held call and hold the next one again."""
        with self._gate:
            self._passes += 1
            self._gate.notify_all()

    def fail_with(self, error: BaseException | None) -> None:
        """Calls that start from now on raise `error` (None: succeed again)."""
        self.failure = error

    @property
    def texts_seen(self) -> list[str]:
        return [t for texts, _ in self.calls for t in texts]

    @classmethod
    def samples_for(cls, text: str, length_scale: float = 1.0) -> int:
        return round(sum(c.isalnum() for c in text) * cls.SAMPLES_PER_CHAR * length_scale)

    # --- the engine interface --------------------------------------------------------------
    def load(self, model_dir: Path) -> None:
        self.loaded_from = model_dir

    def synthesize(self, texts: Sequence[str], params: SynthesisParams) -> list[np.ndarray]:
        failure = self.failure
        self.calls.append((list(texts), params))
        with self._gate:
            # Longer than the tests' own guard, so a test fails on what it waited for, not on this.
            if not self._gate.wait_for(lambda: not self._held or self._passes > 0, 2 * HANG_GUARD_S):
                raise RuntimeError("the fake engine was held and never released")
            if self._held:
                self._passes -= 1
        if failure is not None:
            raise failure
        scale = params.length_scale or 1.0
        return [np.full(self.samples_for(t, scale), 0.25, dtype=np.float32) for t in texts]

    @property
    def sample_rate(self) -> int:
        return 16_000

    @property
    def voices(self) -> list[str]:
        return ["fake", "fake-slow"]


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run a test body in a fresh loop; anything the loop reports (e.g. an unretrieved exception,
    a result set on a cancelled future) fails the test."""
    reported: list[dict[str, Any]] = []

    async def body() -> T:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        return await main()

    result = asyncio.run(body())
    assert not reported, reported
    return result


async def until(condition: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANG_GUARD_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {HANG_GUARD_S} s")
        await asyncio.sleep(0.001)


def rejected(reason: str) -> float:
    return REGISTRY.get_sample_value("tts_rejected_requests_total", {"reason": reason}) or 0.0


def make_batcher(
    engine: FakeEngine,
    *,
    max_batch_size: int = 1,
    max_delay_s: float = 0.0,
    max_queue: int = 8,
    timeout_s: float = 30.0,
) -> Batcher:
    return Batcher(
        engine.synthesize,
        max_batch_size=max_batch_size,
        max_delay_s=max_delay_s,
        max_queue=max_queue,
        timeout_s=timeout_s,
    )


def make_service(engine: FakeEngine, **settings: Any) -> TTSService:
    knobs: dict[str, Any] = {"max_batch_size": 1, "max_batch_delay_ms": 0.0, "max_queue": 8}
    service = TTSService(Settings(**(knobs | settings)))
    service.mark_ready(engine)
    return service


async def plug(engine: FakeEngine, submit: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
    """Start a request and hold the engine inside it, so what follows queues behind it."""
    engine.hold()
    before = len(engine.calls)
    task = asyncio.ensure_future(submit())
    await until(lambda: len(engine.calls) > before, "the plug request reached the engine")
    return task


QUIET = SynthesisParams()


# --- batching -------------------------------------------------------------------------------
def test_compatible_requests_share_one_engine_call_and_each_gets_its_own_audio() -> None:
    engine = FakeEngine()
    # A full batch runs at once, so the long delay only guarantees nobody leaves before merging.
    batcher = make_batcher(engine, max_batch_size=4, max_delay_s=10.0)
    requests = [["One."], ["Two and a half.", "Three!"], ["Four, finally."]]

    async def main() -> list[tuple[list[np.ndarray], float]]:
        return list(await asyncio.gather(*(batcher.submit(texts, QUIET) for texts in requests)))

    results = run(main)

    assert len(engine.calls) == 1
    assert engine.calls[0][0] == ["One.", "Two and a half.", "Three!", "Four, finally."]
    for texts, (audio, _seconds) in zip(requests, results, strict=True):
        assert [len(a) for a in audio] == [FakeEngine.samples_for(t) for t in texts]
    assert len({seconds for _audio, seconds in results}) == 1, "one call, one engine time for all"


def test_a_batch_never_exceeds_max_batch_size() -> None:
    engine = FakeEngine()
    batcher = make_batcher(engine, max_batch_size=2, max_delay_s=0.05)

    async def main() -> None:
        first = await plug(engine, lambda: batcher.submit(["Plug."], QUIET))
        waiting = [batcher.submit([f"Request {i}."], QUIET) for i in range(5)]
        engine.release()
        await asyncio.gather(first, *waiting)

    run(main)

    assert [texts for texts, _ in engine.calls] == [
        ["Plug."],
        ["Request 0.", "Request 1."],
        ["Request 2.", "Request 3."],
        ["Request 4."],
    ]


def test_different_parameters_and_seeded_requests_run_in_calls_of_their_own() -> None:
    engine = FakeEngine()
    batcher = make_batcher(engine, max_batch_size=8, max_delay_s=0.02)
    slow = SynthesisParams(length_scale=2.0)
    seeded = SynthesisParams(seed=7)

    async def main() -> list[tuple[list[np.ndarray], float]]:
        first = await plug(engine, lambda: batcher.submit(["Plug."], QUIET))
        waiting = [
            batcher.submit(["Slow one."], slow),
            batcher.submit(["Seeded one."], seeded),
            batcher.submit(["Seeded two."], seeded),
            batcher.submit(["Default."], QUIET),
        ]
        engine.release()
        return list(await asyncio.gather(first, *waiting))

    results = run(main)

    # Same-parameter seeded requests still run alone: a seed must always see the same sentence positions.
    assert sorted(texts for texts, _ in engine.calls) == [
        ["Default."],
        ["Plug."],
        ["Seeded one."],
        ["Seeded two."],
        ["Slow one."],
    ]
    assert len(results[1][0][0]) == FakeEngine.samples_for("Slow one.", 2.0)


# --- shedding and timeouts ------------------------------------------------------------------
def test_a_full_queue_refuses_at_once_with_the_retry_after_the_http_layer_sends() -> None:
    engine = FakeEngine()
    service = make_service(engine, max_queue=2)
    shed_before = rejected("queue_full")

    async def main() -> tuple[Overloaded, list[Any]]:
        first = await plug(engine, lambda: service.synthesize(["Plug."], QUIET))
        queued = [asyncio.ensure_future(service.synthesize([f"Queued {i}."], QUIET)) for i in range(2)]
        await asyncio.sleep(0)  # let both reach the queue
        with pytest.raises(Overloaded) as refused:
            await service.synthesize(["One too many."], QUIET)
        engine.release()
        done = await asyncio.gather(first, *queued)
        after = await service.synthesize(["Room again."], QUIET)
        return refused.value, [*done, after]

    error, served = run(main)

    assert error.message == "the queue is full (2 requests waiting); retry later"
    # Two waiting, no engine call finished yet, so the per-call estimate is still its initial 1 s.
    assert error.retry_after_s == math.ceil(2 * 1.0)
    response = asyncio.run(predictor_error_response(None, error))  # type: ignore[arg-type]
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"
    assert rejected("queue_full") - shed_before == 1
    assert "One too many." not in engine.texts_seen
    assert len(served) == 4


def test_a_request_queued_past_the_timeout_is_dropped_without_engine_time() -> None:
    engine = FakeEngine()
    batcher = make_batcher(engine, timeout_s=0.1)
    timeouts_before = rejected("timeout")

    async def main() -> BaseException | None:
        first = await plug(engine, lambda: batcher.submit(["Plug."], QUIET))
        late = batcher.submit(["Too late."], QUIET)
        await asyncio.sleep(0.2)
        engine.release()
        await first
        return (await asyncio.gather(late, return_exceptions=True))[0]

    outcome = run(main)

    assert isinstance(outcome, Overloaded)
    assert "REQUEST_TIMEOUT_S" in outcome.message
    assert outcome.retry_after_s == 1
    assert engine.texts_seen == ["Plug."]
    assert rejected("timeout") - timeouts_before == 1


def test_a_later_segment_of_a_request_being_served_is_neither_refused_for_a_full_queue_nor_dropped() -> None:
    engine = FakeEngine()
    batcher = make_batcher(engine, max_queue=1, timeout_s=0.1)
    refused_before, timeouts_before = rejected("queue_full"), rejected("timeout")

    async def main() -> list[Any]:
        first = await plug(engine, lambda: batcher.submit(["Plug."], QUIET))
        waiting = batcher.submit(["Fills the queue."], QUIET)
        # The queue is full and both would wait past the timeout: a fresh call would be refused.
        later = batcher.submit(["Its next segment."], QUIET, following=True)
        await asyncio.sleep(0.2)
        engine.release()
        await first
        return await asyncio.gather(waiting, later, return_exceptions=True)

    waiting, later = run(main)

    assert isinstance(waiting, Overloaded) and "REQUEST_TIMEOUT_S" in waiting.message
    assert not isinstance(later, BaseException) and len(later[0]) == 1
    assert engine.texts_seen == ["Plug.", "Its next segment."]
    assert rejected("queue_full") == refused_before and rejected("timeout") - timeouts_before == 1


def test_a_queued_request_times_out_while_the_engine_is_still_busy() -> None:
    engine = FakeEngine()
    batcher = make_batcher(engine, timeout_s=0.1)

    async def main() -> BaseException | None:
        first = await plug(engine, lambda: batcher.submit(["Plug."], QUIET))
        late = batcher.submit(["Stuck behind the plug."], QUIET)
        try:
            await until(late.done, "the queued request got its 503 while the engine is still busy")
            return late.exception()
        finally:
            engine.release()
            await first

    outcome = run(main)

    assert isinstance(outcome, Overloaded)
    assert "REQUEST_TIMEOUT_S" in outcome.message
    assert engine.texts_seen == ["Plug."]


def test_the_engine_thread_drops_an_expired_job_the_event_loop_was_too_busy_to_drop() -> None:
    engine = FakeEngine()
    batcher = make_batcher(engine, timeout_s=0.1)
    timeouts_before = rejected("timeout")

    async def main() -> BaseException | None:
        first = await plug(engine, lambda: batcher.submit(["Plug."], QUIET))
        late = batcher.submit(["Too late."], QUIET)
        # Block the loop (no timer can fire) past the timeout, until the engine thread has taken the job.
        time.sleep(0.15)
        engine.release()
        deadline = time.monotonic() + HANG_GUARD_S
        while REGISTRY.get_sample_value("tts_queue_depth") != 0:
            assert time.monotonic() < deadline, "the engine thread never took the queued job"
            time.sleep(0.001)
        await first
        return (await asyncio.gather(late, return_exceptions=True))[0]

    outcome = run(main)

    assert isinstance(outcome, Overloaded)
    assert "REQUEST_TIMEOUT_S" in outcome.message
    assert engine.texts_seen == ["Plug."]
    assert rejected("timeout") - timeouts_before == 1


# --- callers that go away -------------------------------------------------------------------
def test_a_caller_cancelled_while_queued_costs_no_engine_time() -> None:
    engine = FakeEngine()
    service = make_service(engine)
    cancelled_before = rejected("cancelled")

    async def main() -> None:
        first = await plug(engine, lambda: service.synthesize(["Plug."], QUIET))
        gone = asyncio.ensure_future(service.synthesize(["Nobody is listening."], QUIET))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        engine.release()
        await first
        await service.synthesize(["Next."], QUIET)
        assert await service.drain(HANG_GUARD_S), "a cancelled caller must not hold up drain"

    run(main)

    assert engine.texts_seen == ["Plug.", "Next."]
    assert rejected("cancelled") - cancelled_before == 1


def test_a_cancelled_caller_frees_its_place_in_the_queue() -> None:
    engine = FakeEngine()
    service = make_service(engine, max_queue=1)

    async def main() -> None:
        first = await plug(engine, lambda: service.synthesize(["Plug."], QUIET))
        gone = asyncio.ensure_future(service.synthesize(["Gave up."], QUIET))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        try:
            waiting = asyncio.ensure_future(service.synthesize(["Still here."], QUIET))
            await asyncio.sleep(0)
            assert not waiting.done(), waiting.exception()
        finally:
            engine.release()
        await asyncio.gather(first, waiting)

    run(main)

    assert engine.texts_seen == ["Plug.", "Still here."]


def test_a_caller_cancelled_mid_batch_has_its_result_dropped_and_companions_still_served() -> None:
    engine = FakeEngine()
    service = make_service(engine, max_batch_size=2, max_batch_delay_ms=20.0)

    async def main() -> list[np.ndarray]:
        first = await plug(engine, lambda: service.synthesize(["Plug."], QUIET))
        gone = asyncio.ensure_future(service.synthesize(["Leaving early."], QUIET))
        stays = asyncio.ensure_future(service.synthesize(["Staying put."], QUIET))
        await asyncio.sleep(0)
        engine.let_one_through()  # the plug finishes; the merged batch enters and is held
        await until(lambda: len(engine.calls) == 2, "the merged batch reached the engine")
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        engine.release()
        await first
        result = await stays
        after = await service.synthesize(["After."], QUIET)  # the engine thread survived the drop
        return [*result.audio, *after.audio]

    audio = run(main)  # run() also fails if a result was set on the cancelled future

    assert engine.calls[1][0] == ["Leaving early.", "Staying put."], "the work was done, then dropped"
    assert [len(a) for a in audio] == [
        FakeEngine.samples_for("Staying put."),
        FakeEngine.samples_for("After."),
    ]


# --- drain ----------------------------------------------------------------------------------
def test_drain_waits_for_admitted_work_and_refuses_new_requests() -> None:
    engine = FakeEngine()
    service = make_service(engine)

    async def main() -> tuple[bool, list[Any]]:
        running = await plug(engine, lambda: service.synthesize(["Running."], QUIET))
        queued = asyncio.ensure_future(service.synthesize(["Queued, admitted."], QUIET))
        await asyncio.sleep(0)
        draining = asyncio.ensure_future(service.drain(HANG_GUARD_S))
        await asyncio.sleep(0.05)
        assert not draining.done(), "drain returned with work still in flight"
        assert not service.ready
        with pytest.raises(NotReady, match="draining") as refused:
            await service.synthesize(["Too late to start."], QUIET)
        assert refused.value.http_status == 503
        engine.release()
        finished = await draining
        return finished, [running.done(), queued.done(), await running, await queued]

    finished, (running_done, queued_done, running, queued) = run(main)

    assert finished is True
    assert running_done and queued_done, "drain returned before its admitted requests finished"
    assert len(running.audio[0]) == FakeEngine.samples_for("Running.")
    assert len(queued.audio[0]) == FakeEngine.samples_for("Queued, admitted.")
    assert engine.texts_seen == ["Running.", "Queued, admitted."]


def test_two_engine_workers_run_two_calls_at_once_and_the_drain_waits_for_both() -> None:
    first, second = FakeEngine(), FakeEngine()
    # No solo worker (one CPU thread: Settings.solo_worker is false; the solo worker is tested below):
    # the service runs both engines it is given as workers.
    settings = Settings(
        max_batch_size=1, max_batch_delay_ms=0.0, max_queue=8, engine_workers=2, cpu_threads=1
    )
    assert not settings.solo_worker()
    service = TTSService(settings)
    service.mark_ready(first, [second])
    first.hold()
    second.hold()

    async def main() -> tuple[bool, list[int], list[Any]]:
        running = [asyncio.ensure_future(service.synthesize([f"Worker {n}."], QUIET)) for n in (1, 2)]
        await until(lambda: len(first.calls) == len(second.calls) == 1, "one call on each worker")
        queued = asyncio.ensure_future(service.synthesize(["Waits for a worker."], QUIET))
        draining = asyncio.ensure_future(service.drain(HANG_GUARD_S))
        await asyncio.sleep(0.05)
        assert not draining.done(), "drain returned with two calls in flight"
        in_engines = [len(first.calls), len(second.calls)]
        first.release()
        second.release()
        finished = await draining
        return finished, in_engines, [*(await asyncio.gather(*running)), await queued]

    finished, in_engines, answers = run(main)

    assert in_engines == [1, 1], "the third call waited: both workers were busy"
    assert finished is True
    assert sorted(first.texts_seen + second.texts_seen) == sorted(
        ["Worker 1.", "Worker 2.", "Waits for a worker."]
    )
    assert [len(a.audio[0]) for a in answers] == [
        FakeEngine.samples_for(t) for t in ("Worker 1.", "Worker 2.", "Waits for a worker.")
    ]


def test_a_lone_call_runs_on_the_solo_worker_and_calls_that_overlap_on_the_workers_two_at_most() -> None:
    solo, one, two = FakeEngine(), FakeEngine(), FakeEngine()
    settings = Settings(
        max_batch_size=1, max_batch_delay_ms=0.0, max_queue=8, engine_workers=2, cpu_threads=2
    )
    assert settings.solo_worker() and settings.worker_threads() == 1
    service = TTSService(settings)
    service.mark_ready(solo)
    service.add_workers([one, two])

    def workers_seen() -> list[str]:
        return one.texts_seen + two.texts_seen

    async def main() -> dict[str, list[str]]:
        seen: dict[str, list[str]] = {}
        for n in range(3):  # one at a time: each finds nothing else running
            await service.synthesize([f"Alone {n}."], QUIET)
        seen["lone"] = list(solo.texts_seen), workers_seen()
        for engine in (solo, one, two):
            engine.hold()
        a = asyncio.ensure_future(service.synthesize(["A runs alone."], QUIET))
        await until(lambda: "A runs alone." in solo.texts_seen, "A on the solo worker")
        b = asyncio.ensure_future(service.synthesize(["B overlaps A."], QUIET))
        await until(lambda: "B overlaps A." in workers_seen(), "B on a worker")
        c = asyncio.ensure_future(service.synthesize(["C waits."], QUIET))
        await asyncio.sleep(0.1)
        seen["while two run"] = [
            t for e in (solo, one, two) for t in e.texts_seen if t in ("B overlaps A.", "C waits.")
        ]
        solo.release()
        await a
        # B still runs, so C is a call that overlaps another: a worker's, not the solo one's.
        await until(lambda: "C waits." in workers_seen(), "C on a worker")
        one.release()
        two.release()
        await asyncio.gather(b, c)
        seen["solo"] = list(solo.texts_seen)
        return seen

    seen = run(main)

    assert seen["lone"] == (["Alone 0.", "Alone 1.", "Alone 2."], [])
    assert seen["while two run"] == ["B overlaps A."], "a third call started beside two running ones"
    assert seen["solo"] == ["Alone 0.", "Alone 1.", "Alone 2.", "A runs alone."]


def test_workers_added_after_ready_take_the_calls_that_overlap_and_the_first_engine_becomes_the_solo_one() -> (
    None
):
    first, one, two = FakeEngine(), FakeEngine(), FakeEngine()
    settings = Settings(
        max_batch_size=1, max_batch_delay_ms=0.0, max_queue=8, engine_workers=2, cpu_threads=2
    )
    service = TTSService(settings)
    service.mark_ready(first)  # as a cold start does: ready before the workers' copies exist

    async def main() -> tuple[list[str], list[str], list[str]]:
        running = await plug(first, lambda: service.synthesize(["Before the workers."], QUIET))
        waiting = asyncio.ensure_future(service.synthesize(["Waits for an engine."], QUIET))
        await asyncio.sleep(0.05)
        before = list(first.texts_seen)
        service.add_workers([one, two])
        await until(lambda: "Waits for an engine." in one.texts_seen + two.texts_seen, "a worker took it")
        first.release()
        await asyncio.gather(running, waiting)
        await service.synthesize(["Alone again."], QUIET)
        return before, first.texts_seen, one.texts_seen + two.texts_seen

    before, on_first, on_workers = run(main)

    assert before == ["Before the workers."], "one engine so far: the second call waited for it"
    assert on_workers == ["Waits for an engine."]
    assert on_first == ["Before the workers.", "Alone again."], "the first engine became the solo one"


def test_workers_are_at_most_one_per_cpu_thread_and_a_solo_one_exists_where_it_has_more_threads() -> None:
    assert Settings(engine_workers=2, cpu_threads=2).solo_worker()
    assert Settings(engine_workers=2, cpu_threads=8).worker_threads() == 4
    one_cpu = Settings(engine_workers=2, cpu_threads=1)
    assert (one_cpu.workers(), one_cpu.worker_threads(), one_cpu.solo_worker()) == (1, 1, False)
    assert not Settings(engine_workers=1, cpu_threads=8).solo_worker()
    assert Settings(engine_workers=3, cpu_threads=2).workers() == 2


def test_an_engine_error_on_one_worker_fails_its_call_only_and_both_workers_keep_serving() -> None:
    first, second = FakeEngine(), FakeEngine()
    batcher = Batcher(
        first.synthesize,
        max_batch_size=1,
        max_delay_s=0.0,
        max_queue=8,
        timeout_s=30.0,
        more_workers=[Worker(second.synthesize)],
    )
    first.fail_with(RuntimeError("worker one broke"))

    async def main() -> list[Any]:
        broken = await asyncio.gather(
            *(batcher.submit([f"Call {n}."], QUIET) for n in range(4)), return_exceptions=True
        )
        first.fail_with(None)
        after = await asyncio.gather(*(batcher.submit([f"After {n}."], QUIET) for n in range(4)))
        return [*broken, *after]

    outcomes = run(main)

    failed = [o for o in outcomes[:4] if isinstance(o, RuntimeError)]
    # Exactly the calls worker one ran while broken failed; worker two's succeeded.
    assert len(failed) == sum(texts[0].startswith("Call") for texts, _ in first.calls)
    assert all(str(o) == "worker one broke" for o in failed)
    assert all(not isinstance(o, BaseException) for o in outcomes[4:])
    assert len(first.texts_seen) + len(second.texts_seen) == 8


def test_drain_reports_work_still_running_at_its_timeout() -> None:
    engine = FakeEngine()
    service = make_service(engine)

    async def main() -> bool:
        running = await plug(engine, lambda: service.synthesize(["Takes forever."], QUIET))
        try:
            return await service.drain(0.05)
        finally:
            engine.release()
            await running

    assert run(main) is False


def test_a_stream_cut_off_by_the_end_of_its_event_loop_leaves_the_engine_thread_serving(monkeypatch) -> None:
    # A drain that times out ends the event loop while the engine is still inside the request it
    # cut off (CI once saw the engine thread die on 'Event loop is closed' there).
    decoded: list[int] = []
    loop_gone = threading.Event()
    thread_errors: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)

    def run_stream(text: str, params: SynthesisParams, following: bool):
        for n in range(4):
            decoded.append(n)
            yield np.zeros(10, dtype=np.float32), n == 3
            loop_gone.wait(HANG_GUARD_S)

    engine = FakeEngine()
    batcher = Batcher(
        engine.synthesize, run_stream=run_stream, max_batch_size=1, max_delay_s=0, max_queue=4, timeout_s=30
    )

    async def cut_off() -> None:
        pieces: asyncio.Queue[bool] = asyncio.Queue()
        batcher.submit(["Long."], QUIET, on_piece=lambda _audio, last: pieces.put_nowait(last))
        await pieces.get()

    asyncio.run(cut_off())  # returns with the stream's first window handed over, the rest not
    loop_gone.set()

    async def next_request() -> tuple[list[np.ndarray], float]:
        return await asyncio.wait_for(batcher.submit(["After."], QUIET), HANG_GUARD_S)

    audio, _seconds = run(next_request)

    assert len(audio[0]) == FakeEngine.samples_for("After.")
    assert decoded == [0, 1], "the engine went on decoding for a loop that had closed"
    assert not thread_errors, [f"{e.exc_type.__name__}: {e.exc_value}" for e in thread_errors]


def test_requests_before_the_model_is_ready_are_refused_as_cold_start() -> None:
    service = TTSService(Settings())

    async def main() -> None:
        await service.synthesize(["Hello."], QUIET)

    with pytest.raises(NotReady, match="cold start"):
        run(main)


# --- errors ---------------------------------------------------------------------------------
def test_an_engine_error_reaches_every_request_of_its_batch_and_the_engine_thread_survives() -> None:
    engine = FakeEngine()
    service = make_service(engine, max_batch_size=2, max_batch_delay_ms=20.0)
    failure = EngineError("decoder produced NaN")

    async def main() -> tuple[list[Any], Any]:
        first = await plug(engine, lambda: service.synthesize(["Plug."], QUIET))
        batch = [asyncio.ensure_future(service.synthesize([t], QUIET)) for t in ("First.", "Second.")]
        await asyncio.sleep(0)
        engine.fail_with(failure)
        engine.release()
        outcomes = await asyncio.gather(first, *batch, return_exceptions=True)
        engine.fail_with(None)
        return outcomes, await service.synthesize(["Recovered."], QUIET)

    (plugged, *failed), recovered = run(main)

    assert [texts for texts, _ in engine.calls] == [["Plug."], ["First.", "Second."], ["Recovered."]]
    assert failed == [failure, failure]
    assert len(plugged.audio[0]) == FakeEngine.samples_for("Plug.")
    assert len(recovered.audio[0]) == FakeEngine.samples_for("Recovered.")


def test_an_unexpected_engine_exception_propagates_unchanged() -> None:
    engine = FakeEngine()
    service = make_service(engine)
    engine.fail_with(MemoryError("CUDA out of memory"))

    async def main() -> None:
        await service.synthesize(["Big."], QUIET)

    with pytest.raises(MemoryError, match="CUDA out of memory"):
        run(main)


def test_a_text_that_yields_no_audio_is_a_bad_request_naming_its_index() -> None:
    engine = FakeEngine()
    service = make_service(engine)

    async def main() -> None:
        await service.synthesize(["Fine.", "?!"], QUIET)

    with pytest.raises(BadRequest, match=r"text\[1\] has nothing to speak"):
        run(main)
    assert engine.texts_seen == [], "refused before it took a queue place: the engine saw nothing"


@pytest.mark.parametrize(
    ("texts", "params", "message"),
    [
        ([], QUIET, "no text given"),
        (["ok", "  "], QUIET, r"text\[1\] is empty"),
        (["x" * 5001], QUIET, "MAX_TEXT_CHARS=5000"),
        (["ok"], SynthesisParams(voice="nobody"), "unknown voice 'nobody'"),
    ],
)
def test_bad_input_is_refused_before_it_takes_a_place_in_the_queue(
    texts: list[str], params: SynthesisParams, message: str
) -> None:
    engine = FakeEngine()
    service = make_service(engine)

    async def main() -> None:
        await service.synthesize(texts, params)

    with pytest.raises(BadRequest, match=message):
        run(main)
    assert engine.calls == []


def test_default_length_scale_applies_only_where_the_request_sets_none() -> None:
    engine = FakeEngine()
    service = make_service(engine, default_length_scale=2.0)

    async def main() -> tuple[Any, Any]:
        return (
            await service.synthesize(["Default pace."], QUIET),
            await service.synthesize(["Own pace."], SynthesisParams(length_scale=0.5)),
        )

    default, own = run(main)

    assert [p.length_scale for _, p in engine.calls] == [2.0, 0.5]
    assert len(default.audio[0]) == FakeEngine.samples_for("Default pace.", 2.0)
    assert default.sample_rate == 16_000
    assert default.audio_seconds == len(default.audio[0]) / 16_000
    assert len(own.audio[0]) == FakeEngine.samples_for("Own pace.", 0.5)


# --- checks once per request ---------------------------------------------------------------------
class VoiceCountingEngine(FakeEngine):
    """Counts the voice checks; serves one voice besides the default."""

    def __init__(self) -> None:
        super().__init__()
        self.voice_checks = 0

    @property
    def voices(self) -> list[str]:
        return ["fake-voice", "narrator"]

    def check_voice(self, voice: str | None) -> None:
        self.voice_checks += 1
        super().check_voice(voice)


def test_an_admitted_request_checks_its_voice_once_however_many_engine_calls_it_makes() -> None:
    engine = VoiceCountingEngine()
    service = make_service(engine)
    params = SynthesisParams(voice="narrator", noise_scale=0.0, noise_w=0.0)

    async def main() -> tuple[int, int]:
        async with service.admit("rid-1", "/v1/audio/speech"):
            service.check_params(params)  # what the speech route does before its first byte
            for segment in ("One segment.", "Another one.", "A third."):
                await service.synthesize([segment], params)
        admitted = engine.voice_checks
        await service.synthesize(["Not admitted."], params)  # a direct caller: checked on each call
        await service.synthesize(["Again."], params)
        return admitted, engine.voice_checks - admitted

    admitted, direct = run(main)

    assert admitted == 1, f"the admitted request checked its voice {admitted} times"
    assert direct == 2


# --- the pipeline's word times (serving/pipeline.py) -------------------------------------------
class AlignedFake(FakeEngine):
    """FakeEngine that also says when each word is spoken: one after another, its letters' samples."""

    def align_checked(
        self, texts: Sequence[str], params: SynthesisParams
    ) -> list[tuple[np.ndarray, list[Word]]]:
        out = []
        for text, audio in zip(texts, self.synthesize(texts, params), strict=True):
            said, at = [], 0
            for w in text.split():
                n = self.samples_for(w)
                said.append(Word(w, at, at + n))
                at += n
            out.append((audio, said))
        return out


def test_a_segment_with_nothing_to_speak_keeps_its_words_as_points_where_it_stands() -> None:
    service = make_service(AlignedFake(), crossfade_ms=0.0)
    pieces = [[pipeline.Segment(t, QUIET) for t in ("Hello there.", "?!", "Bye now.")]]

    result = run(lambda: pipeline.synthesize_prepared(service, pieces, 0.0, timestamps=True))

    assert result.words is not None
    (words,) = result.words
    hello = FakeEngine.samples_for("Hello there.")
    assert [w.word for w in words] == ["Hello", "there.", "?!", "Bye", "now."]
    assert (words[2].start, words[2].end) == (hello, hello)  # a point, between the two sides
    assert words[3].start == hello and words[-1].end == len(result.audio[0])


# --- the idle trim (MEMORY_TRIM) -------------------------------------------------------------------
def test_the_idle_trim_waits_a_second_of_quiet_and_a_request_meanwhile_puts_it_off(monkeypatch):
    from predictor.serving import batcher as batching

    trims: list[float] = []
    monkeypatch.setattr(batching, "IDLE_TRIM_DELAY_S", 0.3)
    monkeypatch.setattr(batching.memory, "release", lambda: trims.append(time.monotonic()) or True)
    monkeypatch.setattr(batching.memory, "_after_last_trim", None)  # no trim yet: the first always runs
    batcher = make_batcher(FakeEngine())

    asked = time.monotonic()
    batcher.trim_when_idle()
    time.sleep(0.15)
    assert trims == []  # not at once: a request following soon finds its pages where they were
    batcher.hold_trim()  # a request came in
    time.sleep(0.3)
    assert trims == []
    batcher.trim_when_idle()  # answered: idle again, for the whole delay this time
    deadline = time.monotonic() + 5
    while not trims and time.monotonic() < deadline:
        time.sleep(0.01)

    assert len(trims) == 1 and trims[0] - asked >= 0.45 + 0.3 - 0.05


def test_the_idle_trim_runs_on_a_thread_of_its_own_and_wakes_no_engine_thread(monkeypatch):
    from predictor.serving import batcher as batching

    trims: list[str] = []
    monkeypatch.setattr(batching, "IDLE_TRIM_DELAY_S", 0.2)
    monkeypatch.setattr(
        batching.memory, "release", lambda: trims.append(threading.current_thread().name) or True
    )
    monkeypatch.setattr(batching.memory, "_after_last_trim", None)
    batcher = make_batcher(FakeEngine())
    woken: list[str] = []  # an engine thread asks whether it may take a job each time it wakes
    may_take = batcher._may_take
    monkeypatch.setattr(batcher, "_may_take", lambda worker: woken.append("woken") or may_take(worker))

    batcher.trim_when_idle()
    deadline = time.monotonic() + 5
    while not trims and time.monotonic() < deadline:
        time.sleep(0.01)

    # An engine thread woken while idle ran the next request slower (Batcher._trim_when_due).
    assert trims == ["memory-trim"] and woken == []


def test_the_idle_trim_runs_again_only_once_resident_memory_has_grown_past_its_threshold(monkeypatch):
    from predictor.observability import memory

    MiB = 1024 * 1024
    # Resident memory as each call reads it (MiB): after the first trim, then before each later call.
    resident = iter([390, 430, 454, 455, 400, 460])
    trims: list[int] = []
    monkeypatch.setattr(memory, "resident_bytes", lambda: next(resident) * MiB)
    monkeypatch.setattr(memory, "release", lambda: trims.append(1) or True)
    monkeypatch.setattr(memory, "_after_last_trim", None)

    assert memory.release_grown(64 * MiB)  # the first always runs: 390 MiB after it
    assert not memory.release_grown(64 * MiB)  # 40 MiB more, pages the next request would fault in again
    assert not memory.release_grown(64 * MiB)  # 64 MiB more: not past it
    assert memory.release_grown(64 * MiB)  # 65 MiB more: trimmed, 400 MiB after it
    assert not memory.release_grown(64 * MiB)  # 60 MiB above the new figure
    assert len(trims) == 2
