"""The live page (GET /) in headless Chromium: one screen, no external resources, the state's text.

Chromium loads the page from a real ``serve`` on loopback over real Delta tables with an open
episode, a stalled group and a published avoidance list; the test reads the rendered text, takes a
screenshot, and checks that the page reloads itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.serve import Server
from tests.integration.test_report_chromium import Chromium
from tests.unit.test_report import _write
from tests.unit.test_serve import CLUSTER, serve_config, wait_refreshed, write_outage_tables


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    chrome = Chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield chrome
    chrome.close()


def add_live_trouble(tmp_path: Path) -> None:
    """An episode open now on broker-b and a stalled group, on top of the outage tables."""
    now = int(time.time() * 1000)
    _write(tmp_path / "tables", "broker_fault_episodes_live", [{
        "episode_id": f"{CLUSTER}|broker-b|{now - 20_000}", "cluster": CLUSTER, "broker_name": "broker-b",
        "opened_ms": now - 20_000, "closed_ms": None, "state": "open", "reason": "quorum",
        "peak_avoiding_share": 0.6, "peak_avoiding_producers": 6, "active_producers": 10, "sends": 50,
        "failures": 30, "p99_latency_ms": 3.0, "revision": 0, "updated_ms": now - 20_000}])
    _write(tmp_path / "tables", "group_status", [{
        "cluster": CLUSTER, "consumer_group": "CG_reports", "ts_ms": now - 5_000, "status": "STALL",
        "total_lag": 48_000, "max_time_lag_ms": 420_000, "worst_topic": "TopicPay", "worst_broker": "broker-c",
        "worst_queue_id": 2, "worst_owner": "10.0.0.9@77", "queues": 16, "event_date": "2026-01-01"}])


@pytest.fixture
def page_url(tmp_path: Path) -> Iterator[str]:
    write_outage_tables(tmp_path)
    add_live_trouble(tmp_path)
    server = Server(serve_config(tmp_path, page_refresh_s=2.0))
    url = server.start()
    wait_refreshed(server)
    yield url
    server.stop()


def test_live_page_shows_brokers_groups_and_avoidance_on_one_screen(page_url: str, browser: Chromium,
                                                                     tmp_path: Path) -> None:
    browser.open(page_url)
    text: str = browser.evaluate("document.body.innerText")
    brokers = browser.evaluate("Array.from(document.querySelectorAll('#brokers tbody tr')).map(r => r.innerText)")
    groups = browser.evaluate("Array.from(document.querySelectorAll('#groups tbody tr')).map(r => r.innerText)")
    avoidance = browser.evaluate("document.querySelector('#avoidance').innerText")
    assert "pipeline healthy" in text
    first_broker = brokers[0]  # the open episode comes first
    assert "broker-b" in first_broker and "open" in first_broker and "(quorum)" in first_broker and "avoid" in first_broker
    first_group = groups[0]  # most severe first
    assert "CG_reports" in first_group and "STALL" in first_group and "48,000" in first_group and "420 s" in first_group
    assert len(brokers) == 4 and any("CG_pay" in g for g in groups[1:])
    assert CLUSTER in avoidance and "broker-b" in avoidance and "42" in avoidance
    # one screen (1280 x 1000), nothing fetched but the page itself, no console errors
    assert browser.evaluate("document.documentElement.scrollHeight") <= 1000
    assert browser.evaluate("document.documentElement.scrollWidth") <= 1280
    fetched = browser.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
    assert all(u.startswith(page_url) for u in fetched), fetched
    assert browser.errors() == []
    shot = browser.screenshot({"x": 0, "y": 0, "width": 1280, "height": 1000})[..., :3]
    png = tmp_path / "serve-page.png"
    import matplotlib.pyplot as plt

    plt.imsave(png, shot)
    ink = (shot.min(axis=2) < 0.9).mean()
    colours = len(np.unique((shot * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    assert png.stat().st_size > 10_000 and ink > 0.02 and colours > 20, (ink, colours)


def test_live_page_reloads_itself(page_url: str, browser: Chromium) -> None:
    browser.open(page_url)
    browser.evaluate("window.__marker = 'before'")
    opened = browser.loader_id

    def reloaded(event: dict[str, Any]) -> bool:
        frame = event.get("params", {}).get("frame", {})
        return event.get("method") == "Page.frameNavigated" and frame.get("loaderId") not in (None, opened)

    # every 2 s (page_refresh_s); a timeout lists the events, so a failure says how far it got
    asked = browser.wait_for(lambda e: e.get("method") == "Page.frameRequestedNavigation", 15, "a reload asked for")
    assert asked["params"]["reason"] == "metaTagRefresh" and asked["params"]["url"] == page_url
    assert browser.wait_for(reloaded, 15, "the reloaded page committing")["params"]["frame"]["url"] == page_url
    browser.wait_for(lambda e: e.get("method") == "Page.loadEventFired", 15, "the reloaded page loading")
    assert browser.evaluate("String(window.__marker)") == "undefined"  # a new document, not the old one
    assert "Consumer groups" in browser.evaluate("document.body.innerText")
