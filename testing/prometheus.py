"""Debian's Prometheus as a real process for the tests that check our PromQL (rules, KEDA's query)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import yaml

from testing.ports import free_port
from testing.process import Child


class PrometheusProcess(Child):
    """Debian's prometheus on a free port, scraping `targets` and evaluating `rule_files` every second."""

    def __init__(self, workdir: Path, targets: list[tuple[str, dict[str, str]]], rule_files: list[Path]):
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError(
                "prometheus is not installed: run `make system-packages` (apt-get install prometheus)"
            )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            # One second, not the production 10 s, so a test sees rates within seconds.
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            # The job name a PodMonitor tts/tts-predictor gives its targets.
            "scrape_configs": [
                {
                    "job_name": "tts/tts-predictor",
                    "static_configs": [{"targets": [t], "labels": labels} for t, labels in targets],
                }
            ],
        }
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        argv = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        super().__init__("prometheus", argv, dict(os.environ), workdir / "prometheus.log")
        self.wait_for(lambda: httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200, 60, "ready")

    def query(self, expr: str) -> list[dict]:
        """Instant query through the HTTP API; the result vector (raises on a query error)."""
        body = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        if body["status"] != "success":
            raise AssertionError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def rules(self) -> list[dict]:
        groups = httpx.get(f"{self.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]
