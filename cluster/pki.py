"""Certificates and kubeconfigs of the cluster, made here with openssl (no cert-manager, no kubeadm):
one cluster CA for every serving and client certificate, a front-proxy CA for the aggregation layer
(KEDA's metrics API server), and the service-account signing key. EC P-256 keys: quick to make on a
busy 2-core machine and accepted by every component."""

from __future__ import annotations

import subprocess
from pathlib import Path

DAYS = "3650"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _key(path: Path) -> None:
    if not path.exists():
        _openssl(
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            path.name,
            cwd=path.parent,
        )
        path.chmod(0o600)


def ca(directory: Path, name: str) -> Path:
    crt = directory / f"{name}.crt"
    if not crt.exists():
        _key(directory / f"{name}.key")
        _openssl(
            "req", "-x509", "-new", "-key", f"{name}.key", "-out", crt.name, "-days", DAYS,
            "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=directory,
        )  # fmt: skip
    return crt


def leaf(
    directory: Path,
    name: str,
    common_name: str,
    *,
    ca_name: str = "ca",
    organizations: tuple[str, ...] = (),
    dns: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    client: bool = False,
) -> tuple[Path, Path]:
    """A certificate signed by CA `ca_name`: a server certificate when it names hosts, else a client one."""
    crt, key = directory / f"{name}.crt", directory / f"{name}.key"
    if crt.exists():
        return crt, key
    _key(key)
    subject = "".join(f"/O={o}" for o in organizations) + f"/CN={common_name}"
    usages = (["serverAuth"] if dns or ips else []) + (["clientAuth"] if client or not (dns or ips) else [])
    ext = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={','.join(usages)}",
    ]
    if dns or ips:
        ext.append("subjectAltName=" + ",".join([f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]))
    (directory / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl("req", "-new", "-key", key.name, "-out", f"{name}.csr", "-subj", subject, cwd=directory)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca_name}.crt", "-CAkey", f"{ca_name}.key",
        "-CAcreateserial", "-out", crt.name, "-days", DAYS, "-extfile", f"{name}.ext", cwd=directory,
    )  # fmt: skip
    return crt, key


def service_account_key(directory: Path) -> tuple[Path, Path]:
    key, pub = directory / "sa.key", directory / "sa.pub"
    _key(key)
    if not pub.exists():
        _openssl("pkey", "-in", key.name, "-pubout", "-out", pub.name, cwd=directory)
    return key, pub


def kubeconfig(path: Path, server: str, ca_file: Path, crt: Path, key: Path, user: str) -> Path:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: ttsk8s
  cluster:
    server: {server}
    certificate-authority: {ca_file}
users:
- name: {user}
  user:
    client-certificate: {crt}
    client-key: {key}
contexts:
- name: ttsk8s
  context:
    cluster: ttsk8s
    user: {user}
current-context: ttsk8s
"""
    )
    path.chmod(0o600)
    return path
