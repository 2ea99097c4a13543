"""The sweeps table (tts_ops/simulate/tables.py) sweeps around what ships: each row's candidates
include the value its overlay renders with, so the bold cell is the shipped one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tts_ops.simulate import settings, tables

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("row", tables.ROWS, ids=lambda r: r.label)
def test_each_row_sweeps_the_value_its_overlay_ships(row):
    values = settings.read(ROOT / row.overlay).values
    shipped = {values[key] for key in row.keys}
    assert len(shipped) == 1, f"{row.keys} are set together but ship {shipped}"
    assert any(tables._same(c, values[row.keys[0]]) for c in row.candidates), (values[row.keys[0]], row)
    assert set(row.traces) <= set(tables.TRACES)


def test_a_cell_counts_rejected_and_timed_out_requests_as_lost():
    row = {
        "p99_all_s": float("inf"),
        "replica_seconds": 12.4,
        "cold_start_waits": 3,
        "rejected": 2,
        "timed_out": 1,
    }
    assert tables.cell(row) == "inf/12/3/3"
