"""The one error of the simulate family: bad input, which the CLI turns into exit 2."""

from __future__ import annotations


class SimulateError(Exception):
    """Input that cannot be simulated; the message names the file and line, or the key."""
