"""What shadow records cost a request: the same v2 requests to two predictors with SHADOW_SINK off and
one writing to S3, taking turns request by request (the order rotates), so drift on a shared
machine lands on all alike. The two without records give the noise floor (A/A): two processes differ
by a few percent on their own. Goal: under 2 % of request latency.

The request path only queues a reference to the audio; the fingerprint and the PUTs run on a
background thread, where they still compete for the CPU. That cost is shown separately: the
fingerprint of one request's audio, in-process, next to the request's latency.
"""

from __future__ import annotations

import base64
import io
import json
import time

from bench.common import PARAMS, SENTENCE, Predictor, Row, Session, SuiteResult, log, median, percentile
from testing.bodies import v1_request, v2_request

WARMUP = 5
PAUSE_S = 0.02  # between calls: neither predictor's threads are still busy when the other starts


def _timed_post(p: Predictor, body: bytes) -> float:
    t = time.perf_counter()
    r = p.client.post("/v2/models/tts/infer", content=body, headers={"content-type": "application/json"})
    elapsed = time.perf_counter() - t
    if r.status_code != 200:
        raise RuntimeError(f"v2 infer answered {r.status_code}: {r.text[:300]}")
    return elapsed


def _fingerprint_ms(p: Predictor) -> tuple[float, float]:
    """(ms to fingerprint one request's audio, its audio seconds), on this process's CPU."""
    import soundfile

    from predictor.audio import fingerprint

    r = p.client.post("/v1/models/tts:predict", json=v1_request(SENTENCE, **PARAMS))
    r.raise_for_status()
    audio, rate = soundfile.read(
        io.BytesIO(base64.b64decode(r.json()["predictions"][0]["wav_base64"])), dtype="float32"
    )
    fingerprint.fingerprint(audio, rate)  # first call builds the filter bank
    runs = []
    for _ in range(20):
        t = time.perf_counter()
        fingerprint.fingerprint(audio, rate)
        runs.append(time.perf_counter() - t)
    return median(runs) * 1e3, len(audio) / rate


def run(session: Session, n: int = 200) -> SuiteResult:
    from predictor.storage.s3 import s3_client

    res = SuiteResult()
    bucket = "bench-shadow"
    _ = session.moto  # starts moto and exports its AWS_* variables to this process, for s3_client below
    client = s3_client(concurrency=1)
    client.create_bucket(Bucket=bucket)
    # Two predictors without records: their A/A ratio is the noise floor between two processes, the
    # smallest on/off difference this machine can resolve.
    off_a = Predictor(session, session.path("model-off-a"))
    off_b = Predictor(session, session.path("model-off-b"))
    on = Predictor(session, session.path("model-on"), SHADOW_SINK=f"s3://{bucket}/run", REVISION="bench")
    for p in (off_a, off_b, on):
        p.wait_ready()
    body = json.dumps(v2_request(SENTENCE, **PARAMS)).encode()
    for _ in range(WARMUP):
        for p in (off_a, off_b, on):
            _timed_post(p, body)

    lat_a: list[float] = []
    lat_b: list[float] = []
    lat_on: list[float] = []
    for i in range(n):
        trio = [(off_a, lat_a), (off_b, lat_b), (on, lat_on)]
        # Every predictor goes first, second and third equally often.
        for p, out in trio[i % 3 :] + trio[: i % 3]:
            out.append(_timed_post(p, body))
            time.sleep(PAUSE_S)
    lat_off = lat_a + lat_b
    dropped = on.samples("tts_shadow_records_total", "outcome").get("dropped", 0.0)
    fp_ms, audio_s = _fingerprint_ms(off_a)
    on.stop()  # SIGTERM: the tail of records is written before it exits
    off_a.stop()
    off_b.stop()

    listing = client.list_objects_v2(Bucket=bucket, Prefix="run/").get("Contents", [])
    written = sum(
        len(client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read().splitlines()) for o in listing
    )

    m_off, m_on = median(lat_off), median(lat_on)
    overhead = m_on / m_off - 1
    noise = median(lat_b) / median(lat_a) - 1
    log(
        f"shadow: median {m_off * 1e3:.1f} ms off, {m_on * 1e3:.1f} ms on ({overhead:+.2%}); A/A {noise:+.2%}; "
        f"{written} records, {dropped:.0f} dropped"
    )
    res.rows.append(
        Row(
            "shadow",
            "v2 latency, SHADOW_SINK=s3 (median)",
            m_on,
            "s",
            "SHADOW_SINK off",
            m_off,
            ratio=m_on / m_off,
            goal="< 1.02x",
            # Only a verdict when two identical processes agree within the goal; otherwise it is noise.
            met=overhead < 0.02 if abs(noise) < 0.02 else None,
            note=f"{n} requests to it, {2 * n} to two predictors without records, rotating order; "
            f"p90 {percentile(lat_on, 90) * 1e3:.1f} vs {percentile(lat_off, 90) * 1e3:.1f} ms",
        )
    )
    res.rows.append(
        Row(
            "shadow",
            "A/A: second predictor without records (noise floor)",
            median(lat_b),
            "s",
            "first predictor without records",
            median(lat_a),
            ratio=median(lat_b) / median(lat_a),
            note="two identical processes; an on/off difference smaller than this is not resolved",
        )
    )
    res.rows.append(
        Row(
            "shadow",
            "fingerprint per request (background thread)",
            fp_ms,
            "ms",
            "request latency",
            m_off * 1e3,
            ratio=fp_ms / 1e3 / m_off,
            ratio_label="of request",
            note=f"{audio_s:.2f} s of audio; CPU the background thread takes from the request path's neighbours",
        )
    )
    res.details = {
        "n": n,
        "latency_off_a_s": lat_a,
        "latency_off_b_s": lat_b,
        "latency_on_s": lat_on,
        "records_written": written,
        "records_dropped": dropped,
        "fingerprint_ms": fp_ms,
        "audio_s": audio_s,
    }
    expected = n + WARMUP  # every v2 request `on` answered (the fingerprint's v1 request went to `off_a`)
    if written != expected:
        res.notes.append(f"expected {expected} records in S3, found {written} ({dropped:.0f} dropped)")
    return res
