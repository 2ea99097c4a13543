"""The node's cores, shared by the work running on it (processor sharing).

The work is each synthesis under way and each pod's cold start (imports, the voice's load and
warm-up: CPU, not waiting), each given as the seconds it takes at its own speed, on the cores the
profile measured it with (a worker's part of its pod's CPU limit; a cold start, the pod's). With
``cpus`` > 0 (node.cpus) the pieces share the node's cores in proportion to what each asks for, none
faster than its own speed; whenever a piece starts or ends, the others are re-timed. With ``cpus`` = 0
each piece has what it asks for. The cores may change over time (``resize``: what the rest of the
node leaves changes while it starts pods, node.cpus_over_time); the pieces under way are re-timed.

On the local cluster's 2-core node, four busy 1-CPU pods and starting ones measured 0.3-0.45 of a
core each, and pods started beside busy ones took 2.5-3 times the cold start of the first; a share
fixed when a piece starts kept the first pods fast while later ones slowed everything
(tests/e2e/test_calibration.py, docs/cluster.md).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

# (when it ends, its key, the version that finish belongs to): a finish whose version is no longer the
# piece's own was re-timed and is stale.
Finish = tuple[float, Hashable, int]


@dataclass
class _Piece:
    remaining: float  # seconds of work at its own speed
    cores: float  # what it runs on at its own speed
    rate: float = 0.0  # its speed now, as a fraction of its own; 0 = not timed yet
    version: int = 0


class Cores:
    def __init__(self, cpus: float) -> None:
        self.cpus = cpus
        self._pieces: dict[Hashable, _Piece] = {}
        self._since = 0.0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._pieces

    def start(self, now: float, key: Hashable, seconds: float, cores: float = 1.0) -> list[Finish]:
        """Begin ``seconds`` of work (on ``cores`` at its own speed) under ``key``; the finishes to
        schedule."""
        self._settle(now)
        self._pieces[key] = _Piece(seconds, cores)
        return self._retime(now)

    def current(self, key: Hashable, version: int) -> bool:
        piece = self._pieces.get(key)
        return piece is not None and piece.version == version

    def end(self, now: float, key: Hashable) -> list[Finish]:
        """``key`` finished or was stopped (a starting pod scaled away); the others' new finishes."""
        self._settle(now)
        self._pieces.pop(key, None)
        return self._retime(now)

    def resize(self, now: float, cpus: float) -> list[Finish]:
        """From ``now`` the pieces share ``cpus`` cores; their new finishes."""
        self._settle(now)
        self.cpus = cpus
        return self._retime(now)

    def _share(self) -> float:
        asked = sum(piece.cores for piece in self._pieces.values())
        return min(1.0, self.cpus / asked) if self.cpus > 0 and asked > 0 else 1.0

    def _settle(self, now: float) -> None:
        elapsed = now - self._since
        if elapsed > 0:
            for piece in self._pieces.values():
                piece.remaining = max(0.0, piece.remaining - piece.rate * elapsed)
        self._since = now

    def _retime(self, now: float) -> list[Finish]:
        rate = self._share()
        finishes = []
        for key, piece in self._pieces.items():
            if piece.rate != rate:
                piece.rate = rate
                piece.version += 1
                finishes.append((now + piece.remaining / rate, key, piece.version))
        return finishes
