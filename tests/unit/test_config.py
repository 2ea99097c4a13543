"""Settings: CPU threads from the container's quota, not the host's cores; one list encoding; explicit
words for auto and none; docs/settings.md rendered from them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from predictor.config import (
    GROUPS,
    ConfigError,
    Settings,
    container_cpus,
    load_settings,
    settings_markdown,
    take_deprecations,
)

HOST = len(os.sched_getaffinity(0))
ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"CPU_THREADS": "2"}, 4),  # onnxruntime on two threads: two lanes, two sentences each
        ({"CPU_THREADS": "2", "ENGINE_WORKERS": "2"}, 4),  # the solo worker runs a lone call on lanes
        ({"CPU_THREADS": "1"}, 1),  # one thread: nothing to run side by side
        ({"CPU_THREADS": "64", "MAX_BATCH_ITEMS": "16"}, 16),  # never more than one call may carry
        ({"CPU_THREADS": "2", "ENGINE": "torch"}, 1),  # torch on CPU runs a call's texts one by one
        ({"CPU_THREADS": "2", "MAX_BATCH_SIZE": "8"}, 8),  # batching asked for: its size
    ],
)
def test_a_requests_segments_go_to_the_engine_in_calls_its_lanes_can_share(monkeypatch, env, want):
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    assert load_settings().segments_per_call() == want


# --- one list encoding, explicit words, the generated reference -----------------------------------
def test_lists_are_comma_separated_and_json_is_still_read(monkeypatch):
    monkeypatch.setenv("MODEL_ALIASES", "tts-1, house-voice,")
    monkeypatch.setenv("VOICE_ALIASES", "alloy=,narrator=en_US-joe-medium")
    monkeypatch.setenv("CE_OUTPUT_PREFIXES", "s3://a/out, s3://b")
    settings = load_settings()
    assert settings.model_aliases == ["tts-1", "house-voice"]
    assert settings.voice_aliases == {"alloy": "", "narrator": "en_US-joe-medium"}
    assert settings.output_prefixes == ["s3://a/out/", "s3://b/"]

    monkeypatch.setenv("MODEL_ALIASES", '["tts-1", "house-voice"]')
    monkeypatch.setenv("VOICE_ALIASES", '{"alloy": "", "narrator": "en_US-joe-medium"}')
    assert load_settings().model_aliases == settings.model_aliases
    assert load_settings().voice_aliases == settings.voice_aliases


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("VOICE_ALIASES", "alloy", "not name=voice"),
        ("MODEL_ALIASES", "[tts-1", "not a JSON list"),
        ("CPU_THREADS", "-1", "'auto'"),
        ("GRPC_PORT", "off", "'none'"),
    ],
)
def test_a_malformed_value_names_its_variable(monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)

    with pytest.raises(ConfigError, match=variable) as refused:
        load_settings()
    assert message in str(refused.value)


def test_auto_and_none_are_explicit_and_the_old_zero_still_means_them():
    take_deprecations()  # what earlier tests left
    words = load_settings(
        grpc_port="none",
        cpu_threads="auto",
        max_batch_size="auto",
        gpu_memory_fraction="none",
        default_length_scale="voice",
    )
    zeros = load_settings(
        grpc_port=0, cpu_threads=0, max_batch_size=0, gpu_memory_fraction=0, default_length_scale=0
    )

    for settings in (words, zeros):
        assert settings.grpc_listen_port is None
        assert settings.threads() == container_cpus()
        assert settings.batch_size == 1  # DEVICE=cpu
        assert settings.gpu_memory_cap is None
        assert settings.length_scale_default is None
    assert sorted(take_deprecations()) == sorted(
        [
            f"{var}=0 is deprecated; write {var}={word}"
            for var, word in [
                ("GRPC_PORT", "none"),
                ("GPU_MEMORY_FRACTION", "none"),
                ("CPU_THREADS", "auto"),
                ("MAX_BATCH_SIZE", "auto"),
                ("DEFAULT_LENGTH_SCALE", "voice"),
            ]
        ]
    )


def test_every_setting_is_in_exactly_one_group():
    grouped = [name for names in GROUPS.values() for name in names]

    assert sorted(grouped) == sorted(Settings.model_fields)


def test_every_description_gives_a_unit_or_values_and_the_default_a_reason():
    """Each variable's description says what its default is for (\"Default\"), unless the default is
    empty or a word the description explains; numbers carry a unit in the name or the text."""
    units = ("_s", "_ms", "_bytes", "_mib", "_chars", "_frames", "_port")
    worded = ("auto", "none", "voice", "")
    for name, info in Settings.model_fields.items():
        text = info.description or ""
        default = info.default
        if isinstance(default, bool) or (isinstance(default, str) and default not in worded):
            continue  # booleans and words: the description says what each value does
        assert "Default" in text or default in worded or default == [], (
            f"{name.upper()}: no reason for the default"
        )
        if isinstance(default, int | float) and not isinstance(default, bool):
            words = ("second", " ms", "bytes", "mib", "characters", "connections", "texts", "requests")
            words += (
                "records",
                "headers",
                "a fraction",
                "frames",
                "port",
                "retries",
                "threads",
                "[0.1, 5]",
                "calls",
            )
            has_unit = name.endswith(units) or any(w in text.lower() for w in words)
            assert has_unit, f"{name.upper()}: no unit in the name or the description"


def test_docs_settings_md_is_what_make_docs_writes():
    committed = (ROOT / "docs" / "settings.md").read_text()

    assert committed == settings_markdown(), "docs/settings.md is stale: run `make docs`"
