"""``GET /``: one server-rendered page of the current state that reloads itself.

Plain HTML and inline CSS, no script and no external resource (it must work on an air-gapped
operations network). Three panels fit one screen: brokers with their episodes, consumer groups
by severity, and the published avoidance lists; long lists are cut with a count of the rest.
"""

from __future__ import annotations

import time
from html import escape

from pipeline.serve.state import Broker, Group, ServeState, avoided_brokers

_SEVERITY = {"STOP": 0, "STALL": 1, "REWIND": 2, "WARN": 3, "UNKNOWN": 4, "OK": 5}
_EPISODE_ORDER = {"open": 0, "suspected": 1, "none": 2}

_CSS = """
body{font:14px/1.35 system-ui,sans-serif;margin:12px 18px;color:#1d232b;background:#f6f7f9}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:0 0 6px}
.meta{color:#5a6570;margin-bottom:10px}.grid{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:12px}
section{background:#fff;border:1px solid #d9dee4;border-radius:6px;padding:10px 12px}
section.wide{grid-column:1/3}table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:3px 6px;border-bottom:1px solid #eef0f3;vertical-align:top}
th{white-space:nowrap}.c{display:block;color:#5a6570;font-size:12px}
th{font-weight:600;color:#5a6570}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.b{display:inline-block;white-space:nowrap;padding:0 6px;border-radius:8px;font-size:12px;font-weight:600}
.ok{background:#dff3e4;color:#17622e}.warn{background:#fff0c7;color:#7a5300}
.bad{background:#fbdcdc;color:#8f1d1d}.dim{background:#eceff2;color:#46505a}
.health{padding:6px 10px;border-radius:6px;margin-bottom:10px}.more{color:#5a6570;margin-top:4px}
"""


def _badge(text: str, kind: str) -> str:
    return f'<span class="b {kind}">{escape(text)}</span>'


def _status_kind(status: str) -> str:
    return {"OK": "ok", "WARN": "warn", "UNKNOWN": "dim"}.get(status, "bad")


def _num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "–" if value is None else fmt.format(value)


def _clock(ms: int | None, fmt: str = "%H:%M:%S") -> str:
    return "–" if ms is None else time.strftime(fmt, time.gmtime(ms / 1000))


def _table(head: list[str], rows: list[str], numeric: set[int]) -> str:
    ths = "".join(f'<th{" class=n" if i in numeric else ""}>{escape(h)}</th>' for i, h in enumerate(head))
    return f"<table><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _more(total: int, shown: int, what: str) -> str:
    return f'<div class="more">and {total - shown} more {what}</div>' if total > shown else ""


def brokers_panel(state: ServeState, limit: int) -> str:
    brokers = sorted(
        (b for c in state.clusters.values() for b in c.brokers.values()),
        key=lambda b: (_EPISODE_ORDER[b.episode_state], not b.avoided, b.cluster, b.name),
    )
    rows = [_broker_row(b) for b in brokers[:limit]]
    body = _table(["broker", "fault episode", "failures", "p99", "avoiding", "advice"],
                  rows, {2, 3, 4}) if rows else '<p class="empty">no brokers seen yet</p>'
    return f'<section id="brokers"><h2>Brokers and fault episodes</h2>{body}{_more(len(brokers), limit, "brokers")}</section>'


def _broker_row(b: Broker) -> str:
    kind = {"open": "bad", "suspected": "warn", "none": "ok"}[b.episode_state]
    episode = _badge(b.episode_state, kind)
    detail = ""
    if b.open_episodes:
        first = b.open_episodes[0]
        detail = f' since {_clock(first["opened_ms"])} ({escape(first["reason"])})'

    h = b.health or {}
    rate = h.get("failure_rate")
    p99 = h.get("latency_p99_ms")
    return (
        f"<tr><td>{escape(b.name)}<span class=c>{escape(b.cluster)}</span></td><td>{episode}{detail}</td>"
        f'<td class="n">{_num(rate * 100 if rate is not None else None, "{:.1f} %")}</td>'
        f'<td class="n">{_num(p99, "{:,.0f} ms")}</td>'
        f'<td class="n">{_num(h.get("producers_avoiding"))}</td>'
        f"<td>{_badge('avoid', 'bad') if b.avoided else ''}</td></tr>"
    )


def groups_panel(state: ServeState, limit: int) -> str:
    groups = sorted(
        (g for c in state.clusters.values() for g in c.groups.values()),
        key=lambda g: (_SEVERITY.get(g.status, 9), -(g.total_lag or 0), g.cluster, g.name),
    )
    rows = [_group_row(g) for g in groups[:limit]]
    body = _table(["group", "status", "lag", "time lag", "worst queue"], rows, {2, 3}) \
        if rows else '<p class="empty">no consumer groups seen yet</p>'
    return f'<section id="groups"><h2>Consumer groups</h2>{body}{_more(len(groups), limit, "groups")}</section>'


def _group_row(g: Group) -> str:
    worst = f"{g.worst.topic} {g.worst.broker}:{g.worst.queue_id}" if g.worst else ""
    owner = (g.worst.owner if g.worst else None) or ""
    time_lag = None if g.max_time_lag_ms is None else g.max_time_lag_ms / 1000
    return (
        f"<tr><td>{escape(g.name)}<span class=c>{escape(g.cluster)}</span></td>"
        f"<td>{_badge(g.status, _status_kind(g.status))}</td>"
        f'<td class="n">{_num(g.total_lag)}</td><td class="n">{_num(time_lag, "{:,.0f} s")}</td>'
        f"<td>{escape(worst)}<span class=c>{escape(owner)}</span></td></tr>"
    )


def avoidance_panel(state: ServeState) -> str:
    rows = []
    for c in state.clusters.values():
        doc = c.avoidance
        if doc is None:
            continue
        now_avoided = avoided_brokers(doc, state.now_ms)
        listed = ", ".join(escape(b) for b in now_avoided) or "none"
        expired = int(doc["expires_ms"]) <= state.now_ms
        rows.append(
            f"<tr><td>{escape(c.name)}</td><td>{listed}</td><td>{escape(str(doc.get('cycle_id', '')))}</td>"
            f"<td>{_clock(int(doc['decided_ms']))}</td>"
            f"<td>{_badge('expired', 'bad') if expired else _clock(int(doc['expires_ms']))}</td></tr>"
        )
    body = _table(["cluster", "avoid now", "cycle", "decided", "expires"], rows, set()) if rows else (
        f'<p class="empty">{escape(state.avoidance_error or "no avoidance list published yet")}</p>')
    body += "".join(f'<p class="empty">{escape(f"file {name} not used: {why}")}</p>'
                    for name, why in sorted(state.avoidance_bad.items()))
    return f'<section id="avoidance" class="wide"><h2>Avoidance lists</h2>{body}</section>'


def health_banner(status: int, reasons: list[str]) -> str:
    if status == 200:
        return '<div class="health ok" id="health">pipeline healthy: tables readable and fresh</div>'
    items = "; ".join(escape(r) for r in reasons)
    return f'<div class="health bad" id="health">pipeline unhealthy: {items}</div>'


def render_page(state: ServeState, health: tuple[int, list[str]], refresh_s: float, limit: int = 10) -> bytes:
    html = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{refresh_s:g}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1"><link rel="icon" href="data:,">'
        f"<title>faultwatch</title><style>{_CSS}</style></head><body>"
        f"<h1>faultwatch</h1><div class=meta>state at {_clock(state.now_ms, '%Y-%m-%d %H:%M:%S UTC')} · "
        f"times in UTC · reloads every {refresh_s:g} s</div>"
        f"{health_banner(*health)}"
        f'<div class="grid">{brokers_panel(state, limit)}{groups_panel(state, limit)}{avoidance_panel(state)}</div>'
        "</body></html>"
    )
    return html.encode()
