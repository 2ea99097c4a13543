"""The cluster of `make cluster` for the e2e tests: KUBECTL and KUBECONFIG from the environment (as
`make cluster` prints them), else `python -m cluster.node up` is run, which reuses a cluster already up."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Cluster:
    kubectl_path: str
    kubeconfig: str

    def kubectl(
        self, *args: str, input_text: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.kubectl_path, f"--kubeconfig={self.kubeconfig}", *args],
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    if os.environ.get("KUBECTL") and os.environ.get("KUBECONFIG"):
        return Cluster(os.environ["KUBECTL"], os.environ["KUBECONFIG"])
    out = subprocess.run(
        [sys.executable, "-m", "cluster.node", "up"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, f"make cluster failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    env = dict(line.split("=", 1) for line in out.stdout.strip().splitlines()[-2:])
    return Cluster(env["KUBECTL"], env["KUBECONFIG"])
