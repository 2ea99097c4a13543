"""nginx (Debian's, run as this user with a generated config) for the fetch benchmarks: `start` runs
an S3 endpoint with a per-connection bandwidth cap, nginx in front of moto. (Mirroring in the shadow
tests is Envoy's, as in a mesh: testing/envoy.py.)

The S3 endpoint. Real S3 serves each connection at a bounded rate (~90 MB/s), so a fetcher's throughput comes from
parallel connections; `limit_rate` reproduces that. moto itself copies the whole object for every
ranged GET, which would make moto, not the cap, the bottleneck; so nginx caches each object once
(full GET, Range stripped upstream as proxy_cache does) and serves every ranged GET from its cache.
Bucket-level requests (list, head bucket) and anything with a query string are never cached.

Two listeners share one cache: CAPPED (limit_rate per connection) for the measurements, and an
uncapped one used only to fill the cache before measuring.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.common import Session, log
from testing.polling import answers
from testing.ports import free_port
from testing.process import Child

_SERVER = """
    server {{
        listen 127.0.0.1:{port};
        {limit}
        location / {{
            proxy_pass http://moto;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;   # SigV4 signs Host: moto must see the client's
            proxy_read_timeout 300s;
            proxy_buffering on;
            proxy_buffer_size 64k;
            proxy_buffers 32 1m;
            proxy_max_temp_file_size 0;         # uncached responses: stream, never spool to disk
            proxy_cache objects;
            proxy_cache_key $uri;
            proxy_cache_valid 200 1h;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 600s;
            proxy_cache_lock_age 600s;
            proxy_force_ranges on;
            proxy_no_cache $args$bucket_level;
            proxy_cache_bypass $args$bucket_level;
            proxy_ignore_headers Cache-Control Expires Set-Cookie Vary X-Accel-Expires X-Accel-Limit-Rate X-Accel-Buffering;
            # Whole-object checksums must not ride along on ranged answers served from the cache.
            proxy_hide_header x-amz-checksum-crc32;
            proxy_hide_header x-amz-checksum-crc32c;
            proxy_hide_header x-amz-checksum-crc64nvme;
            proxy_hide_header x-amz-checksum-sha1;
            proxy_hide_header x-amz-checksum-sha256;
            proxy_hide_header x-amz-checksum-type;
            add_header X-Cache $upstream_cache_status always;
        }}
    }}
"""

_CONF = """
{user}
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    # Small sends keep limit_rate smooth: nginx only sleeps between sends, never within one.
    sendfile_max_chunk 256k;
    keepalive_requests 100000;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy_temp;
    fastcgi_temp_path {prefix}/fastcgi_temp;
    uwsgi_temp_path {prefix}/uwsgi_temp;
    scgi_temp_path {prefix}/scgi_temp;
{http}
}}
"""
_S3_HTTP = """
    proxy_cache_path {prefix}/cache levels=1:2 keys_zone=objects:10m max_size=16g inactive=1h use_temp_path=off;
    upstream moto {{
        server 127.0.0.1:{moto_port};
        keepalive 64;
    }}
    map $uri $bucket_level {{
        ~^/[^/]+/?$ 1;
        default "";
    }}
{servers}
"""


def write_conf(prefix: Path, http: str) -> Path:
    """A complete nginx.conf under ``prefix`` (pid, logs and temp dirs there too) around ``http``."""
    conf = _CONF.format(
        # As root, workers would otherwise drop to "nobody" and could not write our 0700 temp dirs.
        user="user root;" if os.geteuid() == 0 else "",
        prefix=prefix,
        http=http,
    )
    path = prefix / "nginx.conf"
    path.write_text(conf)
    return path


def argv(binary: str, prefix: Path, conf: Path) -> list[str]:
    """nginx in the foreground with everything under ``prefix`` (no root, no /var/log)."""
    return [binary, "-p", str(prefix), "-e", str(prefix / "error.log"), "-c", str(conf), "-g", "daemon off;"]


def ensure_nginx() -> str:
    """Path of the nginx binary, installing the Debian package if it is missing."""
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.path.exists(p)), None
    )
    if found:
        return found
    cmd = ["apt-get", "install", "-y", "-q", "nginx"]
    log(f"nginx not found; running: {' '.join(cmd)}")
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        log("apt-get install failed; running: apt-get update -q, then the install again")
        subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True)
        subprocess.run(cmd, check=True, capture_output=True)
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(found):
        raise RuntimeError("nginx is still missing after apt-get install")
    return found


@dataclass
class CappedS3:
    capped_url: str
    warm_url: str
    cap_mib_s: int
    child: Child


def start(session: Session, moto_url: str, cap_mib_s: int) -> CappedS3:
    binary = ensure_nginx()
    prefix = session.path("nginx")
    capped, warm = free_port(), free_port()
    servers = _SERVER.format(port=capped, limit=f"limit_rate {cap_mib_s}m;") + _SERVER.format(
        port=warm, limit=""
    )
    http = _S3_HTTP.format(prefix=prefix, moto_port=moto_url.rsplit(":", 1)[1], servers=servers)
    conf_path = write_conf(prefix, http)
    child = session.start("nginx", argv(binary, prefix, conf_path), os.environ.copy())
    url = f"http://127.0.0.1:{capped}"
    child.wait_for(lambda: answers(url + "/"), 30, f"listening on {url}")
    log(f"nginx on {url} (limit_rate {cap_mib_s} MiB/s per connection), cache filler on :{warm}")
    return CappedS3(capped_url=url, warm_url=f"http://127.0.0.1:{warm}", cap_mib_s=cap_mib_s, child=child)
