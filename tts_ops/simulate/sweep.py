"""`--sweep key=v1,v2,...`: one simulation per value, p99 against replica-seconds, Pareto front marked."""

from __future__ import annotations

import math
from typing import Any

from tts_ops.simulate.errors import SimulateError
from tts_ops.simulate.profile import Profile
from tts_ops.simulate.settings import KEYS, parse_value
from tts_ops.simulate.simulator import simulate
from tts_ops.simulate.trace import Trace


def parse(spec: str) -> tuple[str, list[Any]]:
    key, eq, raw = spec.partition("=")
    key = key.strip()
    if not eq or not raw:
        raise SimulateError(f"--sweep {spec!r}: expected key=v1,v2,...")
    if key not in KEYS:
        raise SimulateError(f"--sweep {key}: unknown key (known: {', '.join(KEYS)})")
    return key, [parse_value(key, r) for r in raw.split(",")]


def p99_all(latencies: list[float | None]) -> float:
    """p99 over every request, a rejected one counting as never answered (infinite latency): a
    setting that drops requests must not look fast."""
    xs = sorted(float("inf") if x is None else x for x in latencies)
    if not xs:
        return float("inf")
    return round(xs[min(len(xs) - 1, max(0, math.ceil(0.99 * len(xs)) - 1))], 4)


def pareto(rows: list[dict[str, Any]]) -> None:
    """Mark rows no other row beats on both p99 (rejections included) and replica-seconds."""
    for row in rows:
        p99, cost = row["p99_all_s"], row["replica_seconds"]
        row["pareto"] = not any(
            o["p99_all_s"] <= p99
            and o["replica_seconds"] <= cost
            and (o["p99_all_s"] < p99 or o["replica_seconds"] < cost)
            for o in rows
        )


def run(
    flavour: str, values: dict[str, Any], profile: Profile, trace: Trace, spec: str
) -> list[dict[str, Any]]:
    key, candidates = parse(spec)
    rows = []
    for candidate in candidates:
        result = simulate(flavour, {**values, key: candidate}, profile, trace)
        rows.append({"value": candidate, **result.summary(), "p99_all_s": p99_all(result.latencies)})
    pareto(rows)
    return rows


def format_table(key: str, rows: list[dict[str, Any]]) -> str:
    """p99 counts rejected requests as never answered (inf); p50 is over answered requests."""
    w = max(24, len(key))
    lines = [
        f"{key:>{w}}  {'p99 s':>8}  {'p50 s':>8}  {'replica-s':>10}  {'cold':>5}  {'rejected':>8}  pareto"
    ]
    for r in rows:
        lines.append(
            f"{r['value']!s:>{w}}  {r['p99_all_s']!s:>8}  {r['latency_p50_s']!s:>8}  "
            f"{r['replica_seconds']:>10.0f}  {r['cold_start_waits']:>5}  {r['rejected']:>8}  {'*' if r['pareto'] else ''}"
        )
    return "\n".join(lines)


def to_json(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """JSON has no infinity: a p99 that includes rejected requests becomes null."""
    return [{**r, "p99_all_s": None if r["p99_all_s"] == float("inf") else r["p99_all_s"]} for r in rows]
