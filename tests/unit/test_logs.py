"""The log configuration (predictor.observability.logs.configure), in-process."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from predictor.observability.logs import configure


@pytest.fixture
def restored_logging(monkeypatch):
    """The root logger and threading's hook as they were, after a test that calls configure()."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    level = root.level
    yield
    root.setLevel(level)


def test_an_exception_that_ends_a_thread_is_logged_as_one_json_line(restored_logging, capsys):
    configure("INFO", "json")  # here, so that its handler writes to the stderr capsys reads

    def fails() -> None:
        raise ValueError("the engine broke")

    thread = threading.Thread(target=fails, name="engine")
    thread.start()
    thread.join()

    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, "\n".join(lines)
    entry = json.loads(lines[0])
    assert entry["level"] == "ERROR"
    assert entry["msg"] == "thread engine ended by an exception"
    assert "ValueError: the engine broke" in entry["exc"]
