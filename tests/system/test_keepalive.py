"""A busy pod hands its keep-alive connections back (Settings.close_when_busy), so a pod added under load
takes requests from a keep-alive pool in front of a Service.

The pool is what the KEDA HTTP add-on's interceptor keeps (Go's http.Transport, up to 200 idle
connections a Service); the Service is kube-proxy's, which picks an endpoint per connection
(testing/faults.py's proxy with a target per pod). A pool filled while one pod was ready holds connections only to it; on the
keda flavour's burst (docs/cluster.md) the three pods added later took no request while the first
answered 503 to almost half.
"""

from __future__ import annotations

import threading
from collections import Counter

import httpx
import pytest

from testing.bodies import v2_request
from testing.faults import FaultProxy

TEXT = "Connections follow the pool."
CLIENTS = 6  # the pool's connections: more than one pod runs at once, so the first is busy
AFTER = 48  # requests sent once the second pod is ready


def _load(url: str, client: httpx.Client, n: int, served: Counter[str]) -> None:
    """``n`` requests from CLIENTS threads sharing ``client``'s pool; counts who answered each."""
    left = iter(range(n))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if next(left, None) is None:
                    return
            response = client.post(url + "/v2/models/tts/infer", json=v2_request(TEXT))
            assert response.status_code == 200, response.text
            with lock:
                served[response.headers["x-tts-revision"]] += 1

    threads = [threading.Thread(target=worker) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)


@pytest.mark.parametrize("close_when_busy", ["true", "false"])
def test_a_pod_added_under_load_takes_requests_from_a_keep_alive_pool(start_predictor, close_when_busy):
    first = start_predictor(ENGINE="onnx", REVISION="first", CLOSE_WHEN_BUSY=close_when_busy)
    added = start_predictor(ENGINE="onnx", REVISION="added", CLOSE_WHEN_BUSY=close_when_busy)
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    with FaultProxy("127.0.0.1", first.http_port) as svc, httpx.Client(timeout=60, limits=limits) as pool:
        url = svc.endpoint
        # A lone request on an idle pod keeps its connection: nothing to spread.
        alone = pool.post(url + "/v2/models/tts/infer", json=v2_request(TEXT))
        assert alone.headers.get("connection") != "close", alone.headers
        # The pool fills with connections to the only ready pod.
        before: Counter[str] = Counter()
        _load(url, pool, 2 * CLIENTS, before)
        assert before == {"first": 2 * CLIENTS}
        svc.add_target("127.0.0.1", added.http_port)
        after: Counter[str] = Counter()
        _load(url, pool, AFTER, after)

    if close_when_busy == "true":
        # Each busy answer sends the next request on that connection to a pod kube-proxy picks: half of
        # them to the added one (binomial: 48 requests at 1/2 give 17-31 in 99 % of runs; the added
        # pod, idle at first, keeps its connections while it keeps up, so it can take more).
        assert after["added"] >= AFTER // 4, after
    else:
        # The pinning it prevents: every request stays on the pool's connections to the first pod.
        assert after == {"first": AFTER}, after
