"""`tts-predictor` / `python -m predictor`: serve, publish, fetch, synth, compare.

`serve` starts the artifact download and the engine construction on threads before it imports
KServe, so the three overlap (see server.py); the other commands are for people and CI.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from predictor.artifact.progress import progress_bar
from predictor.config import ConfigError, load_settings

log = logging.getLogger("predictor")


# --- serve ---------------------------------------------------------------------------------
def cmd_serve(_args: argparse.Namespace) -> int:
    settings = load_settings()
    from predictor.observability import logs

    logs.configure(settings.log_level, settings.log_format)
    from predictor.serving import coldstart

    pending = coldstart.begin(settings)  # before the heavy imports below, to overlap with them

    import asyncio

    from predictor import server
    from predictor.observability import tracing

    tracing.configure(settings.otel_exporter_otlp_endpoint, settings.otel_service_name)
    try:
        asyncio.run(server.run(settings, pending))
    except ConfigError:
        raise
    except Exception as exc:
        log.error("predictor stopped: %s", exc)
        return 1
    return 0


# --- publish / fetch -----------------------------------------------------------------------
def cmd_publish(args: argparse.Namespace) -> int:
    import tempfile

    from predictor.artifact import publish

    with tempfile.TemporaryDirectory(prefix="tts-artifact-") as tmp:
        src = Path(args.source) if args.source else Path(tmp)
        if not args.source:
            publish.build_default_voice(src)
        manifest = publish.publish(src, args.to, endpoint_url=args.endpoint_url, progress=True)
    print(f"published {manifest.name}@{manifest.version} ({len(manifest.files)} files) to {args.to}")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from predictor.artifact import fetch as fetching

    settings = load_settings()
    with progress_bar(None, "fetch") as bar:
        manifest, report = fetching.fetch(
            args.uri,
            Path(args.dir),
            **fetching.FetchOptions.from_settings(settings).as_kwargs(),
            on_bytes=bar.update,
            engine=args.engine,
        )
    print(
        f"{manifest.name}@{manifest.version}: {report.files_downloaded} downloaded, {report.files_skipped} already verified, "
        f"{report.bytes_downloaded / 2**20:.1f} MiB in {report.seconds:.2f} s"
    )
    return 0


# --- synth ---------------------------------------------------------------------------------
def cmd_synth(args: argparse.Namespace) -> int:
    import tempfile

    import soundfile

    from predictor.artifact import fetch as fetching
    from predictor.engine import factory as engines
    from predictor.engine.base import SynthesisParams

    overrides = {"engine": args.engine} if args.engine else {}
    settings = load_settings(**overrides)
    with tempfile.TemporaryDirectory(prefix="tts-synth-") as tmp:
        model_dir = Path(args.model_dir) if args.model_dir else Path(tmp)
        if args.storage_uri:
            fetching.fetch(
                args.storage_uri,
                model_dir,
                **fetching.FetchOptions.from_settings(settings).as_kwargs(),
                engine=settings.engine_name,
            )
        elif not args.model_dir:
            from predictor.artifact import publish

            publish.build_default_voice(model_dir)
        eng = engines.create(settings)
        eng.load(model_dir)
        params = SynthesisParams(
            length_scale=args.length_scale,
            noise_scale=args.noise_scale,
            noise_w=args.noise_w,
            voice=args.voice,
            seed=args.seed,
        )
        (audio,) = eng.synthesize([args.text], params)
    out = Path(args.out)
    part = out.with_name(f".{out.name}.part")
    soundfile.write(part, audio, eng.sample_rate, format="WAV", subtype="FLOAT")
    part.replace(out)  # a reader never sees a half-written file
    print(f"wrote {out} ({len(audio) / eng.sample_rate:.2f} s at {eng.sample_rate} Hz)")
    return 0


# --- compare ---------------------------------------------------------------------------------
def cmd_compare(args: argparse.Namespace) -> int:
    """Exit 0 on PASS, 1 on FAIL, 2 when the input cannot be judged (a CI gate tells them apart)."""
    from predictor.shadow import compare

    thresholds = compare.Thresholds(
        min_match_rate=args.min_match_rate,
        max_p50_increase=args.max_p50_increase,
        max_p99_increase=args.max_p99_increase,
        max_error_rate_increase=args.max_error_rate_increase,
        max_duration_change=args.max_duration_change,
        max_mcd_p50_db=args.max_mcd_p50,
        max_mcd_p95_db=args.max_mcd_p95,
    )
    try:
        report = compare.compare(
            compare.load_records(args.stable), compare.load_records(args.canary), thresholds
        )
        if args.png:
            compare.write_png(report, Path(args.png))
    except compare.CompareError as exc:
        print(f"tts-predictor compare: {exc}", file=sys.stderr)
        return 2
    if args.json:
        import json

        print(json.dumps(report.summary(), indent=2))
    else:
        print(compare.format_report(report))
    return 0 if report.passed else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tts-predictor", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")

    sub.add_parser("serve", help="run the predictor (configured by environment variables; see README)")

    p = sub.add_parser("publish", help="build the default voice's artifact and upload it")
    p.add_argument("--to", required=True, help="s3://BUCKET/PREFIX, file:///path or a path")
    p.add_argument("--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    p.add_argument("--source", help="publish this artifact dir instead of the packaged voice")

    p = sub.add_parser("fetch", help="download and verify an artifact into DIR")
    p.add_argument("uri")
    p.add_argument("dir")
    p.add_argument(
        "--engine", choices=["torch", "onnx"], help="only the files this engine reads (default: all)"
    )

    p = sub.add_parser(
        "synth",
        help="synthesize one text offline to a float WAV file, as the model produced it (not normalized)",
    )
    p.add_argument("--text", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model-dir", help="an artifact dir (default: the packaged voice)")
    p.add_argument("--storage-uri", help="fetch the artifact from here first")
    p.add_argument(
        "--engine", choices=["torch", "onnx"], help="default: ENGINE (auto: onnx on CPU, torch on CUDA)"
    )
    p.add_argument("--length-scale", type=float)
    p.add_argument("--noise-scale", type=float)
    p.add_argument("--noise-w", type=float)
    p.add_argument("--voice")
    p.add_argument("--seed", type=int, help="reproducible noise (torch engine)")

    from predictor.shadow.compare import Thresholds

    t = Thresholds()
    p = sub.add_parser(
        "compare",
        help="judge a canary from shadow records: PASS (exit 0) or FAIL (exit 1); bad input exits 2",
    )
    p.add_argument(
        "--stable", required=True, help="stable's records: s3://bucket/prefix, a JSONL file or a directory"
    )
    p.add_argument("--canary", required=True, help="canary's records, likewise")
    p.add_argument("--png", help="write latency CDFs and the distance histogram here")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--min-match-rate",
        type=float,
        default=t.min_match_rate,
        metavar="FRACTION",
        help=f"stable requests the canary must also have recorded (default {t.min_match_rate})",
    )
    p.add_argument(
        "--max-p50-increase",
        type=float,
        default=t.max_p50_increase,
        metavar="FRACTION",
        help=f"canary p50 latency over stable's (default {t.max_p50_increase} = +10%%)",
    )
    p.add_argument(
        "--max-p99-increase",
        type=float,
        default=t.max_p99_increase,
        metavar="FRACTION",
        help=f"canary p99 latency over stable's (default {t.max_p99_increase})",
    )
    p.add_argument(
        "--max-error-rate-increase",
        type=float,
        default=t.max_error_rate_increase,
        metavar="FRACTION",
        help=f"absolute increase of the error rate (default {t.max_error_rate_increase})",
    )
    p.add_argument(
        "--max-duration-change",
        type=float,
        default=t.max_duration_change,
        metavar="FRACTION",
        help=f"|median canary/stable audio duration - 1| (default {t.max_duration_change})",
    )
    p.add_argument(
        "--max-mcd-p50",
        type=float,
        default=t.max_mcd_p50_db,
        metavar="DB",
        help=f"median mel-cepstral distortion (default {t.max_mcd_p50_db} dB)",
    )
    p.add_argument(
        "--max-mcd-p95",
        type=float,
        default=t.max_mcd_p95_db,
        metavar="DB",
        help=f"95th percentile mel-cepstral distortion (default {t.max_mcd_p95_db} dB)",
    )
    return parser


COMMANDS = {
    "serve": cmd_serve,
    "publish": cmd_publish,
    "fetch": cmd_fetch,
    "synth": cmd_synth,
    "compare": cmd_compare,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = args.command or "serve"  # `python -m predictor` with no arguments serves, like a container
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[command](args)
    except ConfigError as exc:
        print(f"tts-predictor: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from predictor.errors import PredictorError

        if isinstance(exc, PredictorError):
            print(f"tts-predictor {command}: {exc}", file=sys.stderr)
            return 1
        raise
