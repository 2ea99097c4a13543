"""The cluster's own images, built here as OCI archives (cluster.oci) from static Go binaries: the pod
sandbox (`tiny pause`), a test image (`tiny serve` / `tiny get`, cluster/images/tiny) and CoreDNS.
`make cluster` imports them into containerd's k8s.io namespace; pods name them with
imagePullPolicy: Never (no registry is reachable)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from cluster import build, oci, pins

HERE = Path(__file__).resolve().parent / "images"
PAUSE = "dev.local/ttsk8s/pause:1"
TINY = "dev.local/ttsk8s/tiny:1"


def coredns_image() -> str:
    return f"dev.local/ttsk8s/coredns:{pins.components()['coredns'].version}"


def tiny_binary(out_dir: Path) -> Path:
    source = hashlib.sha256((HERE / "tiny" / "main.go").read_bytes()).hexdigest()[:12]
    target = out_dir / f"tiny-{source}"
    if not target.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="0")
        subprocess.run(
            ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(target), "./tiny"],
            cwd=HERE,
            env=env,
            check=True,
        )
    return target


def archives(out_dir: Path) -> list[Path]:
    """Write (or reuse) every image archive under out_dir; CoreDNS's once its binary is built."""
    tiny = tiny_binary(out_dir).read_bytes()
    made = [
        oci.write_archive(out_dir / "pause.tar", PAUSE, {"tiny": (tiny, 0o755)}, ["/tiny", "pause"]),
        oci.write_archive(out_dir / "tiny.tar", TINY, {"tiny": (tiny, 0o755)}, ["/tiny"]),
    ]
    coredns = build.bin_dirs()["coredns"] / "coredns"
    if coredns.exists():
        made.append(
            oci.write_archive(
                out_dir / "coredns.tar",
                coredns_image(),
                {"coredns": (coredns.read_bytes(), 0o755)},
                ["/coredns"],
            )
        )
    return made
