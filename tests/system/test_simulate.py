"""`tts-ops simulate` as a user runs it: real manifests, real CLI process, bad input -> exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def ops(command: str, *args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "tts_ops", command, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


def simulate(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return ops("simulate", *args, cwd=cwd)


@pytest.mark.parametrize("overlay", ["knative/overlays/cpu", "keda/overlays/cpu"])
def test_single_request_after_idle_waits_for_one_cold_start(overlay):
    # The interceptor's wait is raised so that any cold start fits (see the next test).
    result = simulate(
        "--manifests",
        overlay,
        "--trace",
        "idle:after=3600",
        "--json",
        "--set",
        "keda.http.wait_timeout_s=600",
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["requests"] == 1 and summary["cold_start_waits"] == 1 and summary["rejected"] == 0
    assert summary["max_replicas"] == 1 and summary["pod_starts"] == 1
    for key in ("latency_p50_s", "latency_p95_s", "latency_p99_s", "replica_seconds"):
        assert key in summary


def test_interceptor_gives_up_on_a_request_held_past_its_wait_timeout():
    result = simulate(
        "--manifests",
        "keda/overlays/cpu",
        "--trace",
        "idle:after=60",
        "--json",
        "--set",
        "keda.http.wait_timeout_s=2",
    )
    summary = json.loads(result.stdout)
    assert summary["rejected"] == 1 and summary["completed"] == 0 and summary["pod_starts"] == 1


def test_events_wait_for_keda_to_poll_kafka_while_http_callers_are_pushed():
    def first(*extra: str) -> float:
        args = ("--manifests", "keda/overlays/cpu", "--trace", "idle:after=62", "--json", *extra)
        return json.loads(simulate(*args).stdout)["first_request_latency_s"]

    http = first()
    event = first("--set", "keda.events_fraction=1", "--set", "keda.polling_interval_s=30")
    # The event arrives 2 s after a poll at t=60 and waits for the next one at t=90; the HTTP request
    # waits only for the scaler's push, within its ping and stream ticks (0.5 + 0.2 s).
    assert 28 - 0.7 <= event - http <= 28 + 0.01


def test_set_overrides_a_manifest_value():
    base = json.loads(
        simulate("--manifests", "knative/overlays/cpu", "--trace", "idle:after=10", "--json").stdout
    )
    longer = json.loads(
        simulate(
            "--manifests",
            "knative/overlays/cpu",
            "--trace",
            "idle:after=10",
            "--json",
            "--set",
            "kpa.pod_retention_s=20m",
        ).stdout
    )
    # The last pod now stays 20 minutes instead of the overlay's 6: 840 more replica-seconds.
    assert longer["replica_seconds"] - base["replica_seconds"] == pytest.approx(840, abs=4)


def test_sweep_marks_a_pareto_front():
    result = simulate(
        "--manifests",
        "knative/overlays/cpu",
        "--trace",
        "bursts:rate=3,on=30,off=240,duration=1800",
        "--sweep",
        "kpa.pod_retention_s=0,300,600",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["value"] for r in rows] == [0, 300, 600]
    assert any(r["pareto"] for r in rows)
    # No retention pays a cold start per burst, and the panics those cause cost more pods than
    # keeping one: 300 s beats 0 on both p99 and replica-seconds, so 0 is off the front; the
    # lowest p99 (the cheaper of equals) is always on it.
    assert rows[0]["cold_start_waits"] > rows[2]["cold_start_waits"]
    assert rows[1]["p99_all_s"] < rows[0]["p99_all_s"]
    assert rows[1]["replica_seconds"] < rows[0]["replica_seconds"]
    assert not rows[0]["pareto"]
    assert min(rows, key=lambda r: (r["p99_all_s"], r["replica_seconds"]))["pareto"]


def test_png_is_written_only_when_asked(tmp_path):
    out = tmp_path / "timeline.png"
    result = simulate(
        "--manifests", "keda/overlays/cpu", "--trace", "poisson:rate=1,duration=300", "--png", str(out)
    )
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["timeline.png"]  # no temporary left behind


def _bad(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("trace_text", "message"),
    [
        ("t,chars\n1,20\n-1,20\n", ":3: time -1 is negative"),
        ("t,chars\n5,20\n2,20\n", ":3: time 2.0 is before"),
        ("time,chars\n1,20\n", ":1: expected the header"),
        ("t,chars\n1,20,3\n", ":2: expected 2 columns"),
        ("t,chars\n1,many\n", ":2: column chars is not an integer"),
    ],
)
def test_bad_trace_exits_2_naming_file_and_line(tmp_path, trace_text, message):
    trace = _bad(tmp_path, "trace.csv", trace_text)
    result = simulate("--manifests", "knative/overlays/cpu", "--trace", trace)
    assert result.returncode == 2
    assert f"{trace}{message}" in result.stderr


def test_unknown_set_key_exits_2_naming_it():
    result = simulate("--manifests", "knative/overlays/cpu", "--trace", "idle:after=1", "--set", "kpa.nope=1")
    assert result.returncode == 2 and "kpa.nope: unknown key" in result.stderr


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"schema": "tts-predictor-profile/1", "base_s": 0.1, "per_char_s": 0.001},
            "missing key 'cold_start_s'",
        ),
        ({"schema": "other", "base_s": 0.1, "per_char_s": 0.001, "cold_start_s": 5}, "key 'schema'"),
        (
            {"schema": "tts-predictor-profile/1", "base_s": "fast", "per_char_s": 0.001, "cold_start_s": 5},
            "key 'base_s'",
        ),
        (
            {
                "schema": "tts-predictor-profile/1",
                "base_s": 0.1,
                "per_char_s": 0.001,
                "cold_start_s": 5,
                "x": 1,
            },
            "unknown key 'x'",
        ),
    ],
)
def test_profile_off_schema_exits_2_naming_the_key(tmp_path, doc, message):
    profile = _bad(tmp_path, "profile.json", json.dumps(doc))
    result = simulate("--manifests", "knative/overlays/cpu", "--trace", "idle:after=1", "--profile", profile)
    assert result.returncode == 2 and profile in result.stderr and message in result.stderr


def test_manifests_without_autoscaling_object_exit_2(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources:\n  - ns.yaml\n")
    (tmp_path / "ns.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: tts\n")
    result = simulate("--manifests", str(tmp_path), "--trace", "idle:after=1")
    assert (
        result.returncode == 2 and "no autoscaling object" in result.stderr and str(tmp_path) in result.stderr
    )


def _tables(*args: str) -> subprocess.CompletedProcess:
    return ops("simulate-tables", *args, timeout=300)


def test_the_autoscaling_table_in_the_docs_is_what_the_sweeps_give_now(tmp_path):
    # Every cell of docs/deployment.md's table is reproduced by one command (`make
    # autoscaling-table`); a stale copy (a value or a profile changed since) fails here.
    doc = ROOT / "docs" / "deployment.md"
    fresh = _tables("--doc", str(doc), "--check")
    assert fresh.returncode == 0, fresh.stderr

    stale = tmp_path / "deployment.md"
    stale.write_text(doc.read_text().replace("| busy |", "| busy (edited) |", 1))
    checked = _tables("--doc", str(stale), "--check")
    assert checked.returncode == 1 and "stale" in checked.stderr

    rewritten = _tables("--doc", str(stale))
    assert rewritten.returncode == 0 and "rewritten" in rewritten.stdout
    assert stale.read_text() == doc.read_text()
