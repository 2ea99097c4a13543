"""One self-contained HTML page per report: title, verdict, reasons, tables, figures; written atomically.

compare (a canary's verdict) and simulate (an autoscaling run) both render through ``Page``, so the
two reports look alike and there is one template to keep safe: every text is escaped, figures are PNG
bytes inlined as ``data:`` URIs, and the page names no external resource (a CI artifact opened years
later, offline, still shows everything).
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from predictor.storage.files import atomic_write_bytes

# Cells that say a check's outcome get a colour; every other cell is plain text.
OUTCOMES = {"PASS": "pass", "FAIL": "fail"}

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; color: #1b1f24; margin: 0; background: #f6f7f9; }
main { max-width: 72rem; margin: 0 auto; padding: 1rem; }
h1 { font-size: 1.35rem; }
.verdict { display: inline-block; padding: 0.25rem 0.9rem; border-radius: 6px; font-weight: 700;
  font-size: 1.3rem; color: #fff; }
.verdict.pass { background: #1d7a38; } .verdict.fail { background: #b3261e; }
ul.reasons { color: #b3261e; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; background: #fff; max-width: 100%; }
caption { text-align: left; font-weight: 600; padding: 0.25rem 0; }
th, td { border: 1px solid #d5d9e0; padding: 0.3rem 0.7rem; text-align: left; vertical-align: top; }
td { font-variant-numeric: tabular-nums; }
td.pass { color: #1d7a38; font-weight: 700; } td.fail { color: #b3261e; font-weight: 700; }
figure { margin: 0 0 1.5rem; } figure img { max-width: 100%; height: auto; background: #fff; }
footer { color: #4a5260; font-size: 0.85rem; }
"""


@dataclass(frozen=True)
class Table:
    caption: str
    header: tuple[str, ...]
    rows: Sequence[tuple[str, ...]]


@dataclass(frozen=True)
class Figure:
    caption: str
    png: bytes


@dataclass
class Page:
    title: str
    verdict: bool | None = None  # None: a report without a verdict (simulate)
    reasons: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    footer: str = ""

    def render(self) -> str:
        e = html.escape
        parts = [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            # Nothing but the page itself and its inlined images may load.
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            "style-src 'unsafe-inline'; img-src data:\">",
            f"<title>{e(self.title)}</title><style>{STYLE}</style></head><body><main>",
            f"<h1>{e(self.title)}</h1>",
        ]
        if self.verdict is not None:
            word = "PASS" if self.verdict else "FAIL"
            parts.append(f'<p><span id="verdict" class="verdict {OUTCOMES[word]}">{word}</span></p>')
        if self.reasons:
            parts.append('<ul class="reasons">' + "".join(f"<li>{e(r)}</li>" for r in self.reasons) + "</ul>")
        for table in self.tables:
            parts.append(_table(table))
        for figure in self.figures:
            data = base64.b64encode(figure.png).decode("ascii")
            parts.append(
                f'<figure><img src="data:image/png;base64,{data}" alt="{e(figure.caption)}">'
                f"<figcaption>{e(figure.caption)}</figcaption></figure>"
            )
        if self.footer:
            parts.append(f"<footer>{e(self.footer)}</footer>")
        parts.append("</main></body></html>\n")
        return "\n".join(parts)

    def write(self, out: Path) -> None:
        """Write the page to ``out`` atomically: a reader sees the old file or the whole new one."""
        atomic_write_bytes(out, self.render().encode("utf-8"))


def _table(table: Table) -> str:
    e = html.escape
    head = "".join(f'<th scope="col">{e(h)}</th>' for h in table.header)
    rows = []
    for row in table.rows:
        cells = []
        for cell in row:
            css = OUTCOMES.get(cell)
            cells.append(f'<td class="{css}">{e(cell)}</td>' if css else f"<td>{e(cell)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><caption>{e(table.caption)}</caption><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
