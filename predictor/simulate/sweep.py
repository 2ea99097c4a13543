"""`--sweep key=v1,v2,...`: one simulation per value, p99 against replica-seconds, Pareto front marked."""

from __future__ import annotations

from typing import Any

from predictor.simulate.errors import SimulateError
from predictor.simulate.profile import Profile
from predictor.simulate.settings import KEYS, parse_value
from predictor.simulate.simulator import simulate
from predictor.simulate.trace import Trace


def parse(spec: str) -> tuple[str, list[Any]]:
    key, eq, raw = spec.partition("=")
    key = key.strip()
    if not eq or not raw:
        raise SimulateError(f"--sweep {spec!r}: expected key=v1,v2,...")
    if key not in KEYS:
        raise SimulateError(f"--sweep {key}: unknown key (known: {', '.join(KEYS)})")
    return key, [parse_value(key, r) for r in raw.split(",")]


def pareto(rows: list[dict[str, Any]]) -> None:
    """Mark rows no other row beats on both p99 and replica-seconds (lower is better for both)."""
    for row in rows:
        p99, cost = row["latency_p99_s"] or float("inf"), row["replica_seconds"]
        row["pareto"] = not any(
            (o["latency_p99_s"] or float("inf")) <= p99
            and o["replica_seconds"] <= cost
            and ((o["latency_p99_s"] or float("inf")) < p99 or o["replica_seconds"] < cost)
            for o in rows
        )


def run(
    flavour: str, values: dict[str, Any], profile: Profile, trace: Trace, spec: str
) -> list[dict[str, Any]]:
    key, candidates = parse(spec)
    rows = []
    for candidate in candidates:
        summary = simulate(flavour, {**values, key: candidate}, profile, trace).summary()
        rows.append({"value": candidate, **summary})
    pareto(rows)
    return rows


def format_table(key: str, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{key:>24}  {'p99 s':>8}  {'p50 s':>8}  {'replica-s':>10}  {'cold':>5}  {'rejected':>8}  pareto"
    ]
    for r in rows:
        lines.append(
            f"{r['value']!s:>24}  {r['latency_p99_s']!s:>8}  {r['latency_p50_s']!s:>8}  "
            f"{r['replica_seconds']:>10.0f}  {r['cold_start_waits']:>5}  {r['rejected']:>8}  {'*' if r['pareto'] else ''}"
        )
    return "\n".join(lines)
