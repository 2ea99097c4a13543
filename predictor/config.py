"""Every knob of the predictor, read once from the environment.

Each field is an environment variable of the same name (upper case). An invalid value fails at start
with a message naming the variable; nothing else in the package reads os.environ for configuration
(boto3 reads the standard AWS_* variables itself, as KServe users expect).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

# OpenAI's built-in speech voices; VOICE_ALIASES maps them by default, so OpenAI clients work unchanged.
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
    "marin",
    "cedar",
)


# Texts per engine call (the batcher, MAX_BATCH_SIZE auto) and sentences per forward pass (the torch
# engine) on a GPU. On CPU a padded batch lost throughput in every measurement (`python -m bench
# engines`: batches of 4 and 8 sentences gave 0.5x the audio per second of running them one by one;
# oneDNN's convolutions are already parallel over time), so the CPU runs one at a time. On a GPU a
# batch fills the card; the cap bounds activation memory (batch x frames x 256).
CUDA_BATCH_SIZE = 16


def device_batch_size(device: str) -> int:
    """The batch that measured best on DEVICE: CUDA_BATCH_SIZE on a GPU, 1 on CPU."""
    return CUDA_BATCH_SIZE if device.startswith("cuda") else 1


class ConfigError(Exception):
    """A setting is invalid; the message names the environment variable."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    # --- identity and ports (KServe defaults) ---
    model_name: str = Field("tts", description="Model name in the v1/v2 routes.")
    model_version: str = Field(
        "1",
        min_length=1,
        description="The one model version served: v2 versioned routes and gRPC version fields naming it "
        "answer as unversioned ones, any other version is 404 / NOT_FOUND.",
    )
    http_port: int = Field(8080, ge=1, le=65535, description="REST port (KServe default).")
    grpc_port: int = Field(8081, ge=0, le=65535, description="gRPC port (KServe default); 0 disables.")

    # --- storage -> emptyDir ---
    storage_uri: str = Field(
        "",
        description="s3://bucket/prefix, file:///path or a plain path holding manifest.json; "
        "empty: MODEL_DIR must already hold a verified artifact.",
    )
    model_dir: Path = Field(Path("/mnt/models"), description="Where the artifact lands (the pod's emptyDir).")
    fetch_concurrency: int = Field(
        16,
        ge=1,
        le=64,
        description="Parallel ranged GETs across all files (S3 gives ~90 MB/s per connection).",
    )
    fetch_part_size_mib: int = Field(8, ge=1, le=1024, description="Bytes per ranged GET, MiB.")
    fetch_retries: int = Field(
        5, ge=0, le=20, description="Attempts per part after the first, on retryable errors."
    )
    fetch_backoff_s: float = Field(
        0.2, ge=0, le=30, description="First retry delay, seconds; doubles each retry."
    )
    s3_read_timeout_s: float = Field(
        60.0,
        gt=0,
        le=600,
        description="Seconds an S3 connection may stay silent before it counts as dropped (fetch: the part "
        "is retried from where it stopped; event outputs: 503; shadow sink: retried, then lost).",
    )
    fetch_recovery_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Seconds between whole fetches once the retries are spent: the model stays not ready "
        "and the fetch starts again (resuming what is on disk) until storage answers, without a restart.",
    )

    # --- engine ---
    engine: Literal["auto", "torch", "onnx"] = Field(
        "auto",
        description="torch: our native PyTorch VITS; onnx: onnxruntime on Piper's graph; auto: the one "
        "measured fastest on DEVICE (onnx on CPU, torch on CUDA or when DTYPE/COMPILE ask for torch).",
    )
    device: str = Field("cpu", description="cpu, cuda or cuda:N (CUDA_VISIBLE_DEVICES is honoured).")
    dtype: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="Precision of the torch decoder (HiFi-GAN); text encoder, durations and flow stay fp32. "
        "fp16 needs CUDA.",
    )
    compile: bool = Field(False, description="torch.compile the decoder during warm-up, before ready.")
    gpu_memory_fraction: float = Field(
        0.0, ge=0.0, le=1.0, description="Most of the GPU's memory this process may take (0 = no cap)."
    )
    cpu_threads: int = Field(
        0,
        ge=0,
        le=256,
        description="Intra-op threads; 0 = the container's CPU quota (cgroup), not host cores.",
    )
    warmup_text: str = Field("Warming up the voice.", min_length=1, description="Synthesized before ready.")
    max_text_chars: int = Field(
        5_000,
        ge=1,
        description="Longest accepted text per item, characters (a whole response is held in memory).",
    )
    max_batch_items: int = Field(64, ge=1, description="Most texts in one v2 request (shape [N]).")
    max_stream_text_chars: int = Field(
        50_000,
        ge=1,
        description="Longest input of /v1/audio/speech, characters (synthesized segment by segment).",
    )
    max_segment_chars: int = Field(
        300, ge=20, le=5000, description="Longest segment the speech route cuts a text into, characters."
    )
    crossfade_ms: float = Field(50.0, ge=0, le=500, description="Overlap between consecutive segments, ms.")
    # --- streaming: the decoder runs over latent-frame windows (hop_length samples per frame, 11.6 ms
    # for a 22,050 Hz voice with hop 256); each window also decodes the receptive field on both sides.
    stream_first_window_frames: int = Field(
        24,
        ge=1,
        le=1000,
        description="Frames of a stream's first decoder window (24 = 0.28 s at 22,050 Hz): the first "
        "audio waits for text encoder, durations, flow and this much decoding.",
    )
    stream_window_frames: int = Field(
        192,
        ge=8,
        le=10_000,
        description="Frames of each later decoder window (192 = 2.2 s): larger costs fewer context "
        "frames (twice the receptive field per window, ~26) but leaves the engine in longer steps.",
    )
    model_aliases: list[str] = Field(
        ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"],
        description="Model names the speech route accepts besides MODEL_NAME (OpenAI's, so OpenAI "
        "clients work unchanged); JSON list.",
    )
    voice_aliases: dict[str, str] = Field(
        dict.fromkeys(OPENAI_VOICES, ""),
        description="Voice names the speech route accepts and the voice each stands for (empty: the "
        "model's default voice); JSON object. Default: OpenAI's voices, so OpenAI clients work unchanged.",
    )

    # --- batcher: one engine thread behind a bounded queue ---
    max_batch_size: int = Field(
        0,
        ge=0,
        le=256,
        description="Most texts of compatible requests run as one engine call; 0 = per device "
        "(1 on CPU, where batching measured slower; 16 on CUDA).",
    )
    max_batch_delay_ms: float = Field(
        5.0, ge=0, le=1000, description="How long the first request of a batch waits for companions, ms."
    )
    max_queue: int = Field(
        32, ge=1, description="Requests waiting for the engine; one more is refused at once (503)."
    )
    memory_trim: bool = Field(
        True,
        description="When the last request in flight is answered, give the heap memory it freed back to "
        "the kernel (glibc malloc_trim), so resident memory returns to its idle size instead of staying "
        "at its peak.",
    )
    request_timeout_s: float = Field(
        30.0, gt=0, description="A request still queued after this long is dropped (503), seconds."
    )

    # --- connection limits: what one client may cost the pod, REST and gRPC ---
    max_request_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest request body (REST) or message (gRPC), bytes; a larger one is refused with 413 "
        "(RESOURCE_EXHAUSTED) before it is read in full or parsed. The largest valid request, "
        "MAX_BATCH_ITEMS texts of MAX_TEXT_CHARS characters JSON-escaped, is about 2 MB.",
    )
    max_header_bytes: int = Field(
        16 * 1024,
        ge=1024,
        description="Largest request head (request line and headers; gRPC metadata), bytes; beyond it "
        "431 (h11), or the gRPC stream is reset. Bounds what a client that never finishes its headers holds.",
    )
    max_header_count: int = Field(
        100, ge=8, description="Most request headers (REST); one more is refused with 431, headers."
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest a client may take to send its request body, seconds; then 408 and the "
        "connection is closed. A client sending one byte a second holds a socket, never the engine.",
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="Most concurrent HTTP connections and in-progress requests (uvicorn limit_concurrency) "
        "and concurrent gRPC calls; beyond it 503 / RESOURCE_EXHAUSTED. Bounds sockets and memory, "
        "not synthesis (MAX_QUEUE does that).",
    )
    keepalive_timeout_s: float = Field(
        65.0,
        gt=0,
        description="How long an idle keep-alive connection is held, seconds (KServe's default; above "
        "the 60 s idle timeout of common load balancers, so they close first).",
    )

    # --- lifecycle ---
    drain_timeout_s: float = Field(
        25.0,
        ge=0,
        description="On SIGTERM, how long in-flight requests may finish, seconds "
        "(keep below the pod's terminationGracePeriodSeconds).",
    )

    # --- synthesis defaults ---
    default_length_scale: float = Field(
        0.0,
        ge=0.0,
        le=5.0,
        description="length_scale where a request sets none (v2, v1, CloudEvents); "
        "0 = the voice's own (config.json). >1 speaks slower.",
    )

    # --- shadow traffic: request ids, revision, records for canary verdicts ---
    revision: str = Field(
        "",
        description="Revision name on responses (x-tts-revision) and shadow records; empty = K_REVISION, else local.",
    )
    k_revision: str = Field(
        "", description="Set by Knative to the serving revision's name; read, never set by hand."
    )
    shadow_sink: str = Field(
        "",
        description="Where shadow records go: empty = off, stdout, s3://bucket/prefix, or a local directory.",
    )
    shadow_batch_records: int = Field(
        500, ge=1, le=100_000, description="Records per written batch (one S3 object; S3 bills per request)."
    )
    shadow_flush_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="Longest a record waits in memory before its batch is written, seconds "
        "(bounds what a crash loses and how stale compare's input is).",
    )
    shadow_queue: int = Field(
        256,
        ge=1,
        le=100_000,
        description="Finished requests waiting for their record (each holds its audio); "
        "one more is dropped and counted, never waited for.",
    )
    shadow_mos_sample: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Share of recorded requests whose record carries a DNSMOS MOS estimate (0 = none). "
        "Chosen by a hash of the request id, so stable and canary score the same requests; computed on "
        "the records' thread (one core, ~0.5-1 s per clip), skipped when that thread is behind.",
    )

    # --- CloudEvents ---
    ce_request_type: str = Field(
        "dev.tts-predictor.synthesize.v1", description="Event type accepted on the v1 predict path."
    )
    ce_reply_type: str = Field(
        "dev.tts-predictor.synthesized.v1",
        description="Type of the reply event; must differ from the request type.",
    )
    ce_source: str = Field("", description="Source of reply events; empty = /models/<MODEL_NAME>.")
    ce_inline_max_bytes: int = Field(
        1024 * 1024,
        ge=1,
        description="Largest encoded audio an event reply carries inline (base64 adds a third on the wire), bytes; "
        "a larger result is refused with 413 asking for data.output. Brokers cap event size (Kafka: 1 MB by default).",
    )
    ce_output_prefixes: str = Field(
        "",
        description="Comma-separated s3://bucket/prefix locations an event's data.output may name; an "
        "output anywhere else is refused with 403 before storage is touched. Empty: no event may write "
        "(inline replies only), so an event cannot aim the pod's credentials at any bucket they reach.",
    )
    ce_output_part_size_mib: int = Field(
        8,
        ge=5,
        le=5120,
        description="Event outputs larger than this go to S3 as multipart uploads in parts of this size, MiB "
        "(S3's smallest part is 5 MiB); smaller ones as one PUT. Both become visible only when complete.",
    )

    # --- development ---
    playground: bool = Field(
        False,
        description="Serve the playground page (GET / and /playground: type, hear it stream, download). "
        "For `make run` and laptops; off in every manifest, as a production pod serves no UI on its "
        "inference port.",
    )

    # --- observability ---
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")
    log_format: Literal["json", "text"] = Field("json", description="json: one JSON object per line.")
    otel_exporter_otlp_endpoint: str = Field("", description="OTLP/HTTP endpoint; empty = tracing off.")
    otel_service_name: str = Field("tts-predictor", description="service.name on spans.")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v == "cpu" or v == "cuda" or (v.startswith("cuda:") and v[5:].isdigit()):
            return v
        raise ValueError("must be cpu, cuda or cuda:N")

    @field_validator("stream_window_frames")
    @classmethod
    def _window_frames(cls, v: int, info: ValidationInfo) -> int:
        first = info.data.get("stream_first_window_frames")
        if first is not None and v < first:
            raise ValueError(f"must be at least STREAM_FIRST_WINDOW_FRAMES ({first})")
        return v

    @field_validator("ce_reply_type")
    @classmethod
    def _reply_differs(cls, v: str, info: ValidationInfo) -> str:
        if v == info.data.get("ce_request_type"):
            raise ValueError("must differ from CE_REQUEST_TYPE, or a Trigger would loop")
        return v

    @field_validator("default_length_scale")
    @classmethod
    def _length_scale(cls, v: float) -> float:
        if v != 0 and v < 0.1:
            raise ValueError("must be 0 (the voice's own) or within [0.1, 5]")
        return v

    @field_validator("shadow_sink")
    @classmethod
    def _shadow_sink(cls, v: str) -> str:
        if v.startswith("s3://") and not v[len("s3://") :].strip("/"):
            raise ValueError("s3:// needs a bucket: s3://bucket/prefix")
        if "://" in v and not v.startswith(("s3://", "file://")):
            raise ValueError("must be empty, stdout, s3://bucket/prefix or a local directory")
        return v

    @field_validator("ce_output_prefixes")
    @classmethod
    def _output_prefixes(cls, v: str) -> str:
        for prefix in filter(None, (p.strip() for p in v.split(","))):
            rest = prefix[len("s3://") :] if prefix.startswith("s3://") else ""
            if not rest.split("/", 1)[0]:
                raise ValueError(f"{prefix!r} is not s3://bucket or s3://bucket/prefix")
        return v

    @property
    def output_prefixes(self) -> list[str]:
        """CE_OUTPUT_PREFIXES as directory URIs ending in "/": s3://b/out allows s3://b/out/x, not s3://b/outer."""
        return [p.strip().rstrip("/") + "/" for p in self.ce_output_prefixes.split(",") if p.strip()]

    @property
    def engine_name(self) -> str:
        """ENGINE with auto resolved: onnxruntime measured fastest on CPU (bench engines: torch took
        1.4-1.8x as long), torch on CUDA, and torch whenever DTYPE or COMPILE ask for it."""
        if self.engine != "auto":
            return self.engine
        if self.device.startswith("cuda") or self.dtype != "fp32" or self.compile:
            return "torch"
        return "onnx"

    @property
    def batch_size(self) -> int:
        """MAX_BATCH_SIZE with 0 resolved to the device's (device_batch_size)."""
        return self.max_batch_size or device_batch_size(self.device)

    @property
    def revision_name(self) -> str:
        return self.revision or self.k_revision or "local"

    @property
    def fetch_part_size(self) -> int:
        return self.fetch_part_size_mib * 1024 * 1024

    @property
    def reply_source(self) -> str:
        return self.ce_source or f"/models/{self.model_name}"

    def threads(self) -> int:
        return self.cpu_threads or container_cpus()


def container_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this container may use: its cgroup CPU quota (v2, then v1) if set, else the affinity mask.

    A container sees every core of the host in os.cpu_count(); sizing thread pools by that on a
    2-CPU pod of a 64-core node makes 64 threads fight over 2 CPUs' worth of quota.
    """
    affinity = len(os.sched_getaffinity(0))
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()
        if quota != "max":
            return max(1, min(affinity, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        if quota_us > 0:
            return max(1, min(affinity, quota_us // period_us))
    except (OSError, ValueError):
        pass
    return affinity


def load_settings(**overrides: Any) -> Settings:
    """Read Settings from the environment, turning validation errors into one readable message."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            var = str(err["loc"][0]).upper() if err["loc"] else "?"
            problems.append(f"{var}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
    except SettingsError as exc:
        # A list or dict variable that is not JSON fails before validation, naming the field.
        field = re.search(r'field "([^"]+)"', str(exc))
        var = field.group(1).upper() if field else "?"
        raise ConfigError(f"invalid configuration: {var}: not valid JSON ({exc.__cause__})") from None
