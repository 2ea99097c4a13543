"""`python -m bench gpu --device cpu`: the GPU check's dry run, so the script a GPU run needs works."""

from __future__ import annotations

import subprocess
import sys

from bench.common import REPO


def test_gpu_bench_dry_run_on_cpu_prints_its_table():
    run = subprocess.run(
        [sys.executable, "-m", "bench", "gpu", "--device", "cpu", "--small", "--no-compile"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
    )

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for row in ("fp32 cpu vs cpu", "bf16 vs fp32", "throughput batch 2", "RTF", "first packet", "cold start"):
        assert row in run.stdout, row
