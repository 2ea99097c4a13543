"""The figures a calibration replay gives the simulator (testing/replay.py), from its samples alone."""

from __future__ import annotations

import pytest

from testing.replay import Replay


def _replay(cpu: list[tuple[float, float, float]]) -> Replay:
    # Three requests answered by 3.5 s; the CPU sampled as the watcher does: (t, node busy, pods' own).
    return Replay(sends=[0.0, 1.0, 2.0], latency=[1.0, 1.0, 1.5], status=[200] * 3, cpu=cpu)


def test_the_spare_cores_follow_what_the_rest_of_the_node_took_between_samples():
    # 0-1 s: the node busy 1.5 cores, the pods 0.5 (the rest 1.0, so 1.0 of 2 left); 1-2 s: the rest
    # 0.25; 2-3 s: the pods' own figure ahead of the node's (ticks counted apart): none of the rest;
    # 3-4 s (the last answer at 3.5 s): the rest 1.0. The sample after the last answer starts no step.
    replay = _replay(
        [
            (0.0, 0.0, 0.0),
            (1.0, 1.5, 0.5),
            (2.0, 3.0, 1.75),
            (3.0, 3.5, 2.5),
            (4.0, 5.0, 3.0),
            (5.0, 6.0, 3.5),
        ]
    )

    assert replay.spare_cores_over_time(2) == [(0.0, 1.0), (1.0, 1.75), (2.0, 2.0), (3.0, 1.0)]
    # On average, from the samples up to the last answer: (3.5 - 2.5) over 3 s.
    assert replay.others_cores() == pytest.approx(1 / 3)


def test_a_node_the_rest_took_whole_leaves_a_tenth_of_a_core_never_none():
    # 0 cores would read as no limit at all (node.cpus = 0); the node's kubelet and the replay's client
    # on a saturated node still leave the pods what the kernel's scheduler gives them.
    replay = _replay([(0.0, 0.0, 0.0), (2.0, 4.0, 0.0), (4.0, 6.0, 1.0)])

    assert replay.spare_cores_over_time(2) == [(0.0, 0.1), (2.0, 1.5)]
