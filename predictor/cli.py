"""`tts-predictor` / `python -m predictor`: serve, publish, fetch, synth, compare, profile, simulate.

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
    from predictor.config import take_deprecations

    for warning in take_deprecations():
        log.warning(warning)
    from predictor.serving import coldstart

    pending = coldstart.begin(settings)  # before the heavy imports below, to overlap with them

    import asyncio

    from predictor import server
    from predictor.observability import tracing

    tracing.configure(settings.otel_exporter_otlp_endpoint, settings.otel_service_name)
    try:
        drained = asyncio.run(server.run(settings, pending))
    except ConfigError:
        raise
    except Exception as exc:
        log.error("predictor stopped: %s", exc)
        return 1
    if not drained:
        # DRAIN_TIMEOUT_S cut a request off while the engine thread may still be inside a native
        # synthesis call; finalizing the interpreter under it aborts the process (SIGABRT, "terminate
        # called without an active exception"). The drain has logged what it cut; end here, exit 0.
        import os

        logging.shutdown()
        os._exit(0)
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
        **{field: getattr(args, field) for _, field, _, _ in _THRESHOLD_FLAGS},
    )
    try:
        report = compare.compare(
            compare.load_records(args.stable), compare.load_records(args.canary), thresholds
        )
        if args.png:
            compare.write_png(report, Path(args.png))
        if args.html:
            flags = {field: flag for flag, field, _, _ in _THRESHOLD_FLAGS}
            compare.write_html(report, thresholds, Path(args.html), flags)
    except compare.CompareError as exc:
        print(f"tts-predictor compare: {exc}", file=sys.stderr)
        return 2
    if args.json:
        import json

        print(json.dumps(report.summary(), indent=2))
    else:
        print(compare.format_report(report))
    return 0 if report.passed else 1


# --- profile / simulate ----------------------------------------------------------------------

# compare's verdict thresholds: flag, Thresholds field, metavar, help ({default} is filled in).
_THRESHOLD_FLAGS = (
    (
        "--min-match-rate",
        "min_match_rate",
        "FRACTION",
        "stable requests the canary must also have recorded (default {default})",
    ),
    (
        "--max-p50-increase",
        "max_p50_increase",
        "FRACTION",
        "canary p50 latency over stable's (default {default} = +10%%)",
    ),
    (
        "--max-p99-increase",
        "max_p99_increase",
        "FRACTION",
        "canary p99 latency over stable's (default {default})",
    ),
    (
        "--max-error-rate-increase",
        "max_error_rate_increase",
        "FRACTION",
        "absolute increase of the error rate (default {default})",
    ),
    (
        "--max-duration-change",
        "max_duration_change",
        "FRACTION",
        "|median canary/stable audio duration - 1| (default {default})",
    ),
    ("--max-mcd-p50", "max_mcd_p50_db", "DB", "median mel-cepstral distortion (default {default} dB)"),
    (
        "--max-mcd-p95",
        "max_mcd_p95_db",
        "DB",
        "95th percentile mel-cepstral distortion (default {default} dB)",
    ),
    (
        "--max-mos-drop",
        "max_mos_drop",
        "MOS",
        "largest drop of the mean DNSMOS P.808 MOS and of P.835 OVRL, each stable minus canary over "
        "requests scored on both sides (e.g. 0.1; default off; needs 20 such requests, else exit 2)",
    ),
)


def cmd_profile(args: argparse.Namespace) -> int:
    from predictor.simulate import profile
    from predictor.simulate.errors import SimulateError

    try:
        measured = profile.measure(args.url, repeats=args.repeats)
        if args.out:
            profile.write(measured, Path(args.out))
    except SimulateError as exc:
        print(f"tts-predictor profile: {exc}", file=sys.stderr)
        return 2
    import json

    print(json.dumps(measured.to_json(), indent=2))
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    """Exit 2 on bad input (manifests, trace, profile, --set, --sweep), naming the file and line or key."""
    import json

    from predictor.simulate import profile, report, settings, sweep, trace
    from predictor.simulate.errors import SimulateError
    from predictor.simulate.simulator import simulate

    try:
        flavour, values = settings.from_manifests(args.manifests)
        values = settings.apply_overrides(values, args.set or [])
        prof = profile.load(args.profile or profile.default_path())
        traffic = trace.load(args.trace)
        if args.sweep:
            rows = sweep.run(flavour, values, prof, traffic, args.sweep)
            if args.json:
                print(json.dumps(sweep.to_json(rows), indent=2))
            else:
                print(sweep.format_table(sweep.parse(args.sweep)[0], rows))
            return 0
        result = simulate(flavour, values, prof, traffic)
        title = f"{args.manifests} | {traffic.source}"
        if args.png:
            report.write_png(result, Path(args.png), title)
        if args.html:
            report.write_html(result, Path(args.html), title, values)
    except SimulateError as exc:
        print(f"tts-predictor simulate: {exc}", file=sys.stderr)
        return 2
    summary = result.summary()
    print(json.dumps(summary, indent=2) if args.json else report.format_summary(summary))
    return 0


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
    p.add_argument(
        "--html", help="write one self-contained page here: verdict, each threshold, the plot (atomically)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    for flag, field, metavar, text in _THRESHOLD_FLAGS:
        default = getattr(t, field)
        p.add_argument(
            flag, type=float, default=default, metavar=metavar, dest=field, help=text.format(default=default)
        )
    p = sub.add_parser("profile", help="measure a running predictor's synthesis and cold-start times")
    p.add_argument("--url", required=True, help="the predictor's REST address, e.g. http://127.0.0.1:8080")
    p.add_argument("--out", help="write the profile JSON here (atomically)")
    p.add_argument("--repeats", type=int, default=3, help="requests per text length (median taken)")

    p = sub.add_parser(
        "simulate",
        help="replay traffic through the manifests' autoscaling settings with a measured profile",
    )
    p.add_argument(
        "--manifests", required=True, help="a kustomization: knative/overlays/cpu, keda/overlays/gpu, ..."
    )
    p.add_argument(
        "--trace", required=True, help="CSV `t,chars` or a generator (poisson:rate=R,... see README)"
    )
    p.add_argument("--profile", help="profile JSON (default: the shipped cpu-2core profile)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one setting (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--png", help="draw the timeline here (written atomically)")
    p.add_argument("--html", help="write one self-contained page here: summary, settings, timeline")
    p.add_argument(
        "--sweep", metavar="KEY=V1,V2,...", help="one run per value: p99 vs replica-seconds, Pareto front"
    )
    return parser


COMMANDS = {
    "serve": cmd_serve,
    "publish": cmd_publish,
    "fetch": cmd_fetch,
    "synth": cmd_synth,
    "compare": cmd_compare,
    "profile": cmd_profile,
    "simulate": cmd_simulate,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = args.command or "serve"  # `python -m predictor` with no arguments serves, like a container
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return COMMANDS[command](args)
    except ConfigError as exc:
        _fatal(command, f"tts-predictor: {exc}")
        return 2
    except Exception as exc:
        from predictor.errors import PredictorError

        if isinstance(exc, PredictorError):
            _fatal(command, f"tts-predictor {command}: {exc}")
            return 1
        raise


def _fatal(command: str, message: str) -> None:
    """The last words of a failed command: through the log when serving (so LOG_FORMAT=json stays one
    JSON object per line for log collectors), plainly on stderr for the one-shot commands."""
    if command == "serve":
        log.critical(message)
    else:
        print(message, file=sys.stderr)
