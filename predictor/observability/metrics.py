"""Prometheus metrics, all prefixed `tts_`, served on the REST port at /metrics.

Names and labels are a contract with dashboards, alerts and autoscalers (docs/observability.md lists them): add,
don't rename. Label values are bounded (route templates, status codes, phases), never request data.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from predictor.observability import memory

# Cold start runs once per process; the phase gauges hold its durations for the life of the pod.
COLD_START_SECONDS = Gauge(
    "tts_cold_start_seconds",
    "Duration of each cold-start phase of this process, seconds (phase=fetch|load|warmup|total).",
    ["phase"],
)
FETCH_BYTES = Counter("tts_fetch_bytes", "Bytes of model artifact downloaded into MODEL_DIR.")
FETCH_FILES = Counter(
    "tts_fetch_files", "Artifact files by outcome (downloaded, or skipped as already verified).", ["outcome"]
)
COLD_START_FAILURES = Counter(
    "tts_cold_start_failures",
    "Whole artifact fetches that failed at cold start, by reason (unreachable, not_found, integrity, "
    "model_dir, unsafe_path, storage); the model stays not ready and the fetch is tried again.",
    ["reason"],
)
READY = Gauge("tts_model_ready", "1 once the model is loaded and warm, 0 before and while draining.")

REQUESTS = Counter("tts_requests", "Requests handled, by route template and status code.", ["route", "code"])
ERRORS = Counter(
    "tts_request_errors", "Requests answered with a status >= 400, by route and code.", ["route", "code"]
)
IN_FLIGHT = Gauge("tts_in_flight_requests", "Synthesis requests admitted and not yet answered.")
QUEUE_DEPTH = Gauge("tts_queue_depth", "Synthesis requests waiting for the engine.")
QUEUE_WAIT_SECONDS = Histogram(
    "tts_queue_wait_seconds",
    "Time a request waited for the engine, seconds.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
BATCH_SIZE = Histogram("tts_batch_size", "Texts per engine call.", buckets=(1, 2, 4, 8, 16, 32, 64, 128))
REJECTED = Counter(
    "tts_rejected_requests",
    "Requests shed by the batcher (reason=queue_full|timeout|cancelled).",
    ["reason"],
)

FIRST_PACKET_SECONDS = Histogram(
    "tts_first_packet_seconds",
    "From a speech request's arrival to its first audio leaving the synthesizer, seconds.",
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10),
)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SYNTHESIS_SECONDS = Histogram(
    "tts_synthesis_seconds", "Engine time per request (all items), seconds.", buckets=_LATENCY_BUCKETS
)
AUDIO_SECONDS = Histogram(
    "tts_audio_seconds",
    "Seconds of audio produced per request.",
    buckets=(0.5, 1, 2, 5, 10, 20, 60, 120, 300, 900),
)
REAL_TIME_FACTOR = Histogram(
    "tts_real_time_factor",
    "Engine seconds per second of audio produced (lower is faster; < 1 is faster than real time).",
    buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5),
)

EVENT_OUTPUTS = Counter(
    "tts_event_outputs",
    "CloudEvents with an S3 output, by outcome: written (synthesized and uploaded), replayed (a redelivery "
    "answered from its completion record), recovered (output found without its record, record rebuilt), "
    "joined (a duplicate that arrived while the first delivery was in flight in this process), raced (another "
    "replica wrote the output first; ours was discarded).",
    ["outcome"],
)

SHADOW_RECORDS = Counter(
    "tts_shadow_records",
    "Shadow records by outcome: written to SHADOW_SINK, dropped (queue full: requests are never slowed "
    "to keep a record), lost (the sink failed after retries).",
    ["outcome"],
)

# prometheus_client's own process collector already exports process_resident_memory_bytes (now); the
# peak is what sizes a pod's memory limit, and it cannot be read back from samples scraped every 15 s.
PEAK_RESIDENT_BYTES = Gauge(
    "tts_process_peak_resident_bytes",
    "Largest resident memory of this process since it started, bytes (VmHWM); "
    "process_resident_memory_bytes is the current figure.",
)
PEAK_RESIDENT_BYTES.set_function(memory.peak_resident_bytes)

MOS_UNSCORED = Counter(
    "tts_mos_unscored",
    "Clips the MOS estimator (DNSMOS) gave no score, by reason: too_short (under 1 s), silence (RMS under "
    "-60 dBFS), non_finite (a NaN or infinite sample).",
    ["reason"],
)

SHADOW_MOS = Counter(
    "tts_shadow_mos",
    "Shadow records sampled for a MOS estimate (SHADOW_MOS_SAMPLE), by outcome: scored; unscored (the clip "
    "could not be scored, see tts_mos_unscored_total); behind (skipped: the record queue was backing up, and "
    "a MOS estimate is never worth a dropped record).",
    ["outcome"],
)
