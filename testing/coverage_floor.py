"""The line `make test` ends with: the suite's coverage in total and per package, next to the floor.

Reads the combined data through `coverage json` (so it counts what `coverage report` counts) and the
floor from pyproject.toml's [tool.coverage.report] fail_under; `coverage report` itself enforces it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    out = REPO / ".cache" / "coverage" / "coverage.json"
    # --fail-under=0: this only reports; `coverage report` already failed the run below the floor.
    subprocess.run(
        [sys.executable, "-m", "coverage", "json", "-q", "--fail-under=0", "-o", str(out)],
        check=True,
        cwd=REPO,
    )
    data = json.loads(out.read_text())
    floor = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["coverage"]["report"]["fail_under"]
    per_package: dict[str, list[int]] = {}
    for name, file in data["files"].items():
        package = Path(name).parts[0]
        counts = per_package.setdefault(package, [0, 0])
        counts[0] += file["summary"]["covered_lines"]
        counts[1] += file["summary"]["num_statements"]
    parts = ", ".join(f"{p}/ {100 * c / n:.1f} %" for p, (c, n) in sorted(per_package.items()) if n)
    total = data["totals"]["percent_covered"]
    print(f"coverage: {total:.1f} % in total ({parts}); floor {floor} % (pyproject.toml fail_under)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
