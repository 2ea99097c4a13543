"""Structured logs: one JSON object per line on stderr (LOG_FORMAT=text for people at a terminal)."""

from __future__ import annotations

import json
import logging
import time

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
    # Python warnings (a library's deprecation notice) go through the same handler, so in JSON mode
    # every line on stderr is JSON, as log shippers expect.
    logging.captureWarnings(True)
    # boto's debug logs can include signed headers; keep them quiet whatever LOG_LEVEL says.
    for name in ("botocore", "boto3", "urllib3", "s3transfer"):
        logging.getLogger(name).setLevel(max(logging.INFO, logging.getLevelName(level)))
