"""The one polling loop: wait until a condition holds, or say clearly what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx

T = TypeVar("T")

# A server that is still starting refuses or drops connections; that is "not yet", not a failure.
NOT_YET: tuple[type[BaseException], ...] = (OSError, httpx.TransportError)


class GaveUp(RuntimeError):
    """The wait cannot succeed any more (the process being waited for has exited)."""


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.05,
    what: str = "the condition",
    *,
    give_up: Callable[[], str | None] | None = None,
    details: Callable[[], str] | None = None,
    ignore: tuple[type[BaseException], ...] = NOT_YET,
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy, and return that.

    Raises TimeoutError naming ``what`` after ``timeout`` seconds. ``give_up`` is asked after each
    failed try and ends the wait at once with GaveUp when it returns a reason; ``details`` (a log tail, say) is
    appended to either message. Exceptions in ``ignore`` count as "not yet"; the last one is reported.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
        except ignore as exc:
            last_error = exc
        else:
            if result:
                return result
        # Asked after the predicate: what already happened (a line logged before exiting) still counts.
        if give_up is not None and (reason := give_up()) is not None:
            raise GaveUp(_message(f"{reason} before {what}", details))
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    tried = f" (last try: {last_error!r})" if last_error is not None else ""
    raise TimeoutError(_message(f"timed out after {timeout:g} s waiting for {what}{tried}", details))


def answers(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` at all (any status: moto's root says 4xx, say)."""
    try:
        return httpx.get(url, timeout=1).status_code < 600
    except httpx.TransportError:
        return False


def _message(head: str, details: Callable[[], str] | None) -> str:
    return f"{head}\n{details()}" if details is not None else head
