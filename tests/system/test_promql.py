"""Every PromQL expression in knative/ and keda/ runs on a real Prometheus scraping a loaded predictor."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from functools import cache
from pathlib import Path

import httpx
import yaml

from testing.bodies import speech_request, v2_request
from tts_ops import kustomize, manifests
from tts_ops.manifests import Deployment

# The labels a PodMonitor gives a stable predictor pod (Knative names pods <revision>-deployment-*).
POD_LABELS = {
    "namespace": "tts",
    "pod": "tts-predictor-00001-deployment-5c9d8-x2k4q",
    "container": "kserve-container",
}
ALERT = re.compile(r"^(?P<signal>.+?)\s*>\s*(?P<threshold>[0-9.]+)$", re.S)
SENTENCE = "Scaling from zero works when the queue depth is measured where the requests wait."


@cache
def _flavours() -> tuple[Deployment, ...]:
    return tuple(
        Deployment(kustomize.render(manifests.ROOT / overlay))
        for overlay in ("knative/overlays/cpu", "keda/overlays/cpu")
    )


def _rule_groups() -> list[dict]:
    groups: dict[str, dict] = {}
    for deployment in _flavours():
        for rule_object in deployment.kind("PrometheusRule"):
            for group in rule_object["spec"]["groups"]:
                groups[group["name"]] = group
    return list(groups.values())


def _scaler_queries() -> dict[str, str]:
    return {
        name: expr
        for deployment in _flavours()
        for name, expr in manifests.promql_expressions(deployment).items()
        if "/" in name  # ScaledObject triggers; rules are named by record or alert
    }


def _write_rules(path: Path) -> Path:
    # Evaluate every second instead of the manifests' 10 s, so the test sees results within seconds.
    groups = [{**group, "interval": "1s"} for group in _rule_groups()]
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def test_alert_and_recording_rules_pass_promtool(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed: run `make system-packages` (apt-get install prometheus)"
    rules = _write_rules(tmp_path / "rules.yml")

    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_compares_one_signal_with_a_threshold():
    for group in _rule_groups():
        for rule in group["rules"]:
            if "alert" in rule:
                assert ALERT.match(str(rule["expr"])), (
                    f"{rule['alert']}: write it as `<signal> > <threshold>`"
                )


class _Load:
    """Clients sending v2 and streaming speech requests until stopped."""

    def __init__(self, url: str, v2_clients: int, speech_clients: int):
        self._url = url
        self._stop = threading.Event()
        self.answered: list[int] = []
        self._threads = [threading.Thread(target=self._v2, daemon=True) for _ in range(v2_clients)]
        self._threads += [threading.Thread(target=self._speech, daemon=True) for _ in range(speech_clients)]

    def _v2(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                response = client.post(f"{self._url}/v2/models/tts/infer", json=v2_request(SENTENCE))
                self.answered.append(response.status_code)

    def _speech(self) -> None:
        # Streaming requests feed the first-packet histogram behind the seed's alert.
        body = speech_request(SENTENCE, "pcm")
        with httpx.Client(timeout=120) as client:
            while not self._stop.is_set():
                with client.stream("POST", f"{self._url}/v1/audio/speech", json=body) as response:
                    for _ in response.iter_bytes():
                        pass
                self.answered.append(response.status_code)

    def __enter__(self) -> _Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)


def test_every_query_returns_a_sample_and_queue_depth_follows_load(start_predictor, prometheus, tmp_path):
    # One request per engine call, so concurrent requests wait in the queue where it is measured.
    predictor = start_predictor(MAX_BATCH_SIZE="1")
    prom = prometheus(
        [(f"127.0.0.1:{predictor.http_port}", POD_LABELS)], [_write_rules(tmp_path / "rules.yml")]
    )
    (queue_name, queue_query), *_ = [(n, q) for n, q in _scaler_queries().items() if "tts_queue_depth" in q]
    prom.wait_for(
        lambda: prom.value('up{job="tts/tts-predictor"}') == 1, 60, "a scrape of the predictor", 0.25
    )
    prom.wait_for(
        lambda: prom.value(queue_query) is not None, 30, f"a sample of {queue_name} while idle", 0.25
    )
    idle = prom.value(queue_query)

    under_load: list[float] = []
    with _Load(predictor.url, v2_clients=8, speech_clients=2) as load:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            under_load.append(prom.value(queue_query) or 0.0)
            time.sleep(0.25)
    prom.wait_for(lambda: prom.value(queue_query) == 0, 60, f"{queue_name} back to 0 after the load", 0.25)
    # Rates over [5m] need two scrapes that saw the requests; wait one more evaluation.
    time.sleep(2)

    assert idle == 0
    assert max(under_load) >= 2, f"{queue_name} never rose under 10 concurrent clients: {under_load}"
    assert load.answered and set(load.answered) == {200}, set(load.answered)
    for name, expr in manifests.promql_expressions(_flavours()[1]).items():
        match = ALERT.match(expr)
        signal = match["signal"] if match and not name.startswith("tts:") and "/" not in name else expr
        assert prom.query(signal), f"{name}: `{signal}` returned no sample"
    for name in ("tts:first_packet_seconds:p99_5m", "tts:error_ratio:rate5m", "tts:cold_start_seconds:max"):
        value = prom.value(name)
        assert value is not None and value == value, f"{name} = {value}"  # a number, not NaN
    assert prom.value("tts:error_ratio:rate5m") == 0
    unhealthy = [(r["name"], r.get("lastError")) for r in prom.rules() if r["health"] != "ok"]
    assert not unhealthy
