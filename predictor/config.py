"""Every knob of the predictor, read once from the environment.

Each field is an environment variable of the same name (upper case), grouped by concern (GROUPS, the
order of docs/settings.md, which `make docs` renders from this module: `python -m predictor.config
--markdown`). An invalid value fails at start with a message naming the variable; nothing else in the
package reads os.environ for configuration (boto3 reads the standard AWS_* variables itself, as
KServe users expect).

Conventions: a list is comma-separated (a JSON list or object is still read, as older manifests wrote
MODEL_ALIASES and VOICE_ALIASES); a value the process works out itself is `auto`, a feature turned off
is `none` (the `0` older manifests used for both still reads the same); every unit is in the name
(`_s`, `_ms`, `_bytes`, `_mib`, `_chars`, `_frames`) or in the description, and so is the reason for
the default.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
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


def _comma_list(value: Any) -> Any:
    """A comma-separated list (blanks dropped); a JSON list is still read, as older manifests wrote one."""
    if not isinstance(value, str):
        return value
    if value.lstrip().startswith("["):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"starts with '[' but is not a JSON list ({exc})") from None
    return [item.strip() for item in value.split(",") if item.strip()]


def _comma_pairs(value: Any) -> Any:
    """Comma-separated name=value pairs (an empty value is allowed); a JSON object is still read."""
    if not isinstance(value, str):
        return value
    if value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"starts with '{{' but is not a JSON object ({exc})") from None
    pairs = {}
    for item in filter(None, (p.strip() for p in value.split(","))):
        name, sep, target = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{item!r} is not name=voice (name= for the model's default voice)")
        pairs[name.strip()] = target.strip()
    return pairs


# Deprecated spellings read by the last Settings built; `serve` logs them once logging is configured,
# so a JSON log stays JSON (take_deprecations).
_DEPRECATIONS: list[str] = []


def take_deprecations() -> list[str]:
    """The deprecated spellings the environment used, each once."""
    found = list(dict.fromkeys(_DEPRECATIONS))
    _DEPRECATIONS.clear()
    return found


# Settings whose 0 once meant a word, and the word it meant (read with a deprecation warning).
_ZERO_MEANS = {
    "grpc_port": "none",
    "gpu_memory_fraction": "none",
    "cpu_threads": "auto",
    "max_batch_size": "auto",
    "default_length_scale": "voice",
}


def _word_for_zero(word: str, value: Any, variable: str) -> Any:
    """`word` for the 0 older manifests used to mean it (still read, with a warning)."""
    if isinstance(value, str) and value.strip().lower() == word:
        return word
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            zero = float(value) == 0
        except ValueError:
            return value
        if zero:
            _DEPRECATIONS.append(f"{variable}=0 is deprecated; write {variable}={word}")
            return word
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    # --- identity and ports ---
    model_name: str = Field(
        "tts", description="Model name in the v1/v2 routes. Default: short, as clients write it in every URL."
    )
    model_version: str = Field(
        "1",
        min_length=1,
        description="The one model version served: v2 versioned routes and gRPC version fields naming it "
        "answer as unversioned ones, any other version is 404 / NOT_FOUND. Default: a revision serves "
        "one artifact, so one version; set it to the artifact's version to make clients name it.",
    )
    http_port: int = Field(8080, ge=1, le=65535, description="REST port. Default: KServe's.")
    grpc_port: Annotated[int, Field(ge=1, le=65535)] | Literal["none"] = Field(
        8081, description="gRPC port, or none to serve REST only. Default: KServe's."
    )

    # --- artifact and fetch: storage -> MODEL_DIR ---
    voice_uri: str = Field(
        "",
        description="s3://bucket/prefix, file:///path or a plain path holding manifest.json; "
        "empty: MODEL_DIR must already hold a verified artifact (a volume, the image).",
    )
    model_dir: Path = Field(
        Path("/mnt/models"),
        description="Where the artifact lands (the pod's emptyDir). Default: KServe's model mount path.",
    )
    fetch_concurrency: int = Field(
        16,
        ge=1,
        le=64,
        description="Parallel ranged GETs across all files, connections. Default: S3 serves ~90 MB/s per "
        "connection, so 16 of them make the node's link, not S3, the limit.",
    )
    fetch_part_size_mib: int = Field(
        8,
        ge=1,
        le=1024,
        description="Size of one ranged GET, MiB. Default: a retry re-reads at most this much, and a "
        "voice of tens of MiB still spreads over every connection.",
    )
    fetch_retries: int = Field(
        5,
        ge=0,
        le=20,
        description="Retries per part after the first attempt, on retryable errors (connections, 5xx, "
        "throttling). Default: with FETCH_BACKOFF_S, ~6 s of waits (0.2 + 0.4 + 0.8 + 1.6 + 3.2) "
        "ride out a blip before the model stays not ready and waits FETCH_RECOVERY_S.",
    )
    fetch_backoff_s: float = Field(
        0.2,
        ge=0,
        le=30,
        description="First retry delay of a part, seconds; doubles each retry, +-50 % jitter (a "
        "whole-artifact retry starts at 4x this). Default: short enough that a dropped connection costs "
        "little, long enough to let throttling ease.",
    )
    fetch_recovery_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Seconds between whole fetches once the retries are spent: the model stays not ready "
        "and the fetch starts again (resuming what is on disk) until storage answers, without a restart. "
        "Default: well inside a startup probe's budget, rare enough not to load a struggling S3.",
    )
    s3_read_timeout_s: float = Field(
        60.0,
        gt=0,
        le=600,
        description="Seconds an S3 connection may stay silent before it counts as dropped (fetch: the part "
        "is retried from where it stopped; event outputs: 503; shadow sink: retried, then lost). "
        "Default: botocore's.",
    )

    # --- engine ---
    engine: Literal["auto", "torch", "onnx"] = Field(
        "auto",
        description="torch: our native PyTorch VITS; onnx: onnxruntime on Piper's graph; auto: the one "
        "measured fastest on DEVICE (onnx on CPU, torch on CUDA or when DTYPE/COMPILE ask for torch).",
    )
    device: str = Field(
        "cpu",
        description="cpu, cuda or cuda:N (CUDA_VISIBLE_DEVICES renumbers cards from 0). Default: every node has a CPU.",
    )
    dtype: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="Precision of the torch decoder (HiFi-GAN); text encoder, durations and flow stay fp32. "
        "fp16 needs CUDA. Default: the precision of the published weights.",
    )
    compile: bool = Field(
        False,
        description="torch.compile the decoder during warm-up, so its cost is paid before ready. Default "
        "off: compiling lengthens every cold start.",
    )
    gpu_memory_fraction: Annotated[float, Field(gt=0.0, le=1.0)] | Literal["none"] = Field(
        "none",
        description="Most of the GPU's memory this process may take, a fraction in (0, 1], so a neighbour on "
        "the same GPU is not starved; none for no cap. Default: one predictor per GPU.",
    )
    cpu_threads: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = Field(
        "auto",
        description="Intra-op threads, or auto: the container's CPU quota (cgroup), not the host's cores, "
        "which would oversubscribe a small pod on a large node.",
    )
    engine_workers: int = Field(
        1,
        ge=1,
        le=16,
        description="Engine calls run at once, workers: each has a copy of the engine of its own (its memory "
        "again) and CPU_THREADS / ENGINE_WORKERS intra-op threads; at most one worker per CPU thread. "
        "Where that share is less than "
        "CPU_THREADS, one copy more (the solo worker) with all of them runs a call that would run alone, "
        "so a lone request is as fast as with one worker. Default: one, the engine's calls serialized; "
        "the CPU manifests set 2 (bench piper: more throughput under load for the same lone-request "
        "latency); a GPU runs one graph at a time and batches instead.",
    )
    warmup_text: str = Field(
        "Warming up the voice.",
        min_length=1,
        description="Synthesized before ready, so the first request finds kernels chosen and memory "
        "allocated. Default: one short sentence.",
    )

    # --- request limits: what one request may ask for ---
    max_text_chars: int = Field(
        5_000,
        ge=1,
        description="Longest text per item of a v2, v1 or event request, characters. Default: a whole "
        "response is held in memory; longer texts belong on the speech route, which streams.",
    )
    max_batch_items: int = Field(
        64,
        ge=1,
        description="Most texts in one v2 request (shape [N]), texts. Default: 64 x MAX_TEXT_CHARS stays "
        "under MAX_REQUEST_BYTES.",
    )
    max_stream_text_chars: int = Field(
        50_000,
        ge=1,
        description="Longest input of /v1/audio/speech, characters. Default: a chapter; memory stays "
        "bounded by one segment, since the route synthesizes segment by segment.",
    )
    max_engine_calls: int = Field(
        1_000,
        ge=1,
        description="Most engine calls one request may make (the speech route makes one per segment); "
        "beyond it 413 before any synthesis. Default: a 50,000-character chapter of ordinary sentences "
        "makes about 500; a text of 12,500 'Hi.'s would make 12,500.",
    )
    max_request_audio_s: float = Field(
        6_000.0,
        gt=0,
        description="Most audio one request may ask for, seconds, bounded from its text before synthesis "
        "(0.1 s per character x length_scale; the default voice speaks about 0.06 s per character); "
        "beyond it 413. Default: MAX_STREAM_TEXT_CHARS at normal speed with a 20 % margin.",
    )

    # --- speech route (/v1/audio/speech) ---
    max_segment_chars: int = Field(
        300,
        ge=20,
        le=5000,
        description="Longest segment the speech route cuts a text into, characters. Default: a few "
        "sentences: shorter segments start sooner, longer ones keep the prosody of a clause.",
    )
    crossfade_ms: float = Field(
        50.0,
        ge=0,
        le=500,
        description="Overlap between consecutive segments, ms. Default: long enough to hide the seam, "
        "short enough not to blur a word.",
    )
    model_aliases: Annotated[list[str], NoDecode] = Field(
        ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"],
        description="Model names the speech route accepts besides MODEL_NAME, comma-separated. Default: "
        "OpenAI's, so OpenAI clients work unchanged.",
    )
    voice_aliases: Annotated[dict[str, str], NoDecode] = Field(
        dict.fromkeys(OPENAI_VOICES, ""),
        description="Voice names the speech route accepts and the voice each stands for, comma-separated "
        "name=voice pairs (name= for the model's default voice). Default: OpenAI's voices, each the "
        "default voice, so OpenAI clients work unchanged.",
    )

    # --- streaming: the decoder runs over latent-frame windows (hop_length samples per frame, 11.6 ms
    # for a 22,050 Hz voice with hop 256); each window's decoder also reads its receptive field on both
    # sides (onnx: its first stage 13 frames, the rest 1.4).
    stream_first_window_frames: int = Field(
        24,
        ge=1,
        le=1000,
        description="Frames of a stream's first decoder window (24 = 0.28 s at 22,050 Hz; the first sentence's: "
        "a later sentence starts while the earlier ones play, with a STREAM_WINDOW_FRAMES window): the first "
        "audio waits for text encoder, durations and prior, then this much flow (onnx; torch: the whole flow) "
        "and decoding. Default: short, so the first audio waits little; smaller windows pay their context "
        "more often. A window shorter than CROSSFADE_MS of audio (50 ms: 5 frames) sends nothing until the next "
        "window comes, its last CROSSFADE_MS being held back for a following segment's crossfade.",
    )
    stream_window_frames: int = Field(
        192,
        ge=8,
        le=10_000,
        description="Frames of the decoder window after the first (192 = 2.2 s), at least the first's; each later "
        "window is twice the one before, since it is decoded while all the audio before it plays. Larger "
        "costs fewer context frames (twice the receptive field per window, ~26; onnx runs them through the "
        "decoder's first stage only, ~3 through the rest) but the second window must be decoded while the "
        "first one plays. Default: 192 frames decode in ~70 ms on two CPU threads, "
        "well within the first window's 0.28 s on one.",
    )

    # --- batching and the queue: one engine thread behind a bounded queue ---
    max_batch_size: Annotated[int, Field(ge=1, le=256)] | Literal["auto"] = Field(
        "auto",
        description="Most texts of compatible requests (same parameters, no seed) run as one engine call, texts; auto: the device's "
        "measured best (1 on CPU, where batching measured slower; 16 on CUDA).",
    )
    max_batch_delay_ms: float = Field(
        5.0,
        ge=0,
        le=1000,
        description="How long the first request of a batch waits for companions, ms. Default: short against a "
        "synthesis (hundreds of ms), so a lone request barely waits.",
    )
    max_queue: int = Field(
        32,
        ge=1,
        description="Requests waiting for the engine; one more is refused at once with 503 and "
        "Retry-After (gRPC UNAVAILABLE). Default: room for a burst; past it a client does better on "
        "another replica than at the back of this queue.",
    )
    request_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A request still queued after this long is dropped with 503 before it costs engine "
        "time, seconds. Default: a client that waited longer has likely given up.",
    )
    memory_trim: bool = Field(
        True,
        description="Once the last request in flight has been answered and a second has passed with no new "
        "one, give the heap memory they freed back to the kernel (glibc malloc_trim), so resident memory "
        "returns to its idle size instead of staying at its peak; after the first time, only once resident "
        "memory has grown by more than 64 MiB since the last trim. Default on: it runs only when the pod "
        "is idle and has something to give back, and not between requests that follow each other, which "
        "would fault their pages in again.",
    )

    # --- connection limits: what one client may cost the pod, REST and gRPC ---
    max_request_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest request body (REST) or message (gRPC), bytes; a larger one is refused with 413 "
        "(RESOURCE_EXHAUSTED) before it is read in full or parsed. Default: twice the largest valid "
        "request, MAX_BATCH_ITEMS texts of MAX_TEXT_CHARS characters JSON-escaped (~2 MB).",
    )
    max_header_bytes: int = Field(
        16 * 1024,
        ge=1024,
        description="Largest request head (request line and headers; gRPC metadata), bytes; beyond it "
        "431 (h11), or the gRPC stream is reset. Bounds what a client that never finishes its headers "
        "holds. Default: room for long cookies and tracing headers.",
    )
    max_header_count: int = Field(
        100,
        ge=8,
        description="Most request headers (REST), headers; one more is refused with 431. Default: "
        "generous for clients, bounded for the server.",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest a client may take to send its request body, seconds; then 408 and the "
        "connection is closed. A client sending one byte a second holds a socket, never the engine. "
        "Default: a whole MAX_REQUEST_BYTES body at ~1.1 Mbit/s.",
    )
    head_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Longest a client may take to send a request head, seconds, from connecting or from "
        "its first byte after a response; then the connection is closed. Default: heads come in one piece "
        "from proxies and clients alike, so 10 s is slack for any real client and short for a stalled one.",
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="Most concurrent HTTP connections and in-progress requests and concurrent gRPC calls; "
        "beyond it 503 with Retry-After / RESOURCE_EXHAUSTED, except for the health, readiness and metrics "
        "paths, which are always answered. Bounds sockets and memory, not synthesis (MAX_QUEUE does that). "
        "Default: far above MAX_QUEUE, so the queue sheds load first.",
    )
    close_when_busy: bool = Field(
        True,
        description="While the pod holds more requests than its engine workers run at once, answers carry "
        "Connection: close (REST), so a keep-alive pool in front of a Service (the KEDA HTTP add-on's "
        "interceptor, any proxy through a ClusterIP) dials again and kube-proxy sends the next request to "
        "any ready pod. Without it, a pool filled while one pod was ready keeps every request on that pod "
        "after others are added: measured on the keda flavour's burst, three scaled-out pods took no "
        "request while the first answered 503 to almost half (docs/cluster.md). Envoy's overload manager "
        "does the same (disable_http_keepalive). Default on: an idle or keeping-up pod keeps its connections "
        "(tests/system/test_keepalive.py).",
    )
    keepalive_timeout_s: float = Field(
        65.0,
        gt=0,
        description="How long an idle keep-alive connection (REST) or idle connection (gRPC) is held, seconds. Default: KServe's; above "
        "the 60 s idle timeout of common load balancers, so they close first.",
    )

    # --- lifecycle ---
    drain_timeout_s: float = Field(
        25.0,
        ge=0,
        description="On SIGTERM, how long admitted requests may finish, seconds. Default: below "
        "Kubernetes' 30 s terminationGracePeriodSeconds, which it must stay under.",
    )

    # --- synthesis defaults ---
    default_length_scale: Annotated[float, Field(ge=0.1, le=5.0)] | Literal["voice"] = Field(
        "voice",
        description="length_scale where a request sets none (v2, v1, CloudEvents; the speech route's speed sets its own), in [0.1, 5] (>1 "
        "speaks slower), or voice: the voice's own (its config.json), as it was trained.",
    )

    # --- revision and shadow traffic: request ids, revision, records for canary verdicts ---
    revision: str = Field(
        "",
        description="Revision name on responses (x-tts-revision) and shadow records; empty = K_REVISION, "
        "else local.",
    )
    k_revision: str = Field(
        "", description="Set by Knative to the serving revision's name; read, never set by hand."
    )
    shadow_sink: str = Field(
        "",
        description="Where shadow records go: empty = off, stdout, s3://bucket/prefix, or a local "
        "directory. Default off: a deployment chooses where its records go.",
    )
    shadow_batch_records: int = Field(
        500,
        ge=1,
        le=100_000,
        description="Records per written batch (one S3 object), records. Default: S3 bills per request.",
    )
    shadow_flush_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="Longest a record waits in memory before its batch is written, seconds. Default: "
        "bounds what a crash (not SIGTERM, which flushes) loses and how stale compare's input is.",
    )
    shadow_queue: int = Field(
        256,
        ge=1,
        le=100_000,
        description="Finished requests waiting for their record (each holds its audio), requests; one "
        "more is dropped and counted, never waited for. Default: bounds the audio held while a sink is slow.",
    )
    shadow_mos_sample: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Share of recorded requests whose record carries a DNSMOS MOS estimate, a fraction "
        "(0: none). Chosen by a hash of the request id, so stable and canary score the same requests; "
        "computed on the records' thread (one core, ~0.5-1 s per clip), skipped when that thread is "
        "behind. Default: 20 scored pairs (compare's minimum) in ~400 requests.",
    )

    # --- CloudEvents ---
    ce_request_type: str = Field(
        "dev.tts-predictor.synthesize.v1", description="Event type accepted on the v1 predict path."
    )
    ce_reply_type: str = Field(
        "dev.tts-predictor.synthesized.v1",
        description="Type of the reply event; must differ from the request type, or a Trigger would loop.",
    )
    ce_source: str = Field("", description="Source of reply events; empty = /models/<MODEL_NAME>.")
    ce_inline_max_bytes: int = Field(
        1024 * 1024,
        ge=1,
        description="Largest encoded audio an event reply carries inline (base64 adds a third on the "
        "wire), bytes; a larger result is refused with 413 asking for data.output. Default: brokers cap "
        "event size (Kafka: 1 MB by default); lower it to fit yours.",
    )
    ce_output_prefixes: Annotated[list[str], NoDecode] = Field(
        [],
        description="s3://bucket/prefix locations an event's data.output may name, comma-separated; an "
        "output anywhere else is refused with 403 before storage is touched. Default none: no event may "
        "write (inline replies only), so an event cannot aim the pod's credentials at any bucket they reach.",
    )
    ce_output_part_size_mib: int = Field(
        8,
        ge=5,
        le=5120,
        description="Event outputs go to S3 as multipart uploads in parts of this size, MiB (most in one "
        "part); visible only when complete, and a failed one is aborted before the event is answered. "
        "Default: S3's smallest part is 5 MiB; 8 as for the fetch.",
    )

    # --- observability ---
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO",
        description="Log level. Default: no line per request (our counters replace KServe's request log).",
    )
    log_format: Literal["json", "text"] = Field(
        "json", description="json: one JSON object per line, as log collectors parse; text for a terminal."
    )
    otel_exporter_otlp_endpoint: str = Field(
        "", description="OTLP/HTTP endpoint (OpenTelemetry's variable); empty = tracing off."
    )
    otel_service_name: str = Field(
        "tts-predictor", description="service.name on spans (OpenTelemetry's variable)."
    )

    # --- development ---
    playground: bool = Field(
        False,
        description="Serve the playground page (GET / and /playground: type, hear it stream, download). "
        "For `make run` and laptops; off in every manifest, as a production pod serves no UI on its "
        "inference port.",
    )

    @field_validator(*_ZERO_MEANS, mode="before")
    @classmethod
    def _zero_as_word(cls, v: Any, info: ValidationInfo) -> Any:
        name = info.field_name or ""
        return _word_for_zero(_ZERO_MEANS[name], v, name.upper())

    @field_validator("model_aliases", "ce_output_prefixes", mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        return _comma_list(v)

    @field_validator("voice_aliases", mode="before")
    @classmethod
    def _pairs(cls, v: Any) -> Any:
        return _comma_pairs(v)

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
    def _output_prefixes(cls, v: list[str]) -> list[str]:
        for prefix in v:
            rest = prefix[len("s3://") :] if prefix.startswith("s3://") else ""
            if not rest.split("/", 1)[0]:
                raise ValueError(f"{prefix!r} is not s3://bucket or s3://bucket/prefix")
        return v

    @property
    def output_prefixes(self) -> list[str]:
        """CE_OUTPUT_PREFIXES as directory URIs ending in "/": s3://b/out allows s3://b/out/x, not s3://b/outer."""
        return [p.rstrip("/") + "/" for p in self.ce_output_prefixes]

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
        """MAX_BATCH_SIZE with auto resolved to the device's (device_batch_size)."""
        return device_batch_size(self.device) if self.max_batch_size == "auto" else self.max_batch_size

    @property
    def grpc_listen_port(self) -> int | None:
        """GRPC_PORT, None when gRPC is off."""
        return None if self.grpc_port == "none" else self.grpc_port

    @property
    def gpu_memory_cap(self) -> float | None:
        """GPU_MEMORY_FRACTION, None for no cap."""
        return None if self.gpu_memory_fraction == "none" else self.gpu_memory_fraction

    @property
    def length_scale_default(self) -> float | None:
        """DEFAULT_LENGTH_SCALE, None for the voice's own."""
        return None if self.default_length_scale == "voice" else self.default_length_scale

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
        return container_cpus() if self.cpu_threads == "auto" else self.cpu_threads

    def workers(self) -> int:
        """ENGINE_WORKERS, at most one per CPU thread: more would only share CPUs (a 1-CPU pod of a
        manifest that sets 2 runs one)."""
        return min(self.engine_workers, self.threads())

    def worker_threads(self) -> int:
        """Each engine worker's share of CPU_THREADS."""
        return self.threads() // self.workers()

    def segments_per_call(self) -> int:
        """Consecutive segments of one request that go to the engine as one call: MAX_BATCH_SIZE, or,
        where onnxruntime runs on two CPU threads or more, twice that many threads (at most
        MAX_BATCH_ITEMS), since the engine then runs a call's sentences side by side, one thread each
        (engine/lanes.py): three sentences about 10 %, ten about 14 % sooner than one at a time on
        two threads (docs/benchmarks.md, "Lanes"). Seeded segments are numbered through the request, so the
        grouping does not change which noise each one draws."""
        if self.batch_size > 1 or self.engine_name != "onnx" or self.device != "cpu" or self.threads() < 2:
            return self.batch_size
        return min(2 * self.threads(), self.max_batch_items)

    def solo_worker(self) -> bool:
        """Whether a copy with all of CPU_THREADS runs the calls that would run alone (ENGINE_WORKERS)."""
        return self.workers() > 1  # a worker's share is then less than all of CPU_THREADS


# The order and titles of docs/settings.md; every field of Settings is in exactly one group
# (tests/unit/test_config.py).
GROUPS: dict[str, tuple[str, ...]] = {
    "Identity and ports": ("model_name", "model_version", "http_port", "grpc_port"),
    "Artifact and fetch": (
        "voice_uri",
        "model_dir",
        "fetch_concurrency",
        "fetch_part_size_mib",
        "fetch_retries",
        "fetch_backoff_s",
        "fetch_recovery_s",
        "s3_read_timeout_s",
    ),
    "Engine": (
        "engine",
        "device",
        "dtype",
        "compile",
        "gpu_memory_fraction",
        "cpu_threads",
        "engine_workers",
        "warmup_text",
    ),
    "Request limits": (
        "max_text_chars",
        "max_batch_items",
        "max_stream_text_chars",
        "max_engine_calls",
        "max_request_audio_s",
    ),
    "Speech route": ("max_segment_chars", "crossfade_ms", "model_aliases", "voice_aliases"),
    "Streaming": ("stream_first_window_frames", "stream_window_frames"),
    "Batching and queue": (
        "max_batch_size",
        "max_batch_delay_ms",
        "max_queue",
        "request_timeout_s",
        "memory_trim",
    ),
    "Connection limits": (
        "max_request_bytes",
        "max_header_bytes",
        "max_header_count",
        "body_timeout_s",
        "head_timeout_s",
        "max_connections",
        "close_when_busy",
        "keepalive_timeout_s",
    ),
    "Lifecycle": ("drain_timeout_s",),
    "Synthesis defaults": ("default_length_scale",),
    "Revision and shadow traffic": (
        "revision",
        "k_revision",
        "shadow_sink",
        "shadow_batch_records",
        "shadow_flush_s",
        "shadow_queue",
        "shadow_mos_sample",
    ),
    "CloudEvents": (
        "ce_request_type",
        "ce_reply_type",
        "ce_source",
        "ce_inline_max_bytes",
        "ce_output_prefixes",
        "ce_output_part_size_mib",
    ),
    "Observability": ("log_level", "log_format", "otel_exporter_otlp_endpoint", "otel_service_name"),
    "Development": ("playground",),
}


# The module docstring's conventions, which docs/settings.md opens with.
_CONVENTIONS = " ".join((__doc__ or "").split("Conventions: ", 1)[1].split())
_CONVENTIONS = _CONVENTIONS[:1].upper() + _CONVENTIONS[1:]


def _env_value(value: Any) -> str:
    """A default as it would be written in the environment."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def settings_markdown() -> str:
    """docs/settings.md: every variable by group, with its default and description (`make docs`)."""
    fields = Settings.model_fields
    lines = [
        "# Settings",
        "",
        "<!-- Generated by `make docs` (python -m predictor.config --markdown) from predictor/config.py;",
        "     edit the descriptions there. tests/unit/test_config.py fails when this file drifts. -->",
        "",
        "Every knob is an environment variable, read once at start; an invalid value stops the process "
        "with a message naming the variable (exit 2). " + _CONVENTIONS,
    ]
    for title, names in GROUPS.items():
        lines += ["", f"## {title}", "", "| variable | default | description |", "|---|---|---|"]
        for name in names:
            info = fields[name]
            default = _env_value(info.default)
            shown = f"`{default}`" if default else "(empty)"
            description = " ".join((info.description or "").split()).replace("|", "\\|")
            lines.append(f"| `{name.upper()}` | {shown} | {description} |")
    return "\n".join(lines) + "\n"


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
        # One entry per variable: a value that may be a number or a word fails both, said once.
        problems: dict[str, tuple[list[str], Any]] = {}
        for err in exc.errors():
            var = str(err["loc"][0]).upper() if err["loc"] else "?"
            problems.setdefault(var, ([], err.get("input")))[0].append(err["msg"])
        raise ConfigError(
            "invalid configuration: "
            + "; ".join(f"{var}: {', or '.join(msgs)} (got {got!r})" for var, (msgs, got) in problems.items())
        ) from None
    except SettingsError as exc:
        # A variable pydantic-settings could not decode before validation, naming the field.
        field = re.search(r'field "([^"]+)"', str(exc))
        var = field.group(1).upper() if field else "?"
        raise ConfigError(f"invalid configuration: {var}: {exc.__cause__ or exc}") from None


def main(argv: list[str]) -> int:
    """`python -m predictor.config --markdown`: docs/settings.md on stdout."""
    if argv != ["--markdown"]:
        print("usage: python -m predictor.config --markdown > docs/settings.md", file=sys.stderr)
        return 2
    sys.stdout.write(settings_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
