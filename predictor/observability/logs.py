"""Structured logs: one JSON object per line on stderr (LOG_FORMAT=text for people at a terminal).

Client errors are the client's business: they log at most one line each, without a traceback, through
``CLIENT_ERRORS``, rate-limited per message so that a client repeating a bad request cannot fill the
log (``RateLimit``). Errors of ours (5xx) keep their traceback and are never limited.
"""

from __future__ import annotations

import json
import logging
import threading
import time

# Per message template: this many lines per window, then silence until the window ends; the next line
# let through says how many were dropped.
CLIENT_ERROR_BURST = 5
CLIENT_ERROR_WINDOW_S = 60.0

# uvicorn adds color_message (an ANSI copy of msg) to its records.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        # Fields passed with `extra=` become top-level keys.
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """For people at a terminal: the message, then the structured fields as key=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD)
        line = super().format(record)
        return f"{line} {extras}" if extras else line


class RateLimit(logging.Filter):
    """At most ``burst`` records per ``window_s`` for each message template; the first record let
    through after some were dropped carries ``suppressed``, their count."""

    def __init__(self, burst: int = CLIENT_ERROR_BURST, window_s: float = CLIENT_ERROR_WINDOW_S) -> None:
        super().__init__()
        self._burst = burst
        self._window_s = window_s
        self._windows: dict[tuple[str, object], list[float]] = {}  # key -> [start, passed, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        key = (record.name, record.msg)
        window = self._windows.get(key)
        if window is None or now - window[0] >= self._window_s:
            dropped = int(window[2]) if window is not None else 0
            if dropped:
                record.suppressed = dropped
            if len(self._windows) > 1000:  # templates are few; this only bounds a pathological caller
                self._windows.clear()
            self._windows[key] = [now, 1, 0]
            return True
        if window[1] < self._burst:
            window[1] += 1
            return True
        window[2] += 1
        return False


# Where client errors are logged: one line each, no traceback, rate-limited (configure() adds the filter).
CLIENT_ERRORS = logging.getLogger("predictor.client_errors")
# uvicorn's own client-error lines ("Invalid HTTP request received.") come through this logger.
_UVICORN_ERROR = "uvicorn.error"


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # KServe and uvicorn install their own handlers; route everything through ours, once.
    for name in ("kserve", "kserve.trace", "uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    # Probes hit us every few seconds; per-request counts live in tts_requests_total, not the log.
    # (uvicorn logs access lines whenever this logger has a handler, its parents' included.)
    access = logging.getLogger("uvicorn.access")
    access.handlers[:] = []
    access.propagate = False
    for lg in (CLIENT_ERRORS, logging.getLogger(_UVICORN_ERROR)):
        lg.filters[:] = [f for f in lg.filters if not isinstance(f, RateLimit)]
        lg.addFilter(RateLimit())
    # Python warnings (a library's deprecation notice) go through the same handler, so in JSON mode
    # every line on stderr is JSON, as log shippers expect.
    logging.captureWarnings(True)
    # So does an exception that ends a thread (threading's default prints a bare traceback).
    threading.excepthook = _log_thread_exception
    # boto's debug logs can include signed headers; keep them quiet whatever LOG_LEVEL says.
    for name in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(name).setLevel(max(logging.INFO, logging.getLevelName(level)))


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    exc_info = (args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback)
    thread = args.thread.name if args.thread is not None else "?"
    logging.getLogger("predictor.threads").error("thread %s ended by an exception", thread, exc_info=exc_info)
