"""Delivery to Alertmanager's v2 API (``POST /api/v2/alerts``), as Prometheus does it.

Every cycle posts every firing alert (Alertmanager resolves an alert that is not re-sent within its
``resolve_timeout``) and every resolution not yet acknowledged, with ``endsAt`` set. Labels are the
alert's identity, so a resolution matches the alert it ends. Unreachable or refusing instances are
reported, never raised: the publisher goes on and the caller keeps the resolutions for next cycle.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from pipeline.publish.lifecycle import ALERT_NAMES, Alert

log = logging.getLogger(__name__)


def _iso(ms: int) -> str:
    stamp = dt.datetime.fromtimestamp(ms // 1000, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{ms % 1000:03d}Z"


def labels(alert: Alert) -> dict[str, str]:
    """The alert's Alertmanager identity: for brokers and groups exactly the label set of the shipped
    Prometheus rule of the same name (no label of our own), so both paths make one alert."""
    out = {"alertname": ALERT_NAMES[alert.kind], "cluster": alert.cluster, "severity": alert.severity,
           **{k: str(v) for k, v in alert.labels.items()}}
    return {k: v for k, v in out.items() if v}  # an empty label is no label


def payload(alert: Alert) -> dict[str, Any]:
    """One element of the v2 ``postableAlerts`` array."""
    out: dict[str, Any] = {
        "labels": labels(alert),
        "annotations": {
            "summary": alert.summary,
            "description": json.dumps(dict(alert.details), sort_keys=True, default=str),
            "alert_id": alert.alert_id,
            "source": "faultwatch publisher",
        },
        "startsAt": _iso(alert.starts_ms),
    }
    if alert.ends_ms is not None:
        out["endsAt"] = _iso(alert.ends_ms)
    return out


def _post(url: str, body: bytes, timeout_s: float) -> str | None:
    """None on success, else what went wrong (one line)."""
    request = urllib.request.Request(
        url.rstrip("/") + "/api/v2/alerts", data=body, method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()
        return None
    except urllib.error.HTTPError as exc:
        return f"{url}: HTTP {exc.code} {exc.read()[:200]!r}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{url}: {reason}"


def deliver(urls: Sequence[str], alerts: Sequence[Alert], timeout_s: float) -> list[str]:
    """Post ``alerts`` to every instance; returns the failures (empty: all acknowledged).

    The failures are logged here, once per call (one cycle), in one line.
    """
    if not urls or not alerts:
        return []
    body = json.dumps([payload(a) for a in alerts]).encode("utf-8")
    failures = [f for f in (_post(u, body, timeout_s) for u in urls) if f is not None]
    if failures:
        log.warning("Alertmanager: %d of %d instance(s) did not take %d alert(s); retried next cycle: %s",
                    len(failures), len(urls), len(alerts), "; ".join(failures))
    return failures
