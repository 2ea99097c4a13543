"""Which profile `tts-ops simulate` runs with, and which profiles `tts-ops profile` writes.

simulate picks the shipped profile of the engine the overlay's predictor runs (its ENGINE, DEVICE,
DTYPE and COMPILE, resolved as predictor/config.py resolves ENGINE=auto) unless --profile is given;
profile refuses a measurement taken with the 1-minute load average above the machine's cores unless
--force, and a forced profile makes simulate warn. The load average and HTTP are injected (no socket).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import httpx
import pytest

from predictor.shadow.recorder import mos_sampled
from tts_ops import cli
from tts_ops.simulate import profile, settings
from tts_ops.simulate.errors import SimulateError

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "tts_ops" / "simulate" / "profiles"

# Every overlay of knative/ and keda/: (overlay, engine, device, the shipped profile simulate picks).
OVERLAYS = [
    ("knative/overlays/cpu", "onnx", "cpu", "cpu-2core-onnx.json"),
    ("knative/overlays/gpu", "torch", "cuda", "gpu-assumed.json"),
    ("keda/overlays/cpu", "onnx", "cpu", "cpu-2core-onnx.json"),
    ("keda/overlays/gpu", "torch", "cuda", "gpu-assumed.json"),
    ("keda/overlays/e2e", "onnx", "cpu", "cpu-2core-onnx.json"),
    ("knative/overlays/e2e", "onnx", "cpu", "cpu-2core-onnx.json"),
]


@pytest.mark.parametrize(("overlay", "engine", "device", "shipped"), OVERLAYS)
def test_each_overlay_simulates_with_the_shipped_profile_of_its_predictors_engine(
    overlay, engine, device, shipped
):
    read = settings.read(ROOT / overlay)

    path, because = profile.choose(None, read.engine.name, read.engine.device, read.engine.why, overlay)

    assert (read.engine.name, read.engine.device) == (engine, device)
    assert path == PROFILES / shipped
    assert f"{engine} on {device}" in because and "ENGINE=" in because


def test_the_overlay_table_lists_every_overlay_of_knative_and_keda():
    found = {str(p.parent.relative_to(ROOT)) for p in ROOT.glob("*/overlays/*/kustomization.yaml")}

    assert found == {overlay for overlay, *_ in OVERLAYS}


@pytest.mark.parametrize(("key", "name"), sorted(profile.SHIPPED.items()))
def test_each_shipped_profile_is_of_the_engine_and_device_it_is_shipped_for(key, name):
    loaded = profile.load(PROFILES / name)

    assert (loaded.engine, loaded.device) == key


@pytest.mark.parametrize(
    ("env", "engine", "device"),
    [
        ({}, "onnx", "cpu"),
        ({"ENGINE": "auto", "DEVICE": "cuda"}, "torch", "cuda"),
        ({"DEVICE": "cuda:1"}, "torch", "cuda"),
        ({"DTYPE": "bf16"}, "torch", "cpu"),
        ({"COMPILE": "true"}, "torch", "cpu"),
        ({"ENGINE": "torch"}, "torch", "cpu"),
        ({"ENGINE": "onnx", "DEVICE": "cuda"}, "onnx", "cuda"),
    ],
)
def test_engine_auto_resolves_as_the_predictor_resolves_it(env, engine, device):
    resolved = settings.predictor_engine(env)

    assert (resolved.name, resolved.device) == (engine, device)


def test_the_shells_environment_does_not_choose_the_simulated_engine(monkeypatch):
    monkeypatch.setenv("ENGINE", "torch")
    monkeypatch.setenv("DEVICE", "cuda")

    resolved = settings.predictor_engine({})

    assert (resolved.name, resolved.device) == ("onnx", "cpu")


def test_an_invalid_engine_setting_in_the_manifests_is_bad_input_naming_it():
    with pytest.raises(SimulateError, match="DEVICE"):
        settings.predictor_engine({"DEVICE": "tpu"}, "overlay x")


def _overlay(tmp_path: Path, base: str, env: dict[str, str]) -> Path:
    """A kustomization in tmp_path: BASE (a repo overlay) with ENV added to its predictors."""
    adds = "".join(
        f"      - op: add\n        path: /spec/predictor/containers/0/env/-\n"
        f"        value: {{name: {k}, value: {v}}}\n"
        for k, v in env.items()
    )
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {os.path.relpath(ROOT / base, tmp_path)}\n"
        "patches:\n  - target:\n      kind: InferenceService\n    patch: |-\n" + adds
    )
    return tmp_path


def test_an_engine_without_a_shipped_profile_fails_naming_the_engine_and_the_profile_flag(tmp_path, capsys):
    onnx_on_cuda = _overlay(tmp_path, "knative/overlays/cpu", {"DEVICE": "cuda"})

    code = cli.main(["simulate", "--manifests", str(onnx_on_cuda), "--trace", "idle:after=60"])

    err = capsys.readouterr().err
    assert code == 2
    assert "engine onnx on cuda" in err and "--profile" in err


def _simulate_json(capsys, *args: str) -> tuple[dict, str]:
    code = cli.main(["simulate", "--trace", "idle:after=60", "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


def test_simulate_says_which_profile_it_chose_and_why(capsys):
    summary, err = _simulate_json(capsys, "--manifests", str(ROOT / "keda" / "overlays" / "cpu"))

    assert summary["profile"].endswith("cpu-2core-onnx.json")
    assert summary["profile_because"] == (
        "the shipped profile of onnx on cpu: the predictor's env has ENGINE=onnx"
    )
    assert "warning" not in err


def test_a_given_profile_overrides_the_overlays_choice_and_the_engine_mismatch_is_warned(capsys):
    torch = PROFILES / "cpu-2core.json"

    summary, err = _simulate_json(
        capsys, "--manifests", str(ROOT / "knative" / "overlays" / "cpu"), "--profile", str(torch)
    )

    assert summary["profile"].endswith("cpu-2core.json")
    assert summary["profile_because"] == "given by --profile"
    assert "warning" in err and "measured on torch on cpu" in err and "runs onnx on cpu" in err


def _profile(load: tuple[float, ...], cores: int, **fields) -> profile.Profile:
    return profile.Profile(
        base_s=0.1,
        per_char_s=0.004,
        cold_start_s=3.0,
        phases_s={},
        engine="onnx",
        device="cpu",
        load_average=load,
        cores=cores,
        **fields,
    )


def test_simulate_warns_when_its_profile_was_forced(tmp_path, capsys):
    forced, quiet = tmp_path / "forced.json", tmp_path / "quiet.json"
    profile.write(_profile((5.25, 6.5), 2, forced=True), forced)
    profile.write(_profile((0.5, 0.75), 2), quiet)
    keda_cpu = str(ROOT / "keda" / "overlays" / "cpu")

    _, forced_err = _simulate_json(capsys, "--manifests", keda_cpu, "--profile", str(forced))
    _, quiet_err = _simulate_json(capsys, "--manifests", keda_cpu, "--profile", str(quiet))

    assert "warning" in forced_err and "--force" in forced_err
    assert "5.25" in forced_err and "6.50" in forced_err and "2 cores" in forced_err
    assert quiet_err == ""


@pytest.mark.parametrize(
    ("name", "load"),
    [("loaded at the start", (3.5, 1.0)), ("loaded at the end", (1.0, 3.5))],
)
def test_a_profile_measured_above_the_cores_is_refused_naming_the_load_and_the_cores(name, load):
    with pytest.raises(SimulateError) as refused:
        profile.admit(_profile(load, 2))

    message = str(refused.value)
    assert "3.50" in message and "1.00" in message and "2 cores" in message and "--force" in message


def test_a_profile_at_or_below_the_cores_is_admitted_unforced():
    admitted = profile.admit(_profile((2.0, 1.5), 2))

    assert admitted.forced is False


def test_force_admits_a_loaded_profile_marked_forced():
    admitted = profile.admit(_profile((10.8, 14.9), 2), force=True)

    assert admitted.forced is True


class _Predictor:
    """A ready predictor's REST answers, recording each request and each load reading in order."""

    def __init__(
        self,
        platform: str | None,
        loads: list[float],
        synthesis_s: float = 0.0,
        workers: int = 1,
        sleeps: list[float] | None = None,
    ):
        self.platform, self.loads, self.events = platform, loads, []
        # Each synthesis sleeps synthesis_s (or the next of `sleeps`, in turn); at most `workers` at
        # once, the rest wait their turn.
        self.synthesis_s, self.engine = synthesis_s, threading.Semaphore(workers)
        self.sleeps = sleeps
        # quota: a call within quota[0] s of the last one's end sleeps quota[1] times as long (a
        # CPU-limited pod's quota spent by the call before).
        self.quota: tuple[float, float] | None = None
        self.last_end = -1e9
        # mos: (share, seconds): a call whose x-request-id is in the MOS sample at that share leaves
        # that much scoring to the next call (the records' thread shares the pod's CPU); ids, in order.
        self.mos: tuple[float, float] | None = None
        self.owed_s = 0.0
        self.ids: list[str] = []

    def load_average(self) -> float:
        self.events.append("load")
        return self.loads.pop(0)

    def transport(self) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            path = request.url.path
            self.events.append(path)
            if path == "/v2/models/tts/ready":
                return httpx.Response(200)
            if path == "/v2/models/tts":
                meta = {"name": "tts"} | ({"platform": self.platform} if self.platform else {})
                return httpx.Response(200, json=meta)
            if path == "/v2/models/tts/infer":
                with self.engine:
                    seconds = self.sleeps.pop(0) if self.sleeps else self.synthesis_s
                    if self.quota and time.perf_counter() - self.last_end < self.quota[0]:
                        seconds *= self.quota[1]
                    rid = request.headers["x-request-id"]
                    self.ids.append(rid)
                    seconds, self.owed_s = seconds + self.owed_s, 0.0
                    if self.mos and mos_sampled(rid, self.mos[0]):
                        self.owed_s = self.mos[1]
                    time.sleep(seconds)
                    self.last_end = time.perf_counter()
                return httpx.Response(200, json={"outputs": []})
            if path == "/metrics":
                return httpx.Response(
                    200,
                    text='tts_cold_start_seconds{phase="fetch"} 1.5\n'
                    'tts_cold_start_seconds{phase="total"} 4.25\n',
                )
            return httpx.Response(404)

        return httpx.MockTransport(handle)

    def measure(self, **kwargs) -> profile.Profile:
        return profile.measure(
            "http://predictor",
            lengths=(20, 80),
            load_average=self.load_average,
            cores=2,
            transport=self.transport(),
            **({"idle_gap_s": 0.0, "repeats": 1} | kwargs),
        )


def test_measure_reads_the_load_before_the_first_request_and_after_the_last():
    predictor = _Predictor("onnx", [0.5, 2.75])

    measured = predictor.measure()

    assert predictor.events[0] == "load" and predictor.events[-1] == "load"
    assert predictor.events.count("load") == 2
    assert measured.load_average == (0.5, 2.75) and measured.cores == 2
    with pytest.raises(SimulateError, match=r"2\.75 at the end"):
        profile.admit(measured)


@pytest.mark.parametrize(("workers", "low", "high"), [(1, 1.8, 2.6), (2, 0.9, 1.4)])
def test_measure_times_two_requests_at_once_against_one_alone(workers, low, high):
    # One engine call at a time: two at once take twice one alone; two workers: about one's time.
    predictor = _Predictor("onnx", [0.1, 0.1], synthesis_s=0.05, workers=workers)

    measured = predictor.measure(overlap=2)

    assert low <= measured.overlap_factor <= high, measured.overlap_factor


def test_a_profile_without_an_overlap_measurement_says_zero_and_one_with_it_reads_back(tmp_path):
    assert _Predictor("onnx", [0.1, 0.1]).measure(overlap=1).overlap_factor == 0.0
    out = tmp_path / "p.json"
    profile.write(_profile((0.1, 0.1), 2, overlap_factor=1.8), out)

    assert profile.load(out).overlap_factor == 1.8


def test_measure_takes_the_mean_of_a_lengths_repeats_so_a_long_tail_counts():
    # A CPU-limited pod's times have a long tail, and its queue drains at one request per mean time:
    # two fast repeats and one slow give the mean (0.04 s), where the median would be 0.01.
    predictor = _Predictor("onnx", [0.1, 0.1], sleeps=[0.01, 0.01, 0.10] * 2)

    measured = profile.measure(
        "http://predictor",
        repeats=3,
        lengths=(20, 80),
        load_average=predictor.load_average,
        cores=2,
        transport=predictor.transport(),
        overlap=1,
        idle_gap_s=0.0,
    )

    assert measured.average == "mean"
    assert all(0.035 < seconds < 0.08 for _, seconds in measured.points), measured.points


def test_measure_times_calls_after_a_pause_and_back_to_back_apart():
    # A predictor whose call right after another (within 0.1 s) takes three times one after a pause.
    predictor = _Predictor("onnx", [0.1, 0.1], synthesis_s=0.01)
    predictor.quota = (0.1, 3.0)

    measured = predictor.measure(repeats=3, idle_gap_s=0.15, overlap=1)

    assert all(0.009 < seconds < 0.02 for _, seconds in measured.points), measured.points
    assert 2.0 < measured.back_to_back_factor < 3.5, measured.back_to_back_factor
    assert measured.back_to_back_s(20) == pytest.approx(
        measured.synthesis_s(20) * measured.back_to_back_factor
    )


def test_the_back_to_back_calls_carry_the_predictors_mos_share_and_the_calls_after_a_pause_none():
    # One id in twenty scored (a share of 0.05) costs the call after it 0.2 s more: the back-to-back
    # mean carries exactly that one, whatever ids a run happens to draw.
    predictor = _Predictor("onnx", [0.1, 0.1], synthesis_s=0.01)
    predictor.mos = (0.05, 0.2)

    measured = predictor.measure(repeats=20, overlap=1, mos_sample=0.05)

    after_pause, back_to_back = predictor.ids[:40], predictor.ids[41:]
    assert not any(mos_sampled(rid, 0.05) for rid in after_pause)
    assert [i for i, rid in enumerate(back_to_back) if mos_sampled(rid, 0.05)] == [10]
    assert len(set(predictor.ids)) == len(predictor.ids)
    # (20 x 0.01 + 0.2) / 20 against 0.01: about 2.
    assert 1.6 < measured.back_to_back_factor < 2.8, measured.back_to_back_factor


def test_without_a_mos_share_no_call_is_chosen_to_be_scored():
    predictor = _Predictor("onnx", [0.1, 0.1], synthesis_s=0.01)

    predictor.measure(repeats=20, overlap=1)

    assert len(predictor.ids) == 2 * 20 + 21
    with pytest.raises(SimulateError, match=r"mos_sample 1\.5"):
        predictor.measure(mos_sample=1.5)


def test_a_profile_written_before_averages_were_recorded_reads_as_medians(tmp_path):
    doc = _profile((0.1, 0.1), 2).to_json()
    del doc["average"]
    out = tmp_path / "p.json"
    out.write_text(json.dumps(doc))

    assert profile.load(out).average == "median"
    out.write_text(json.dumps(doc | {"average": "mode"}))
    with pytest.raises(SimulateError, match="'average' is 'mode'"):
        profile.load(out)


def test_measure_records_the_engine_the_predictor_reports():
    measured = _Predictor("torch", [0.1, 0.1]).measure()

    assert measured.engine == "torch"


def test_measure_takes_the_engine_flag_only_when_the_predictor_reports_none():
    with pytest.raises(SimulateError, match="--engine"):
        _Predictor(None, [0.1, 0.1]).measure()
    with pytest.raises(SimulateError, match="reports engine onnx"):
        _Predictor("onnx", [0.1, 0.1]).measure(engine="torch")

    assert _Predictor(None, [0.1, 0.1]).measure(engine="torch").engine == "torch"


def test_profile_command_writes_no_file_when_loaded_and_a_forced_one_with_force(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(profile, "measure", lambda *a, **k: _profile((10.8, 14.9), 2))
    out = tmp_path / "p.json"

    refused = cli.main(["profile", "--url", "http://predictor", "--out", str(out)])
    refused_err = capsys.readouterr().err
    written_when_refused = out.exists()
    forced = cli.main(["profile", "--url", "http://predictor", "--out", str(out), "--force"])

    assert refused == 2 and not written_when_refused
    assert "10.80" in refused_err and "14.90" in refused_err and "2 cores" in refused_err
    assert forced == 0
    written = profile.load(out)
    assert written.forced is True and written.load_average == (10.8, 14.9) and written.cores == 2


def test_a_written_profile_is_readable_as_the_umask_allows_and_every_shipped_one_is(tmp_path):
    # mkstemp's 0600 once made a re-measured shipped profile readable by its writer only.
    old = os.umask(0o022)
    try:
        out = tmp_path / "p.json"
        profile.write(profile.load(PROFILES / "cpu-2core-onnx.json"), out)
    finally:
        os.umask(old)

    assert out.stat().st_mode & 0o777 == 0o644
    assert profile.load(out) == profile.load(PROFILES / "cpu-2core-onnx.json")
    for shipped in PROFILES.glob("*.json"):
        assert shipped.stat().st_mode & 0o044 == 0o044, shipped
