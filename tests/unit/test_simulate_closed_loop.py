"""Closed-loop traces in the simulator: callers that send again when answered, as a load test's do
(test_scaling's eight threads). Replayed open-loop, such a load queues in a model slower than the
cluster what its callers never sent (tts_ops/simulate/trace.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tts_ops.simulate import profile, settings, simulator, trace
from tts_ops.simulate.errors import SimulateError

ROOT = Path(__file__).resolve().parents[2]
SECOND = profile.Profile(base_s=1.0, per_char_s=0.0, cold_start_s=1.0, phases_s={})


def _one_pod(traffic: trace.Trace, prof: profile.Profile = SECOND) -> simulator.Result:
    """A keda pod already up that never scales: one call at a time, the profile's time each."""
    _flavour, values = settings.from_manifests(ROOT / "keda" / "overlays" / "e2e")
    values = {**values, "replicas.start": 1, "replicas.min": 1, "replicas.max": 1}
    return simulator.simulate("keda", values, prof, traffic)


def test_a_caller_sends_its_next_request_when_answered_and_none_after_the_duration():
    result = _one_pod(trace.generate("closed:clients=1,duration=5.5,chars=10"))
    assert result.arrivals == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    assert result.latencies == pytest.approx([1.0] * 6)


def test_a_caller_thinks_between_its_answer_and_its_next_request():
    result = _one_pod(trace.generate("closed:clients=1,duration=5.5,think=0.5,chars=10"))
    assert result.arrivals == pytest.approx([0.0, 1.5, 3.0, 4.5])


def test_callers_never_have_more_requests_waiting_than_there_are_callers():
    # Three callers on one pod of 1 s a call: once the first round is through, each waits for the
    # other two and its own call (3 s), and the pod answers one a second, however long the run.
    result = _one_pod(trace.generate("closed:clients=3,duration=30,chars=10"))
    latencies = [x for x in result.latencies if x is not None]
    assert latencies[:3] == pytest.approx([1.0, 2.0, 3.0])
    assert max(latencies) == pytest.approx(3.0)
    assert len(result.arrivals) == pytest.approx(33, abs=1)
    assert max(result.timeline.waiting) <= 3


def test_a_slower_model_of_a_closed_loop_sends_fewer_requests_instead_of_queueing_more():
    traffic = trace.generate("closed:clients=3,duration=30,chars=10")
    slower = _one_pod(traffic, profile.Profile(base_s=1.1, per_char_s=0.0, cold_start_s=1.0, phases_s={}))
    assert max(x for x in slower.latencies if x is not None) == pytest.approx(3.3)
    assert len(slower.arrivals) < len(_one_pod(traffic).arrivals)


def test_a_closed_loop_trace_is_not_changed_by_a_run_so_a_sweep_can_reuse_it():
    traffic = trace.generate("closed:clients=2,duration=10,chars=10")
    first = _one_pod(traffic)
    assert traffic.times == [0.0, 0.0]
    assert _one_pod(traffic).latencies == first.latencies


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("closed:duration=10", "missing clients"),
        ("closed:clients=0", "whole number >= 1"),
        ("closed:clients=2.5", "whole number >= 1"),
        ("closed:clients=2,rate=3", "unknown parameter 'rate'"),
    ],
)
def test_a_closed_loop_spec_without_a_whole_number_of_callers_is_refused(spec, says):
    with pytest.raises(SimulateError, match=says):
        trace.load(spec)
