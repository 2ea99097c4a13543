"""Settings: CPU threads from the container's quota, not the host's cores."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from predictor.config import container_cpus, load_settings

HOST = len(os.sched_getaffinity(0))


def test_cgroup_v2_quota_sets_the_thread_count(tmp_path):
    (tmp_path / "cpu.max").write_text("100000 100000\n")  # one CPU's worth

    assert container_cpus(tmp_path) == 1


def test_fractional_quota_rounds_down_but_never_to_zero(tmp_path):
    (tmp_path / "cpu.max").write_text("50000 100000\n")

    assert container_cpus(tmp_path) == 1


def test_cgroup_v1_quota_is_read_when_v2_is_absent(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")

    assert container_cpus(tmp_path) == 1


def test_no_quota_means_the_cpus_we_may_run_on(tmp_path):
    (tmp_path / "cpu.max").write_text("max 100000\n")

    assert container_cpus(tmp_path) == HOST


def test_quota_above_the_affinity_mask_is_capped(tmp_path):
    (tmp_path / "cpu.max").write_text(f"{(HOST + 8) * 100000} 100000\n")

    assert container_cpus(tmp_path) == HOST


@pytest.fixture
def one_cpu() -> Iterator[None]:
    """This process pinned to one CPU: whatever the machine's cgroup quota, the container has 1 CPU."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def test_cpu_threads_unset_follows_the_cpus_the_process_may_use(one_cpu, monkeypatch):
    monkeypatch.setenv("CPU_THREADS", "0")

    assert load_settings().threads() == 1


def test_cpu_threads_setting_overrides_the_quota(one_cpu, monkeypatch):
    monkeypatch.setenv("CPU_THREADS", "3")

    assert load_settings().threads() == 3
