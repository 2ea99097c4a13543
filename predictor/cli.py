"""`tts-predictor` / `python -m predictor`: serve, publish, fetch, synth (the offline tools: `tts-ops`).

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
    from predictor import deferred
    from predictor.serving import coldstart

    deferred.defer()  # before any thread: KServe's pandas and Kubernetes client wait for a first use
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
        if args.voice_uri:
            fetching.fetch(
                args.voice_uri,
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


# --- moved commands --------------------------------------------------------------------------
# compare, profile and simulate are offline tools for people and CI, not for a serving pod: they live in
# the ops package (tts_ops), installed with the `ops` extra and run as `tts-ops <command>`. The old
# names still parse here so that a script that calls them learns where they went instead of reading
# argparse's "invalid choice".
MOVED_TO_OPS = ("compare", "profile", "simulate")


def cmd_moved(args: argparse.Namespace) -> int:
    print(
        f"tts-predictor {args.command}: moved to `tts-ops {args.command}` (the offline tools: "
        "pip install 'tts-predictor[ops]' from a checkout; the image does not carry them)",
        file=sys.stderr,
    )
    return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tts-predictor", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")

    sub.add_parser(
        "serve", help="run the predictor (configured by environment variables; see docs/settings.md)"
    )

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
    p.add_argument("--voice-uri", help="fetch the artifact from here first")
    p.add_argument(
        "--engine", choices=["torch", "onnx"], help="default: ENGINE (auto: onnx on CPU, torch on CUDA)"
    )
    p.add_argument("--length-scale", type=float)
    p.add_argument("--noise-scale", type=float)
    p.add_argument("--noise-w", type=float)
    p.add_argument("--voice")
    p.add_argument("--seed", type=int, help="reproducible noise (either engine: the same audio on both)")

    for name in MOVED_TO_OPS:
        sub.add_parser(name, help=f"moved to `tts-ops {name}`", add_help=False)
    return parser


COMMANDS = {
    "serve": cmd_serve,
    "publish": cmd_publish,
    "fetch": cmd_fetch,
    "synth": cmd_synth,
    **dict.fromkeys(MOVED_TO_OPS, cmd_moved),
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Known arguments only, so that a moved command's own flags reach cmd_moved instead of argparse.
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command not in MOVED_TO_OPS:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
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
