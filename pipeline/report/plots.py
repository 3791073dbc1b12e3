"""The report's figures, drawn with matplotlib's object API (no pyplot state) into inline SVG.

Each function takes frames from :mod:`pipeline.report.data` and returns a :class:`Plot`; an empty
input gives a Plot without SVG whose caption says why it is empty, which the page shows instead.
A short series is drawn with a marker on each point, so one point shows however short the run.
Large inputs are drawn rasterized (an embedded PNG inside the SVG) so the file stays small whatever
the run length.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import matplotlib
import matplotlib.dates
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

STATUS_COLORS = {
    "OK": "#2ca02c", "WARN": "#ff7f0e", "STALL": "#9467bd", "STOP": "#d62728", "REWIND": "#1f77b4", "UNKNOWN": "#7f7f7f",
}
_RASTERIZE_OVER = 3000
_MARKERS_UP_TO = 30  # points in a line; a longer line is readable without a marker on each

EMPTY = {
    "availability": "no data yet: no producer has avoided a broker and no fault episode was found",
    "broker_health": "no data yet: no send results have been read",
    "group_lag": "no data yet: group_status gets a row once a group's queues have been judged, "
                 "lag.evaluation_interval_s after its first events settle",
    "queue_ownership": "no data yet: no consumer progress has been judged",
}


@dataclass(frozen=True)
class Plot:
    key: str
    title: str
    svg: str | None
    caption: str
    items: int  # data items drawn (bars, points, cells)


def _to_dt(ms: pd.Series | np.ndarray) -> pd.DatetimeIndex:
    return pd.to_datetime(np.asarray(ms, dtype="int64"), unit="ms")


def _svg(fig: Figure, key: str, span: tuple[int, int] | None = None) -> str:
    """The figure as an inline ``<svg>``; with ``span`` every panel shows that time range, so the
    report's plots line up one above the other."""
    if span is not None:
        pad = max((span[1] - span[0]) * 0.01, 1000)
        for ax in fig.axes:
            if ax.get_label() != "<colorbar>":
                ax.set_xlim(_num(span[0] - pad), _num(span[1] + pad))
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": key}):
        # No metadata: its creation date would make two reports of the same data differ.
        fig.savefig(buf, format="svg", bbox_inches="tight",
                    metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _lane_label(cluster: str, broker: str, clusters: int) -> str:
    return f"{cluster} / {broker}" if clusters > 1 else broker


def availability(
    windows: pd.DataFrame,
    episodes: pd.DataFrame,
    now_ms: int,
    span: tuple[int, int] | None = None,
    brokers: pd.DataFrame | None = None,
) -> Plot:
    """One lane per broker: episodes as red bands, each producer's windows as thin bars inside.

    ``brokers`` (cluster, broker_name rows, e.g. broker_health) adds lanes for healthy brokers.
    """
    key, title = "availability", "Broker availability: fault episodes and producer avoidance windows"
    if windows.empty and episodes.empty:
        return Plot(key, title, None, EMPTY[key], 0)
    known = [windows[["cluster", "broker_name"]], episodes[["cluster", "broker_name"]]]
    if brokers is not None:
        known.append(brokers[["cluster", "broker_name"]])
    lanes = sorted({(r.cluster, r.broker_name) for r in pd.concat(known).itertuples()})
    nclusters = len({c for c, _ in lanes})
    fig = Figure(figsize=(11, 0.9 + 0.75 * len(lanes)))
    ax = fig.add_subplot()
    items = 0
    for i, (cluster, broker) in enumerate(lanes):
        ax.axhspan(i - 0.45, i + 0.45, color="#eef7ee", zorder=0)
        ep = episodes[(episodes.cluster == cluster) & (episodes.broker_name == broker)]
        for row in ep.itertuples():
            end = row.closed_ms if pd.notna(row.closed_ms) else now_ms
            ax.barh(i, _width_days(row.opened_ms, end), left=_num(row.opened_ms), height=0.9,
                    color="#f4b6b6", edgecolor="#d62728", linewidth=1.2, zorder=1)
            items += 1
        win = windows[(windows.cluster == cluster) & (windows.broker_name == broker)]
        clients = sorted(win.client_id.unique())
        slot = {c: j for j, c in enumerate(clients)}
        if len(win):
            ys = [i - 0.4 + 0.8 * (slot[c] + 0.5) / len(clients) for c in win.client_id]
            colors = ["#ff7f0e" if fe else "#bbbbbb" for fe in win.fault_enable]
            bars = ax.barh(ys, [_width_days(s, e) for s, e in zip(win.start_ms, win.end_ms)],
                           left=matplotlib.dates.date2num(_to_dt(win.start_ms)), height=0.8 / max(len(clients), 1) * 0.8, color=colors, zorder=2)
            if len(win) > _RASTERIZE_OVER:
                for bar in bars:
                    bar.set_rasterized(True)
            items += len(win)
    ax.set_yticks(range(len(lanes)), [_lane_label(c, b, nclusters) for c, b in lanes])
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.invert_yaxis()
    ax.xaxis_date()
    ax.set_xlabel("time (UTC)")
    ax.legend(handles=[Patch(facecolor="#f4b6b6", edgecolor="#d62728", label="fault episode"),
                       Patch(color="#ff7f0e", label="producer window (fault tolerance on)"),
                       Patch(color="#bbbbbb", label="shadow window (fault tolerance off)")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    caption = f"{len(episodes)} episodes, {len(windows)} producer windows from {windows.client_id.nunique()} producers"
    return Plot(key, title, _svg(fig, key, span), caption, items)


def _num(ms: float) -> float:
    """Matplotlib's date number (days since its epoch) for Unix milliseconds."""
    return float(matplotlib.dates.date2num(_to_dt([int(ms)])[0]))


def _width_days(start_ms: float, end_ms: float) -> float:
    return max(float(end_ms) - float(start_ms), 1.0) / 86_400_000.0


def _marker(points: int) -> str | None:
    return "o" if points <= _MARKERS_UP_TO else None


def broker_health(
    health: pd.DataFrame, source: str, span: tuple[int, int] | None = None, bucket_ms: int = 60_000
) -> Plot:
    """Failure rate and latency percentiles per broker and ``bucket_ms`` (``minute_ms`` starts each)."""
    key, title = "broker_health", "Failure rate and latency percentiles per broker"
    if health.empty:
        return Plot(key, title, None, EMPTY[key], 0)
    fig = Figure(figsize=(11, 6.5))
    ax_fail, ax_lat = fig.subplots(2, 1, sharex=True)
    nclusters = health.cluster.nunique()
    items = 0
    for n, ((cluster, broker), df) in enumerate(health.groupby(["cluster", "broker_name"], sort=True)):
        df = df.sort_values("minute_ms")
        color = f"C{n % 10}"
        label = _lane_label(cluster, broker, nclusters)
        t = _to_dt(df.minute_ms + bucket_ms // 2)  # the middle of each bucket
        marker = _marker(len(df))
        ax_fail.plot(t, df.failure_rate * 100.0, marker=marker or ".", markersize=4, color=color, label=label)
        ax_lat.plot(t, df.latency_p50_ms, color=color, linestyle=":", linewidth=1, marker=marker, markersize=3,
                    fillstyle="none")
        ax_lat.plot(t, df.latency_p99_ms, color=color, linewidth=1.5, marker=marker, markersize=4)
        items += len(df)
    ax_fail.set_ylabel("failed sends (%)")
    ax_fail.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax_lat.set_yscale("symlog", linthresh=10)
    ax_lat.set_ylabel("latency (ms): p99 solid, p50 dotted")
    ax_lat.set_xlabel("time (UTC)")
    ax_lat.xaxis_date()
    caption = f"per {'minute' if bucket_ms == 60_000 else f'{bucket_ms // 1000} s'}, from {source}"
    return Plot(key, title, _svg(fig, key, span), caption, items)


def group_lag(status: pd.DataFrame, span: tuple[int, int] | None = None) -> Plot:
    """Total lag of each group over time, each point coloured by the group's status."""
    key, title = "group_lag", "Consumer lag per group, coloured by status"
    if status.empty:
        return Plot(key, title, None, EMPTY[key], 0)
    groups = sorted({(r.cluster, r.consumer_group) for r in status[["cluster", "consumer_group"]].itertuples()})
    fig = Figure(figsize=(11, 0.5 + 2.2 * len(groups)))
    axes = np.atleast_1d(fig.subplots(len(groups), 1, sharex=True, squeeze=False)[:, 0])
    items = 0
    for ax, (cluster, group) in zip(axes, groups):
        df = status[(status.cluster == cluster) & (status.consumer_group == group)].sort_values("ts_ms")
        t = _to_dt(df.ts_ms)
        lag = df.total_lag.astype("float64")
        ax.plot(t, lag, color="#999999", linewidth=1, zorder=1)
        colors = [STATUS_COLORS.get(s, "#000000") for s in df.status]
        ax.scatter(t, lag, c=colors, s=14, zorder=2, rasterized=len(df) > _RASTERIZE_OVER)
        ax.set_ylabel("lag (messages)")
        ax.set_title(f"{group} ({cluster})", fontsize=9, loc="left")
        items += len(df)
    axes[-1].xaxis_date()
    axes[-1].set_xlabel("time (UTC)")
    seen = [s for s in STATUS_COLORS if s in set(status.status)]
    axes[0].legend(handles=[Patch(color=STATUS_COLORS[s], label=s) for s in seen],
                   loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return Plot(key, title, _svg(fig, key, span), f"{len(groups)} groups, {len(status)} status rows", items)


def _codes_of(column: pd.Series, codes: dict[str, int]) -> pd.Series:
    """Owner client ids as colour codes; unowned (None/NaN) stays NaN."""
    return column.map(lambda owner: codes.get(owner, np.nan) if isinstance(owner, str) else np.nan)


def queue_ownership(lag: pd.DataFrame, span: tuple[int, int] | None = None, max_columns: int = 240) -> Plot:
    """Which consumer owned each queue over time, one panel per group (white: unowned)."""
    key, title = "queue_ownership", "Queue ownership per group"
    if lag.empty:
        return Plot(key, title, None, EMPTY[key], 0)
    groups = sorted({(r.cluster, r.consumer_group) for r in lag[["cluster", "consumer_group"]].itertuples()})
    panels = []
    for cluster, group in groups:
        df = lag[(lag.cluster == cluster) & (lag.consumer_group == group)].copy()
        df["queue"] = df.topic + " " + df.broker_name + ":" + df.queue_id.astype(str)
        times = np.sort(df.ts_ms.unique())
        if len(times) > max_columns:
            times = times[np.linspace(0, len(times) - 1, max_columns).astype(int)]
        df = df[df.ts_ms.isin(times)].sort_values("ts_ms").drop_duplicates(["queue", "ts_ms"], keep="last")
        grid = df.pivot(index="queue", columns="ts_ms", values="owner_client_id").reindex(columns=times)
        panels.append((cluster, group, grid))
    fig = Figure(figsize=(11, 0.6 + sum(0.9 + 0.16 * len(g) for *_, g in panels)))
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    items = 0
    for ax, (cluster, group, grid) in zip(axes, panels):
        owners = sorted({o for o in grid.stack().dropna().unique()})
        codes = {o: i for i, o in enumerate(owners)}
        values = grid.apply(_codes_of, codes=codes)
        palette = [matplotlib.colormaps["tab20"](i % 20) for i in range(max(len(owners), 1))]
        cmap = ListedColormap(palette).with_extremes(bad="white")
        t = _to_dt(grid.columns.to_numpy())
        x = matplotlib.dates.date2num(t)
        step = (x[1] - x[0]) if len(x) > 1 else 1 / 1440
        ax.imshow(np.ma.masked_invalid(values.to_numpy(dtype=float)), aspect="auto", cmap=cmap, interpolation="nearest",
                  vmin=-0.5, vmax=max(len(owners), 1) - 0.5, extent=(x[0] - step / 2, x[-1] + step / 2, len(grid) - 0.5, -0.5))
        ax.set_yticks(range(len(grid)), list(grid.index), fontsize=7)
        ax.xaxis_date()
        ax.set_title(f"{group} ({cluster})", fontsize=9, loc="left")
        ax.legend(handles=[Patch(color=cmap(codes[o]), label=o) for o in owners][:20],
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
        items += int(np.isfinite(values.to_numpy(dtype=float)).sum())
    axes[-1].set_xlabel("time (UTC)")
    return Plot(key, title, _svg(fig, key, span), f"{len(panels)} groups; colour = owning client id", items)
