"""Text and PNG renderings of a simulation; the PNG is written atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from predictor.simulate.errors import SimulateError
from predictor.simulate.simulator import Result


def format_summary(summary: dict[str, Any]) -> str:
    width = max(len(k) for k in summary)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in summary.items())


def write_png(result: Result, out: Path, title: str) -> None:
    """Arrivals, ready and starting pods, requests waiting, and latency against time."""
    try:
        import matplotlib
    except ImportError:
        raise SimulateError("--png needs matplotlib: pip install 'tts-predictor[compare]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = result.timeline
    fig, (ax_arr, ax_pods, ax_wait, ax_lat) = plt.subplots(4, 1, figsize=(11, 9), sharex=True)
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
    out = Path(out)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{out.name}.", suffix=".png", dir=out.parent if str(out.parent) else "."
    )
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=100)
        os.replace(tmp, out)  # a reader never sees half a PNG
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
