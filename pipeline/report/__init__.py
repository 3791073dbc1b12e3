"""``faultwatch report``: one self-contained HTML file with plots of the Delta tables.

Reads the silver tables with deltalake (no Spark), draws them with matplotlib as inline SVG and
writes a single HTML file with no external resources, so it can be mailed or archived as is.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from pipeline.report import page as pg
from pipeline.report import plots
from pipeline.report.data import ReportData, load_report_data

__all__ = ["ReportData", "build_html", "default_report_path", "load_report_data", "write_report"]


def default_report_path(storage_root: str) -> Path:
    """``<storage.root>/../report/faultwatch-report.html`` (next to the tables, not inside them);
    ``report/faultwatch-report.html`` in the working directory when the tables are on object storage."""
    if "://" in storage_root:
        return Path("report") / "faultwatch-report.html"
    return Path(storage_root).resolve().parent / "report" / "faultwatch-report.html"


def build_html(data: ReportData, generated_ms: int, title: str = "faultwatch report") -> str:
    span = data.time_range()
    now_ms = span[1] if span else generated_ms  # open episodes are drawn up to the latest data
    windows, episodes = data.frame("producer_fault_windows_live"), data.frame("broker_fault_episodes_live")
    sections = [
        pg.plot_section(plots.availability(windows, episodes, now_ms, span, data.frame("broker_health"))),
        _episodes_table(episodes),
        pg.plot_section(plots.broker_health(data.frame("broker_health"), data.health_source, span,
                                            data.health_bucket_ms)),
        pg.plot_section(plots.group_lag(data.frame("group_status"), span)),
        pg.plot_section(plots.queue_ownership(data.frame("queue_lag"), span)),
        _recommendations_table(data.frame("avoidance_recommendations")),
        _tables_summary(data),
    ]
    return pg.page(title, generated_ms, span, data.notes, sections)


def write_report(
    storage_root: str,
    out: str | Path | None = None,
    since_ms: int | None = None,
    generated_ms: int | None = None,
    title: str = "faultwatch report",
) -> Path:
    """Read the tables under ``storage_root`` and write the report; returns its path."""
    data = load_report_data(storage_root, since_ms)
    generated = int(time.time() * 1000) if generated_ms is None else generated_ms
    path = Path(out) if out is not None else default_report_path(storage_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(build_html(data, generated, title), encoding="utf-8")
    tmp.replace(path)  # readers never see a half-written file
    return path


def _episodes_table(episodes: pd.DataFrame) -> str:
    rows = [
        (r.cluster, r.broker_name, _span(r._asdict()), pg.fmt_ms(r.opened_ms), pg.fmt_ms(r.closed_ms), r.reason,
         f"{r.peak_avoiding_share:.0%}", r.peak_avoiding_producers, r.failures, r.dominant_error or "")
        for r in episodes.sort_values("opened_ms").itertuples()
    ]
    headers = ("cluster", "broker", "state", "opened", "closed", "reason", "peak share avoiding",
               "peak producers avoiding", "failures", "dominant error")
    return '<section id="episodes"><h2>Broker fault episodes</h2>' + pg.table_html(headers, rows, "no episodes") + "</section>"


def _span(row: dict) -> str:
    """``closed, lasted 40 s``, or since when an episode not closed is open (NaN is pandas' None)."""
    from pipeline.demo_view import episode_span

    return episode_span({**row, "closed_ms": None if pd.isna(row["closed_ms"]) else row["closed_ms"]})


def _recommendations_table(recs: pd.DataFrame) -> str:
    if len(recs):
        latest = recs[recs.decided_ms == recs.decided_ms.max()].sort_values(["cluster", "broker_name"])
    else:
        latest = recs
    rows = [
        (r.cluster, r.broker_name, r.action, pg.fmt_ms(r.avoid_until_ms), pg.fmt_ms(r.expires_ms), r.reason,
         r.producers_avoiding, pg.fmt_ms(r.decided_ms))
        for r in latest.itertuples()
    ]
    headers = ("cluster", "broker", "action", "avoid until", "expires", "reason", "producers avoiding", "decided")
    body = pg.table_html(headers, rows, "no data yet")
    return f'<section id="recommendations"><h2>Latest avoidance recommendations</h2>{body}</section>'


def _tables_summary(data: ReportData) -> str:
    rows = [(name, "yes" if data.present[name] else "no", len(df)) for name, df in data.frames.items()]
    body = pg.table_html(("table", "exists", "rows read (current view)"), rows)
    return f'<section id="tables"><h2>Tables</h2>{body}</section>'
