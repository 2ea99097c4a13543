"""Text, PNG and HTML renderings of a simulation; files are written atomically."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from tts_ops.simulate.errors import SimulateError
from tts_ops.simulate.simulator import Result


def format_summary(summary: dict[str, Any]) -> str:
    width = max(len(k) for k in summary)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in summary.items())


def render_png(result: Result, title: str) -> bytes:
    """Arrivals, ready and starting pods, requests waiting, and latency against time, as PNG bytes."""
    try:
        import matplotlib
    except ImportError:
        raise SimulateError("--png and --html need matplotlib: pip install 'tts-predictor[ops]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = result.timeline
    fig, (ax_arr, ax_pods, ax_wait, ax_lat) = plt.subplots(4, 1, figsize=(11, 9), sharex=True)
    try:
        if result.arrivals:
            ax_arr.hist(result.arrivals, bins=min(400, max(10, len(result.arrivals) // 20)))
        ax_arr.set(ylabel="arrivals")
        ax_pods.step(tl.t, tl.ready, where="post", label="ready")
        ax_pods.step(tl.t, tl.starting, where="post", label="starting")
        ax_pods.set(ylabel="pods")
        ax_pods.legend(loc="upper right")
        ax_wait.step(tl.t, tl.waiting, where="post")
        ax_wait.set(ylabel="waiting requests")
        done = [(t, lat) for t, lat in zip(result.arrivals, result.latencies, strict=True) if lat is not None]
        if done:
            ax_lat.scatter([d[0] for d in done], [d[1] for d in done], s=2)
        ax_lat.set(ylabel="latency (s)", xlabel="time (s)")
        for ax in (ax_arr, ax_pods, ax_wait, ax_lat):
            ax.grid(alpha=0.3)
        fig.suptitle(title)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        return buf.getvalue()
    finally:
        plt.close(fig)


def write_png(result: Result, out: Path, title: str) -> None:
    """The timeline of render_png; a reader never sees half a PNG."""
    from predictor.storage.files import atomic_write_bytes

    atomic_write_bytes(Path(out), render_png(result, title))


def write_html(
    result: Result, out: Path, title: str, settings: dict[str, Any], profile: dict[str, Any] | None = None
) -> None:
    """One self-contained page: the run's summary (after PROFILE: which profile and why), the settings
    it ran with, and the timeline."""
    from tts_ops.report_page import Figure, Page, Table

    summary = {**(profile or {}), **result.summary()}
    Page(
        title=f"Autoscaling simulation: {title}",
        tables=[
            Table("Summary", ("measure", "value"), [(k, _cell(v)) for k, v in summary.items()]),
            Table(
                "Settings (from the manifests, after --set)",
                ("setting", "value"),
                [(k, _cell(v)) for k, v in sorted(settings.items())],
            ),
        ],
        figures=[
            Figure("Arrivals, pods, waiting requests and latency against time", render_png(result, title))
        ],
        footer="tts-ops simulate",
    ).write(Path(out))


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
