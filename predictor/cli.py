"""`tts-predictor` / `python -m predictor`: serve, publish, fetch, synth.

`serve` starts the artifact download and the engine construction on threads before it imports
KServe, so the three overlap (see server.py); the other commands are for people and CI.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from predictor.config import ConfigError, load_settings

log = logging.getLogger("predictor")


def _progress_bar(total: int | None, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=not sys.stderr.isatty())


# --- serve ---------------------------------------------------------------------------------
def cmd_serve(_args: argparse.Namespace) -> int:
    settings = load_settings()
    from predictor import logs

    logs.configure(settings.log_level, settings.log_format)
    from predictor import coldstart

    pending = coldstart.begin(settings)  # before the heavy imports below, to overlap with them

    import asyncio

    from predictor import server, tracing

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

    from predictor import artifact

    with tempfile.TemporaryDirectory(prefix="tts-artifact-") as tmp:
        src = Path(args.source) if args.source else Path(tmp)
        if not args.source:
            artifact.build_default_voice(src)
        manifest = artifact.publish(src, args.to, endpoint_url=args.endpoint_url, progress=True)
    print(f"published {manifest.name}@{manifest.version} ({len(manifest.files)} files) to {args.to}")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from predictor import storage

    settings = load_settings()
    with _progress_bar(None, "fetch") as bar:
        manifest, report = storage.fetch(
            args.uri,
            Path(args.dir),
            concurrency=settings.fetch_concurrency,
            part_size=settings.fetch_part_size,
            retries=settings.fetch_retries,
            backoff_s=settings.fetch_backoff_s,
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

    from predictor import engine as engines
    from predictor import storage
    from predictor.engine import SynthesisParams

    overrides = {"engine": args.engine} if args.engine else {}
    settings = load_settings(**overrides)
    with tempfile.TemporaryDirectory(prefix="tts-synth-") as tmp:
        model_dir = Path(args.model_dir) if args.model_dir else Path(tmp)
        if args.storage_uri:
            storage.fetch(
                args.storage_uri, model_dir, concurrency=settings.fetch_concurrency,
                part_size=settings.fetch_part_size, engine=settings.engine,
            )  # fmt: skip
        elif not args.model_dir:
            from predictor import artifact

            artifact.build_default_voice(model_dir)
        eng = engines.create(settings)
        eng.load(model_dir)
        params = SynthesisParams(
            length_scale=args.length_scale, noise_scale=args.noise_scale, noise_w=args.noise_w,
            voice=args.voice, seed=args.seed,
        )  # fmt: skip
        (audio,) = eng.synthesize([args.text], params)
    out = Path(args.out)
    part = out.with_name(f".{out.name}.part")
    soundfile.write(part, audio, eng.sample_rate, format="WAV", subtype="FLOAT")
    part.replace(out)  # a reader never sees a half-written file
    print(f"wrote {out} ({len(audio) / eng.sample_rate:.2f} s at {eng.sample_rate} Hz)")
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
    p.add_argument("--engine", choices=["torch", "onnx"], help="only the files this engine reads (default: all)")

    p = sub.add_parser("synth", help="synthesize one text offline to a float WAV file, as the model produced it (not normalized)")
    p.add_argument("--text", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model-dir", help="an artifact dir (default: the packaged voice)")
    p.add_argument("--storage-uri", help="fetch the artifact from here first")
    p.add_argument("--engine", choices=["torch", "onnx"], help="default: ENGINE, else torch")
    p.add_argument("--length-scale", type=float)
    p.add_argument("--noise-scale", type=float)
    p.add_argument("--noise-w", type=float)
    p.add_argument("--voice")
    p.add_argument("--seed", type=int, help="reproducible noise (torch engine)")
    return parser


COMMANDS = {"serve": cmd_serve, "publish": cmd_publish, "fetch": cmd_fetch, "synth": cmd_synth}


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
