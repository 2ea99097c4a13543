"""`tts-ops` / `python -m tts_ops`: the offline tools (compare, profile, simulate, manifests, image).

None of them runs in a serving pod: they judge a canary from shadow records, measure a running
predictor, replay traffic through the manifests' autoscaling, render and validate the manifests, and
build the image. The runtime (`tts-predictor`) imports nothing from here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tts_ops.compare import Thresholds


# --- compare ---------------------------------------------------------------------------------
def cmd_compare(args: argparse.Namespace) -> int:
    """Exit 0 on PASS, 1 on FAIL, 2 when the input cannot be judged (a CI gate tells them apart)."""
    from tts_ops import compare

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
        print(f"tts-ops compare: {exc}", file=sys.stderr)
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
    from tts_ops.simulate import profile
    from tts_ops.simulate.errors import SimulateError

    try:
        measured = profile.measure(
            args.url,
            repeats=args.repeats,
            engine=args.engine,
            device=args.device,
            overlap=args.overlap,
            mos_sample=args.mos_sample,
        )
        measured = profile.admit(measured, force=args.force)
        if measured.forced:
            print(f"tts-ops profile: warning: forced: {profile.load_problem(measured)}", file=sys.stderr)
        if args.out:
            profile.write(measured, Path(args.out))
    except SimulateError as exc:
        print(f"tts-ops profile: {exc}", file=sys.stderr)
        return 2
    import json

    print(json.dumps(measured.to_json(), indent=2))
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    """Exit 2 on bad input (manifests, trace, profile, --set, --sweep), naming the file and line or key."""
    import json

    from tts_ops.simulate import profile, report, settings, sweep, trace
    from tts_ops.simulate.errors import SimulateError
    from tts_ops.simulate.simulator import simulate

    try:
        overlay = settings.read(args.manifests)
        flavour, engine = overlay.flavour, overlay.engine
        values = settings.apply_overrides(overlay.values, args.set or [])
        path, because = profile.choose(
            args.profile, engine.name, engine.device, engine.why, f"--manifests {args.manifests}"
        )
        prof = profile.load(path)
        used = {"profile": _shown(path), "profile_because": because}
        for warning in profile.warnings(prof, engine.name, engine.device):
            print(f"tts-ops simulate: warning: {used['profile']}: {warning}", file=sys.stderr)
        traffic = trace.load(args.trace)
        if args.sweep:
            rows = sweep.run(flavour, values, prof, traffic, args.sweep)
            if args.json:
                print(f"tts-ops simulate: profile {used['profile']} ({because})", file=sys.stderr)
                print(json.dumps(sweep.to_json(rows), indent=2))
            else:
                print(f"profile: {used['profile']} ({because})")
                print(sweep.format_table(sweep.parse(args.sweep)[0], rows))
            return 0
        result = simulate(flavour, values, prof, traffic)
        title = f"{args.manifests} | {traffic.source}"
        if args.png:
            report.write_png(result, Path(args.png), title)
        if args.html:
            report.write_html(result, Path(args.html), title, values, used)
    except SimulateError as exc:
        print(f"tts-ops simulate: {exc}", file=sys.stderr)
        return 2
    summary = {**used, **result.summary()}
    print(json.dumps(summary, indent=2) if args.json else report.format_summary(summary))
    return 0


def cmd_simulate_tables(args: argparse.Namespace) -> int:
    """Print the sweeps table, or rewrite it in --doc between its markers; --check exits 1 when the
    document's table is not what the sweeps give now."""
    from tts_ops.simulate import tables
    from tts_ops.simulate.errors import SimulateError

    root = Path(__file__).resolve().parents[1]
    try:
        table = tables.markdown(root)
    except SimulateError as exc:
        print(f"tts-ops simulate-tables: {exc}", file=sys.stderr)
        return 2
    if not args.doc:
        print(table)
        return 0
    doc = Path(args.doc)
    if args.check:
        if table not in doc.read_text():
            print(
                f"tts-ops simulate-tables: {doc}'s table is stale: run `make autoscaling-table`",
                file=sys.stderr,
            )
            return 1
        return 0
    print(f"{doc}: {'rewritten' if tables.rewrite(doc, table) else 'unchanged'}")
    return 0


def _shown(path: Path) -> str:
    """PATH relative to the working directory when under it (the shipped profiles from the repo root)."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def build_parser() -> argparse.ArgumentParser:
    from tts_ops.simulate import profile as profile_defaults

    parser = argparse.ArgumentParser(prog="tts-ops", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    t = Thresholds()
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
    p.add_argument(
        "--overlap",
        type=int,
        default=profile_defaults.OVERLAP,
        help="requests sent at once for overlap_factor, what a call costs beside others on the "
        "predictor as it runs (its ENGINE_WORKERS); 1: not measured (default %(default)s)",
    )
    p.add_argument(
        "--engine",
        choices=("onnx", "torch"),
        help="the predictor's engine, for one whose /v2/models/<name> names none (platform); "
        "must agree with one that does",
    )
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="what the predictor runs on (default cpu)"
    )
    p.add_argument(
        "--mos-sample",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="the predictor's SHADOW_MOS_SAMPLE where it records shadow traffic (SHADOW_SINK): that "
        "share of the back-to-back calls, evenly spread, carry request ids it scores for MOS, none of "
        "the calls after a pause (default 0: the ids are not chosen for it)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="keep a profile measured with the 1-minute load average above the machine's cores "
        "(refused otherwise); the profile records forced: true and simulate warns",
    )

    p = sub.add_parser(
        "simulate",
        help="replay traffic through the manifests' autoscaling settings with a measured profile",
    )
    p.add_argument(
        "--manifests", required=True, help="a kustomization: knative/overlays/cpu, keda/overlays/gpu, ..."
    )
    p.add_argument(
        "--trace",
        required=True,
        help="CSV `t,chars` or a generator (poisson:rate=R,... see docs/deployment.md)",
    )
    p.add_argument(
        "--profile",
        help="profile JSON (default: the shipped profile of the engine the manifests' predictor runs, "
        "from its ENGINE, DEVICE, DTYPE and COMPILE)",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one setting (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--png", help="draw the timeline here (written atomically)")
    p.add_argument("--html", help="write one self-contained page here: summary, settings, timeline")
    p.add_argument(
        "--sweep", metavar="KEY=V1,V2,...", help="one run per value: p99 vs replica-seconds, Pareto front"
    )

    p = sub.add_parser(
        "simulate-tables",
        help="the sweeps behind every shipped autoscaling value, as one markdown table",
    )
    p.add_argument("--doc", help="rewrite the table between its markers in this file (atomically)")
    p.add_argument("--check", action="store_true", help="with --doc: exit 1 when its table is stale")

    # These two keep their own argument parsers (`python -m tts_ops.manifests`, `python -m tts_ops.image`).
    for name, text in (
        (
            "manifests",
            "render or validate every overlay of knative/ and keda/ (render [--out DIR] | validate)",
        ),
        ("image", "build the image, its base, or print their sizes (base | build [-- ARGS] | sizes)"),
    ):
        sub.add_parser(name, help=text, add_help=False)
    return parser


def cmd_manifests(args: argparse.Namespace) -> int:
    from tts_ops import manifests

    return manifests.main(args.rest)


def cmd_image(args: argparse.Namespace) -> int:
    from tts_ops import image

    return image.main(args.rest)


COMMANDS = {
    "compare": cmd_compare,
    "profile": cmd_profile,
    "simulate": cmd_simulate,
    "simulate-tables": cmd_simulate_tables,
    "manifests": cmd_manifests,
    "image": cmd_image,
}


# Commands with their own parser: everything after the command's name goes to it unparsed.
FORWARDED = ("manifests", "image")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if argv and argv[0] in FORWARDED:
        args = argparse.Namespace(command=argv[0], rest=argv[1:])
    else:
        args = parser.parse_args(argv)
    return COMMANDS[args.command](args)
