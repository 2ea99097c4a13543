"""`python -m bench [coldstart|latency|engines|serving|fetch|events|shadow|liveness|image|overload|streaming|quality|attacks|piper|all]`: run the benchmarks, print a table, write JSON.

`python -m bench gpu [--device cpu --small --no-compile]` is separate (bench/gpu.py): it needs a GPU,
or runs as a CPU dry run.

Every figure is compared with a baseline measured in the same run on the same machine, so the ratios
mean something on a laptop, in CI, or on a node; absolute numbers are printed alongside.
Results go to bench/results/latest.json (gitignored).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import sys
import time
from contextlib import ExitStack, suppress
from pathlib import Path
from types import FrameType

from bench.common import REPO, Row, Session, SuiteResult, log

SUITES = (
    "coldstart",
    "latency",
    "engines",
    "serving",
    "fetch",
    "events",
    "shadow",
    "liveness",
    "image",
    "overload",
    "streaming",
    "quality",
    "attacks",
    "piper",
)
RESULTS = REPO / "bench" / "results" / "latest.json"


def _run_suite(name: str, session: Session, args: argparse.Namespace) -> SuiteResult:
    if name == "coldstart":
        from bench import coldstart

        return _merge([coldstart.run(session, engine) for engine in _engines(args)])
    if name == "latency":
        from bench import latency

        return _merge([latency.run(session, engine) for engine in _engines(args)])
    if name == "engines":
        from bench import engines

        return engines.run(session, compiled=not args.no_compile)
    if name == "serving":
        from bench import serving

        return serving.run(session, chapter=not args.no_chapter)
    if name == "events":
        from bench import events

        return events.run(session, requests=args.events_requests, concurrency=args.events_concurrency)
    if name == "image":
        from bench import image

        return image.run(session)
    if name == "quality":
        from bench import quality

        return quality.run(session)
    if name == "liveness":
        from bench import liveness

        return liveness.run(session)
    if name == "attacks":
        from bench import attacks

        return attacks.run(session)
    if name == "piper":
        from bench import piper

        return piper.run(session)
    if name == "overload":
        from bench import overload

        return overload.run(session, duration_s=args.overload_s)
    if name == "shadow":
        from bench import shadow

        return shadow.run(session, n=args.shadow_n)
    if name == "streaming":
        from bench import streaming

        return streaming.run(session)
    from bench import fetch

    return fetch.run(
        session,
        size_mib=args.fetch_mib,
        files=args.fetch_files,
        cap_mib_s=args.cap_mib_s,
        concurrency=args.fetch_concurrency,
        part_size_mib=args.part_size_mib,
    )


def _engines(args: argparse.Namespace) -> list[str]:
    return ["onnx", "torch"] if args.engine == "both" else [args.engine]


def _merge(results: list[SuiteResult]) -> SuiteResult:
    merged = SuiteResult()
    for r in results:
        merged.rows += r.rows
        merged.notes += r.notes
        merged.details[r.rows[0].suite if r.rows else str(len(merged.details))] = r.details
    return merged


def _run_with_retry(name: str, session: Session, args: argparse.Namespace) -> SuiteResult:
    """Run a suite; on failure keep its child logs, then try once more (the box is shared: another
    user's `pkill` or a port grabbed between our check and the bind should not sink the whole run)."""
    for attempt in (1, 2):
        log(f"--- {name} ---" + (" (second attempt)" if attempt == 2 else ""))
        t = time.perf_counter()
        try:
            res = _run_suite(name, session, args)
        except Exception as exc:
            kept = _keep_logs(session, name, attempt)
            log(f"{name} failed: {exc!r}; child logs kept in {kept}")
            if attempt == 2:
                return SuiteResult(
                    details={"error": repr(exc), "logs": str(kept)},
                    notes=[f"FAILED twice: {exc!r} (logs: {kept})"],
                )
            continue
        log(f"{name} took {time.perf_counter() - t:.0f} s")
        if attempt == 2:
            res.notes.append(
                "first attempt failed (see bench/results/failed-*); these numbers are the second"
            )
        return res
    raise AssertionError("unreachable")


def _keep_logs(session: Session, name: str, attempt: int) -> Path:
    dest = RESULTS.parent / f"failed-{name}-{attempt}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for i, log_file in enumerate(sorted(session.tmp.glob("logs-*/*.log"))):
        shutil.copy(log_file, dest / f"{i:02d}-{log_file.name}")
    return dest


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value:.1f} ms"
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "MB/s":
        return f"{value:.1f} MB/s"
    return f"{value:.3g} {unit}".strip()


def _ratio(row: Row) -> str:
    if row.ratio is None:
        return "-"
    if row.ratio_label == "x":
        return f"{row.ratio:.2f}x"
    if row.ratio_label == "ms over":
        return f"{row.ratio:+.1f} ms"
    return f"{row.ratio:.3f} {row.ratio_label}"


def table(rows: list[Row]) -> str:
    head = ("benchmark", "measured", "baseline (same run)", "ratio", "goal", "met")
    body = []
    for r in rows:
        base = (
            f"{r.baseline_name} {_fmt(r.baseline, r.unit if r.ratio_label != 'RTF' else 's')}"
            if r.baseline_name
            else ""
        )
        met = "" if r.met is None else ("yes" if r.met else "NO")
        body.append((f"[{r.suite}] {r.name}", _fmt(r.value, r.unit), base.strip(), _ratio(r), r.goal, met))
    widths = [max(len(str(x[i])) for x in (head, *body)) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)), line]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) for row in body]
    notes = [f"  {r.name.strip()}: {r.note}" for r in rows if r.note]
    return "\n".join([*out, "", "row notes:", *notes])


def _machine() -> dict:
    cpu = ""
    with suppress(OSError, StopIteration), open("/proc/cpuinfo") as f:
        cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    versions = {}
    for dist in (
        "kserve",
        "kserve-storage",
        "onnxruntime",
        "piper-tts",
        "moto",
        "boto3",
        "httpx",
        "tritonclient",
    ):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "cpu": cpu,
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["gpu"]:
        from bench import gpu

        return gpu.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("suite", nargs="?", default="all", choices=(*SUITES, "all"))
    parser.add_argument(
        "--overload-s", type=float, default=300.0, help="overload suite: seconds of 4x load (default 300)"
    )
    parser.add_argument("--fetch-mib", type=int, default=1024, help="fetch artifact size, MiB (default 1024)")
    parser.add_argument("--fetch-files", type=int, default=4, help="files in the fetch artifact (default 4)")
    parser.add_argument(
        "--cap-mib-s", type=int, default=0, help="per-connection cap of the S3 proxy, MiB/s (default 20)"
    )
    parser.add_argument(
        "--fetch-concurrency",
        type=int,
        default=0,
        help="our fetch's connections (default: FETCH_CONCURRENCY's default)",
    )
    parser.add_argument(
        "--part-size-mib",
        type=int,
        default=0,
        help="our fetch's part size (default: FETCH_PART_SIZE_MIB's default)",
    )
    parser.add_argument(
        "--engine",
        default="both",
        choices=("onnx", "torch", "both"),
        help="engine(s) for the coldstart and latency suites (default both)",
    )
    parser.add_argument(
        "--no-compile", action="store_true", help="engines suite: skip torch.compile (slow to build)"
    )
    parser.add_argument(
        "--no-chapter", action="store_true", help="serving suite: skip the 50,000-character text (minutes)"
    )
    parser.add_argument(
        "--events-requests", type=int, default=40, help="events suite: requests per mode (default 40)"
    )
    parser.add_argument(
        "--events-concurrency", type=int, default=2, help="events suite: concurrent clients (default 2)"
    )
    parser.add_argument(
        "--shadow-n", type=int, default=200, help="shadow suite: requests per side (default 200)"
    )
    args = parser.parse_args(argv)
    suites = SUITES if args.suite == "all" else (args.suite,)

    # SIGTERM unwinds like Ctrl-C, so the ExitStack still stops every child process.
    def _term(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    started = time.perf_counter()
    results: dict[str, SuiteResult] = {}
    with ExitStack() as stack:
        session = Session(stack)
        for name in suites:
            results[name] = _run_with_retry(name, session, args)
    failed = [name for name, res in results.items() if res.details.get("error")]

    rows = [r for res in results.values() for r in res.rows]
    notes = [f"[{name}] {n}" for name, res in results.items() for n in res.notes]
    print()
    print(table(rows))
    if notes:
        print("\nnotes:")
        print("\n".join(f"  {n}" for n in notes))
    elapsed = time.perf_counter() - started
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "suites": list(suites),
                "elapsed_s": elapsed,
                "machine": _machine(),
                "results": {name: res.to_json() for name, res in results.items()},
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    print(f"\nwrote {RESULTS.relative_to(REPO)} ({elapsed:.0f} s in all)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
