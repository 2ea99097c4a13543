"""Terminal progress bars for artifact transfers (publish, fetch), shown only on a terminal."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(total: int | None, desc: str) -> Any:
    """A byte-counting tqdm bar; silent when stderr is not a terminal (pods, CI logs)."""
    from tqdm import tqdm

    return tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=not sys.stderr.isatty()
    )
