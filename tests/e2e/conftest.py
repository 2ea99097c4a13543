"""The cluster of `make cluster` for the e2e tests: KUBECTL and KUBECONFIG from the environment (as
`make cluster` prints them), else `python -m cluster.node up` is run, which reuses a cluster already up.
Each flavour as `make cluster-deploy FLAVOUR=keda|knative` deploys it (URL and HOST from its last lines).
Figures the tests measure go to the e2e report, printed at the end and written as JSON beside the
cluster's state (E2E_REPORT overrides where)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from testing.bodies import v2_request
from testing.kube import Cluster

ROOT = Path(__file__).resolve().parents[2]


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


@dataclass(frozen=True)
class Flavour:
    url: str  # http://127.0.0.1:<port>, the flavour's 0 -> 1 path
    host: str  # the Host header that path routes on

    def infer(self, *texts: str, timeout: float = 180) -> httpx.Response:
        """A v2 REST inference request through the flavour's path, one connection of its own."""
        return httpx.post(
            self.url + "/v2/models/tts/infer",
            headers={"Host": self.host},
            json=v2_request(*texts),
            timeout=timeout,
        )


def _deploy(flavour: str) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "cluster.deploy", flavour],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, f"make cluster-deploy failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return dict(line.split("=", 1) for line in out.stdout.strip().splitlines()[-2:])


@pytest.fixture(scope="session")
def keda(cluster) -> Flavour:
    env = _deploy("keda")
    return Flavour(env["URL"], env["HOST"])


@pytest.fixture(scope="session")
def knative(cluster) -> Flavour:
    env = _deploy("knative")
    return Flavour(env["URL"], env["HOST"])


@pytest.fixture(scope="session")
def keda_profile(cluster, keda):
    """A simulator profile measured on the keda flavour's canary pod (same image, same limits)."""
    from testing.prediction import canary_profile

    return canary_profile(cluster)


@pytest.fixture(scope="session")
def knative_profile(cluster, knative):
    """The same on the knative flavour's canary pod."""
    from testing.prediction import canary_profile

    return canary_profile(cluster)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Both flavours deploy into namespace tts and deploying one removes the other: every test of the
    # knative flavour runs after every test of the keda flavour.
    items.sort(key=lambda item: "knative" in getattr(item, "fixturenames", ()))


REPORT: dict[str, object] = {}


@pytest.fixture(scope="session")
def e2e_report() -> dict[str, object]:
    return REPORT


def pytest_terminal_summary(terminalreporter) -> None:
    if not REPORT:
        return
    from cluster import node

    path = Path(os.environ.get("E2E_REPORT", node.STATE / "e2e-report.json"))
    path.write_text(json.dumps(REPORT, indent=1))
    terminalreporter.section("e2e figures")
    # Traces are long: in the file only.
    terminalreporter.write_line(json.dumps({k: v for k, v in REPORT.items() if "trace" not in k}, indent=1))
    terminalreporter.write_line(f"(written to {path})")
    if "calibration" in REPORT:
        from testing.prediction import calibration_table

        terminalreporter.section("the simulator against the cluster (cluster / simulator)")
        terminalreporter.write_line(calibration_table(REPORT["calibration"]))  # type: ignore[arg-type]
