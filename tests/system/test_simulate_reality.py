"""The simulator against a real 0 -> 1: a holder in front (as Knative's activator or KEDA's
interceptor) starts a real `python -m predictor serve` fetching from the local S3 on the first
request, forwards it once ready, and the first request's latency is compared with the prediction
made from a profile measured in the same run."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from testing.bodies import v2_request
from tts_ops.simulate import profile as profiles
from tts_ops.simulate import settings, simulator, trace

POLL_S = 0.05  # the holder's readiness poll, as a readiness probe period
TEXT = "Scaling from zero is the reason this project exists, and now it is measured."


class Holder:
    """Holds requests while no predictor runs; the first one starts it."""

    def __init__(self, start_predictor):
        self.start_predictor = start_predictor
        self.predictor = None
        self.lock = threading.Lock()
        holder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                url = holder.upstream()
                r = httpx.post(
                    url + self.path, content=body, headers={"content-type": "application/json"}, timeout=120
                )
                self.send_response(r.status_code)
                self.send_header("content-length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def upstream(self) -> str:
        with self.lock:
            if self.predictor is None:
                self.predictor = self.start_predictor(wait=False)
                while True:  # the readiness probe
                    try:
                        if self.predictor.get("/v2/models/tts/ready").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if self.predictor.proc.poll() is not None:
                        raise RuntimeError(self.predictor.logs()[-2000:])
                    time.sleep(POLL_S)
            return self.predictor.url


@pytest.mark.timeout(600)
def test_first_request_from_zero_is_predicted_within_25_percent(start_predictor):
    holder = Holder(start_predictor)
    try:
        t0 = time.perf_counter()
        r = httpx.post(f"{holder.url}/v2/models/tts/infer", json=v2_request(TEXT), timeout=300)
        measured = time.perf_counter() - t0
        assert r.status_code == 200, r.text
        # The profile of this machine, now: the same process's cold start, its synthesis times.
        prof = profiles.measure(holder.predictor.url, repeats=1, lengths=(20, 80, 160))
    finally:
        holder.server.shutdown()
    flavour, values = settings.from_manifests(settings.Path("knative/overlays/cpu"))
    # The holder is the only probe here: it polls readiness every POLL_S, with no startup probe.
    overrides = [
        "pod.schedule_s=0",
        "pod.image_pull_s=0",
        f"pod.readiness_period_s={POLL_S}",
        "pod.startup_period_s=0",
    ]
    values = settings.apply_overrides(values, overrides)
    traffic = trace.Trace([0.0], [len(TEXT)], "one request at zero")
    predicted = simulator.simulate(flavour, values, prof, traffic).summary()["first_request_latency_s"]
    print(f"first request from zero: measured {measured:.2f} s, predicted {predicted:.2f} s")
    assert abs(predicted - measured) / measured <= 0.25
