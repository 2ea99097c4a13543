"""Child processes: started with their output in a log file, stopped with SIGTERM and then SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from testing.polling import wait_until

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
# Our own settings and credentials in the caller's shell must not leak into a child under test.
SCRUBBED_PREFIXES = (
    "AWS_",
    "OTEL_",
    "S3_",
    "STORAGE_",
    "MODEL_",
    "FETCH_",
    "CPU_",
    "HTTP_PORT",
    "GRPC_PORT",
)


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment without AWS, OTEL and predictor settings, plus ``extra``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES)}
    return {**base, **extra}


def as_user(uid: int, argv: list[str]) -> list[str]:
    """``argv`` run as ``uid`` (gid the same, no supplementary groups) through util-linux's setpriv.

    It keeps one capability, CAP_DAC_READ_SEARCH: reading and traversing past permissions, so the
    interpreter and venv of a developer machine (under a private /root here) can be read as an image's
    are. Writing is untouched by it: the process may write only where ``uid`` may, which is what the
    tests of an unprivileged server check.
    """
    caps = "+dac_read_search"
    ids = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return ["setpriv", *ids, f"--inh-caps={caps}", f"--ambient-caps={caps}", *argv]


class Child:
    """A child process whose stdout and stderr go to ``log_path`` (or to this terminal when None)."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str],
        log_path: Path | None,
        cwd: Path = REPO,
        user: int | None = None,
    ) -> None:
        """``user``: run as this uid and gid, no supplementary groups, as a pod's runAsUser does (needs
        root; see ``as_user``). The log file is opened here, so the child needs no right to write it."""
        self.name = name
        self.log_path = log_path
        self.started = time.perf_counter()
        if user is not None:
            argv = as_user(user, argv)
        if log_path is None:
            self.proc = subprocess.Popen(argv, env=dict(env), cwd=cwd)
        else:
            # The child holds its own descriptor; ours is not needed once it has started.
            with open(log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    argv, env=dict(env), stdout=log, stderr=subprocess.STDOUT, cwd=cwd
                )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def logs(self) -> str:
        """Everything the process wrote so far ("" when it writes to the terminal)."""
        if self.log_path is None:
            return ""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, chars: int = 3000) -> str:
        return self.logs()[-chars:]

    def exit_reason(self) -> str | None:
        """Why waiting for this process is pointless (it exited), or None while it runs."""
        code = self.proc.poll()
        return None if code is None else f"{self.name} exited ({code})"

    def wait_for(self, predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
        """wait_until that fails at once, with the log tail, if this process exits meanwhile."""
        return wait_until(
            predicate,
            timeout,
            interval,
            f"{self.name}: {what}",
            give_up=self.exit_reason,
            details=self.log_tail,
        )

    def stop(self, grace_s: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after ``grace_s``; the exit status. Safe to call more than once."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
