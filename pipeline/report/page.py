"""The HTML page: one self-contained file (inline CSS and SVG, no scripts, no external resources)."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Iterable, Sequence

import pandas as pd

from pipeline.report.plots import Plot

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1200px;
       color: #222; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 0; }
.meta { color: #666; margin-top: 4px; }
section { margin-top: 28px; }
h2 { font-size: 1.15em; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
figure.plot { margin: 8px 0; }
figure.plot svg { max-width: 100%; height: auto; }
figcaption { color: #666; font-size: 0.85em; }
.empty { color: #999; font-style: italic; padding: 24px; border: 1px dashed #ccc; text-align: center; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
th { background: #f5f5f5; }
.note { color: #8a6d3b; background: #fcf8e3; padding: 6px 10px; }
"""


def fmt_ms(ms: float | None) -> str:
    if ms is None or pd.isna(ms):
        return ""
    return dt.datetime.fromtimestamp(int(ms) / 1000, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def plot_section(plot: Plot) -> str:
    head = f'<section id="{plot.key}"><h2>{html.escape(plot.title)}</h2>'
    if plot.svg is None:
        return head + f'<div class="empty" data-plot="{plot.key}">{html.escape(plot.caption or "no data yet")}</div></section>'
    return (
        head + f'<figure class="plot" data-plot="{plot.key}" data-items="{plot.items}">{plot.svg}'
        f"<figcaption>{html.escape(plot.caption)}</figcaption></figure></section>"
    )


def table_html(headers: Sequence[str], rows: Iterable[Sequence[object]], empty: str = "none") -> str:
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    if not body:
        return f'<p class="empty">{html.escape(empty)}</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page(title: str, generated_ms: int, span: tuple[int, int] | None, notes: list[str], sections: list[str]) -> str:
    covered = f"{fmt_ms(span[0])} to {fmt_ms(span[1])}" if span else "no data yet"
    note_html = "".join(f'<p class="note">{html.escape(n)}</p>' for n in notes)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p class=\"meta\">generated {fmt_ms(generated_ms)}; data {covered}</p>"
        f"{note_html}{''.join(sections)}</body></html>\n"
    )
