"""Kubernetes pod discovery for Debian's Prometheus, which is built without `kubernetes_sd_configs`
(Debian patches it out: "Disable kubernetes SD, until dependencies are more reasonable"; Prometheus
2.42 refuses the config with "field kubernetes_sd_configs not found").

An HTTP service-discovery endpoint (Prometheus' `http_sd_configs`) that answers what `role: pod`
discovery would: one target per container port of each pod with an IP, labelled with the same
`__meta_kubernetes_*` names, so the relabelling generated from our PodMonitor (cluster.deploy) is the
one the Prometheus Operator would write. Pods come from the API server on each refresh.
Run (inside the node): python -m cluster.pod_discovery KUBECTL KUBECONFIG LISTEN_HOST:PORT"""

from __future__ import annotations

import json
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


def label_name(key: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in key)


def target_groups(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prometheus' pod role, for the labels our relabelling reads."""
    groups = []
    for pod in pods:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
        ip = status.get("podIP")
        if not ip:
            continue
        ready = next((c["status"] for c in status.get("conditions", []) if c["type"] == "Ready"), "False")
        common = {
            "__meta_kubernetes_namespace": meta["namespace"],
            "__meta_kubernetes_pod_name": meta["name"],
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_node_name": spec.get("nodeName", ""),
            "__meta_kubernetes_pod_phase": status.get("phase", ""),
            "__meta_kubernetes_pod_ready": ready.lower(),
        }
        for key, value in (meta.get("labels") or {}).items():
            common[f"__meta_kubernetes_pod_label_{label_name(key)}"] = value
            common[f"__meta_kubernetes_pod_labelpresent_{label_name(key)}"] = "true"
        for container in spec["containers"]:
            for port in container.get("ports", []):
                groups.append(
                    {
                        "targets": [f"{ip}:{port['containerPort']}"],
                        "labels": {
                            **common,
                            "__meta_kubernetes_pod_container_name": container["name"],
                            "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                            "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                            "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
                        },
                    }
                )
    return groups


def main(argv: list[str]) -> int:
    kubectl, kubeconfig, listen = argv
    host, port = listen.rsplit(":", 1)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            namespace = parse_qs(urlparse(self.path).query).get("namespace", [""])[0]
            scope = ["-n", namespace] if namespace else ["--all-namespaces"]
            out = subprocess.run(
                [kubectl, f"--kubeconfig={kubeconfig}", "get", "pods", *scope, "-o", "json"],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                self.send_error(502, out.stderr.strip()[:200])
                return
            body = json.dumps(target_groups(json.loads(out.stdout)["items"])).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    ThreadingHTTPServer((host, int(port)), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
