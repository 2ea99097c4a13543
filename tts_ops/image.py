"""Build the image with whatever engine this machine has: `make base-image`, `make image`.

Usage: python -m tts_ops.image base | build [-- EXTRA BUILD ARGS] | sizes

Where a Docker engine answers, `docker build` runs the Dockerfile as users run it. Otherwise podman
(Debian's) builds the same Dockerfile, with what these machines need and nothing a user needs:

* runc, not crun: crun refuses cgroups in hybrid mode (v1 controllers beside a v2 mount);
* explicit `--ulimit` values within this process's limits: podman's defaults exceed the hard limits
  here and every container would fail to start (`podman_flags`);
* `--network host`, so pip in the build reaches the package index this machine reaches;
* no registry is reachable, so the Dockerfile's `FROM python:3.11-slim-bookworm` is satisfied by a base
  built from Debian's own bookworm packages (debootstrap), imported under that name (`base`);
* pip in the build uses this machine's pip configuration (`pip config list`: CA bundle of the TLS
  proxy in front of pypi.org, local indexes and wheel directories), written to a pip.conf mounted at
  /etc/pip.conf with every local path it names mounted read-only at the same place (`pip_mounts`);
* the CPU image has no torch. An image built with ``--build-arg EXTRAS=native`` gets torch's CPU wheel
  from this machine's pip configuration (a local wheel), served to the build as a one-package index
  mounted read-only and named by the Dockerfile's own TORCH_INDEX_URL argument; it is never copied
  into the build context or the repository.
"""

from __future__ import annotations

import argparse
import html
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "image"
DOCKERFILE = ROOT / "Dockerfile"
DEFAULT_TAG = "tts-predictor:dev"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# What the python:3.11-slim-bookworm stand-in holds: the interpreter, venv (ensurepip, for the runtime
# stage's `python3.11 -m venv`), pip (the build stage's `pip wheel`), CA certificates for the index.
BASE_PACKAGES = ("python3.11", "python3.11-venv", "python3-pip", "python-is-python3", "ca-certificates")
# Where the one-package torch index is mounted during the build.
TORCH_INDEX_MOUNT = "/torch-index"


class ImageError(Exception):
    """A build step that cannot go on; the message says what is missing."""


def base_image() -> str:
    """The build stage's base as the Dockerfile names it, fully qualified as podman stores it."""
    match = re.search(r"^FROM\s+(\S+)\s+AS\s+build\s*$", DOCKERFILE.read_text(), re.MULTILINE | re.IGNORECASE)
    if not match:
        raise ImageError("Dockerfile: no `FROM <image> AS build` line")
    name = match.group(1)
    if "/" not in name.split(":")[0]:
        name = f"docker.io/library/{name}"
    return name


def engine() -> str:
    """docker where a Docker engine answers, else podman."""
    if shutil.which("docker") and _quiet(["docker", "info"]):
        return "docker"
    if shutil.which("podman"):
        return "podman"
    raise ImageError("neither a running Docker engine nor podman: `make system-packages` installs podman")


def podman_flags() -> list[str]:
    """Runtime and limits for `podman build` and `podman run` on these machines (see the module doc).

    Rootful podman asks for RLIMIT_NOFILE 1048576 and RLIMIT_NPROC 4194304 by default; without
    CAP_SYS_RESOURCE (as here) runc may not raise a limit, and every container fails to start. So each
    limit is set to this process's own, and NPROC also to at most kernel.pid_max: podman's runtime
    runs with NPROC capped there (32768 here, while the shell holds 96365), and asking for more fails
    the same way.
    """
    flags = []
    if shutil.which("runc"):
        flags += ["--runtime", "runc"]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for name, limit, cap in (
        ("nofile", resource.RLIMIT_NOFILE, None),
        ("nproc", resource.RLIMIT_NPROC, pid_max),
    ):
        soft, hard = resource.getrlimit(limit)
        if hard == resource.RLIM_INFINITY:
            continue
        hard = min(hard, cap) if cap else hard
        soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
        flags += ["--ulimit", f"{name}={soft}:{hard}"]
    return flags


def image_exists(tool: str, name: str) -> bool:
    return _quiet([tool, "image", "inspect", name])


def registry_reachable(timeout_s: float = 5.0) -> bool:
    """Docker Hub's registry answers (401 without a token counts: it is there)."""
    try:
        urllib.request.urlopen("https://registry-1.docker.io/v2/", timeout=timeout_s)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def ensure_base(tool: str) -> str:
    """The Dockerfile's base image present locally: pulled where a registry answers, else debootstrapped."""
    name = base_image()
    if image_exists(tool, name):
        return name
    if registry_reachable():
        subprocess.run([tool, "pull", name], check=True)
        return name
    build_base(tool, name)
    return name


def build_base(tool: str, name: str) -> None:
    """A python:3.11-slim-bookworm stand-in from Debian bookworm's packages (no registry needed)."""
    if not shutil.which("debootstrap"):
        raise ImageError("no registry reachable and no debootstrap: `make system-packages` installs it")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        rootfs = Path(tmp) / "rootfs"
        print(f"debootstrap bookworm ({', '.join(BASE_PACKAGES)}) -> {name}", flush=True)
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                "bookworm",
                str(rootfs),
                DEBIAN_MIRROR,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        # The official image's interpreter is not Debian-managed, so pip may install into it (PEP 668).
        (rootfs / "usr/lib/python3.11/EXTERNALLY-MANAGED").unlink(missing_ok=True)
        for junk in ("var/lib/apt/lists", "var/cache/apt", "var/log"):
            for child in (rootfs / junk).glob("*"):
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        tar = subprocess.Popen(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-cf", "-", "."], stdout=subprocess.PIPE
        )
        subprocess.run(
            [
                tool,
                "import",
                "--change",
                "ENV LANG=C.UTF-8",
                "--change",
                'CMD ["python3"]',
                "--message",
                f"local stand-in for {name}: debootstrap bookworm + {' '.join(BASE_PACKAGES)}",
                "-",
                name,
            ],
            stdin=tar.stdout,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if tar.wait() != 0:
            raise ImageError("tar of the debootstrapped tree failed")


def torch_pin() -> str:
    match = re.search(r'"torch==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    if not match:
        raise ImageError("pyproject.toml: no torch==<version> pin")
    return match.group(1)


def local_torch_index() -> Path | None:
    """A one-package index holding the CPU torch wheel this machine's pip resolves, or None.

    None where pip's configured indexes give no CPU build: the Dockerfile's default (torch's CPU index)
    is used then.
    """
    pin = torch_pin()
    index = CACHE / "torch-index"
    package = index / "torch"
    wheels = sorted(package.glob(f"torch-{pin}+cpu-*.whl"))
    if not wheels:
        package.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--python-version",
                    "3.11",
                    f"torch=={pin}",
                    "-d",
                    tmp,
                ],
                check=True,
            )
            found = [w for w in Path(tmp).glob("torch-*.whl") if "+cpu" in w.name]
            if not found:
                return None
            # Same filesystem (both under .cache): an atomic move, never a half-copied wheel.
            wheels = [found[0].replace(package / found[0].name)]
    links = "".join(f'<a href="{html.escape(w.name)}">{html.escape(w.name)}</a>\n' for w in wheels)
    (package / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return index


# pip settings carried into the build, and which of them name local paths to mount.
_PIP_KEYS = ("cert", "index-url", "extra-index-url", "find-links", "constraint", "default-timeout")
_PIP_PATH_KEYS = ("cert", "index-url", "extra-index-url", "find-links", "constraint")


def pip_mounts() -> list[str]:
    """`--volume` flags giving the build's pip this machine's pip configuration (see the module doc)."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], check=True, capture_output=True, text=True
    ).stdout
    settings: dict[str, str] = {}
    for line in listing.splitlines():
        match = re.fullmatch(r"[^.]*\.([\w-]+)='(.*)'", line.strip())
        if match and match.group(1) in _PIP_KEYS:
            settings.setdefault(match.group(1), match.group(2))
    if not settings:
        return []
    paths: set[str] = set()
    for key in _PIP_PATH_KEYS:
        for value in settings.get(key, "").split():
            path = value.removeprefix("file://")
            if not path.startswith("/"):
                continue  # a remote index: reached over the host network
            # A PEP 503 tree links from simple/<name>/ to ../../<files>: mount the tree, not simple/.
            paths.add(str(Path(path).parent) if Path(path).name == "simple" else path)
    CACHE.mkdir(parents=True, exist_ok=True)
    conf = CACHE / "pip.conf"
    conf.write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))
    flags = ["--volume", f"{conf}:/etc/pip.conf:ro,z"]
    for path in sorted(paths):
        if Path(path).exists():
            flags += ["--volume", f"{path}:{path}:ro"]
    return flags


def build(tag: str, extra: list[str]) -> None:
    tool = engine()
    if tool == "docker":
        subprocess.run(["docker", "build", "-t", tag, *extra, str(ROOT)], check=True)
        return
    ensure_base(tool)
    args = ["podman", "build", *podman_flags(), "--network", "host", "--pull=never", "-t", tag, *pip_mounts()]
    # The CPU image has no torch; only an image built with EXTRAS=native needs the wheel found here.
    wants_torch = any(a.startswith("EXTRAS=") and "native" in a for a in extra)
    index = local_torch_index() if wants_torch else None
    if index is not None:
        args += ["--volume", f"{index}:{TORCH_INDEX_MOUNT}:ro,z"]
        args += ["--build-arg", f"TORCH_INDEX_URL=file://{TORCH_INDEX_MOUNT}"]
    subprocess.run([*args, *extra, str(ROOT)], check=True)


def layer_sizes(tool: str, name: str) -> list[tuple[int, str]]:
    """(bytes, instruction) per layer, newest first, as `history` reports them."""
    out = subprocess.run(
        [tool, "history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", name],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [
        (_bytes(size), created) for size, _, created in (line.partition("\t") for line in out.splitlines())
    ]


def image_bytes(tool: str, name: str) -> int:
    out = subprocess.run(
        [tool, "image", "inspect", "--format", "{{.Size}}", name], check=True, capture_output=True, text=True
    )
    return int(out.stdout.strip())


def _bytes(size: str) -> int:
    """`history` sizes: '1.2GB', '394 kB', '0B' (decimal units, as podman and docker print them)."""
    match = re.fullmatch(r"\s*([\d.]+)\s*([kMGT]?B)\s*", size)
    if not match:
        return 0
    factor = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}[match.group(2)]
    return int(float(match.group(1)) * factor)


def _quiet(args: list[str]) -> bool:
    return subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line: what follows the first ``--`` goes to the engine's build as it is (nothing
    when ``make image`` has IMAGE_ARGS empty). Split here: argparse gives a positional ``nargs="*"``
    its empty list before ``--tag`` and then refuses the ``--`` and all after it."""
    parser = argparse.ArgumentParser(
        prog="python -m tts_ops.image", usage="%(prog)s [--tag TAG] {base,build,sizes} [-- BUILD_ARGS...]"
    )
    parser.add_argument("command", choices=("base", "build", "sizes"))
    parser.add_argument("--tag", default=DEFAULT_TAG)
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(own)
    args.extra = extra
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.command == "base":
            print(ensure_base(engine()))
        elif args.command == "build":
            build(args.tag, args.extra)
        else:
            tool = engine()
            base = base_image()
            print(
                f"{args.tag}: {image_bytes(tool, args.tag) / 1e6:.0f} MB; {base}: {image_bytes(tool, base) / 1e6:.0f} MB"
            )
            for size, created in layer_sizes(tool, args.tag):
                print(f"{size / 1e6:10.1f} MB  {created[:120]}")
    except ImageError as exc:
        print(f"image: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"image: {' '.join(map(str, exc.cmd))[:300]} exited {exc.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
